"""The WebGPU backend: the integer forward as WGSL compute shaders run
through the ``wgpu`` package (``pip install "intdet[webgpu]"``).

``device`` opens the adapter, ``kernels`` holds the shaders (``wgsl/``),
``backend`` is the engine with intdet._core's API."""
