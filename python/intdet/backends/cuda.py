"""The cuda backend: ``intdet._cuda`` (docs/cuda.md) under the backends API
(backends/__init__.py). ``cuda_module()`` finds the module (tests replace
it with the host emulator); ``load()`` wraps it: the Model keywords, the
CPU-only controls as the GPU's fixed answers (one kernel set "cuda", one
host thread) and the trace without a kernel-set argument."""

from __future__ import annotations

from ..errors import IntdetError

MISSING = "no CUDA GPU available"


def cuda_module():
    """intdet._cuda when it was built and a CUDA GPU is visible; else
    IntdetError (field "device") saying why."""
    try:
        from .. import _cuda
    except ImportError as e:
        raise IntdetError(f"device cuda: {MISSING} (intdet was built without its CUDA module: {e})",
                          field="device") from None
    if _cuda.device_count() < 1:
        raise IntdetError(f"device cuda: {MISSING} ({_reason(_cuda.no_device_reason())})", field="device")
    return _cuda


def _reason(why: str) -> str:
    """The runtime's reason, but without a driver at all it blames the
    driver's version ("CUDA driver version is insufficient ..."): say so."""
    import os

    if not os.path.exists("/dev/nvidiactl") and "driver version is insufficient" in why:
        return f"no NVIDIA driver found: /dev/nvidiactl is missing; the CUDA runtime says: {why}"
    return why or "no device"


def available() -> str | None:
    """None when cuda_module() finds a GPU, else why not (the text inside its error's parentheses)."""
    try:
        cuda_module()
    except IntdetError as e:
        msg = str(e)
        head = f"device cuda: {MISSING} ("
        return msg[len(head):-1] if msg.startswith(head) and msg.endswith(")") else msg
    return None


class CudaBackend:
    """The backends API over a module with intdet._cuda's functions."""

    def __init__(self, mod):
        self.mod = mod

    def __getattr__(self, name):  # State, forward, forward_batch, submit_pick, wait_pick: the module's own
        return getattr(self.mod, name)

    def Model(self, cfg: dict, tensors: dict, *, mapped: bool = False, config_path: str = "config.json",
              tensors_path: str = "model.safetensors", cuda_graphs: bool | None = None):
        """The model uploaded to the GPU; cuda_graphs None: INTDET_CUDA_GRAPHS decides.
        ValueError naming the file; RuntimeError for a device failure."""
        return self.mod.Model(cfg, tensors, cuda_graphs, config_path, tensors_path)

    def forward_trace(self, model, state, tokens, start: int, isa: str | None = None):
        """The GPU has one kernel set: ``isa`` is not used."""
        return self.mod.forward_trace(model, state, tokens, start)

    def device_name(self) -> str:
        return str(self.mod.device_name())

    def kernels_ready(self) -> None:
        pass

    def isa(self) -> str:
        return "cuda"

    def available_isas(self) -> list:
        return ["cuda"]

    def set_isa(self, name: str) -> None:
        raise ValueError("set_isa: the cuda backend has one kernel set")

    def set_num_threads(self, n: int) -> None:
        pass  # the GPU decides

    def num_threads(self) -> int:
        return 1

    def thread_setting(self) -> int:
        return 0

    def last_forward_threads(self) -> int:
        return 1


def load() -> CudaBackend:
    return CudaBackend(cuda_module())
