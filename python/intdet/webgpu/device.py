"""The wgpu adapter and device, shared by every model of the process, and
the shader builder that prepends the WGSL libraries (``wgsl/*.wgsl``)."""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

WGSL_DIR = Path(__file__).with_name("wgsl")
DOT4_FEATURE = "packed_4x8_integer_dot_product"  # WGSL language extension of dot4I8Packed


class NoAdapter(RuntimeError):
    """No WebGPU adapter could be opened (the message says why)."""


def _quiet_runtime_dir() -> None:
    # The Vulkan loader warns on every adapter request when XDG_RUNTIME_DIR is unset
    # (containers); a private empty directory silences it without changing the adapter.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        d = Path(tempfile.gettempdir()) / f"intdet-xdg-{os.getuid()}"
        d.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(d)


@lru_cache(maxsize=1)
def gpu():
    """(adapter, device) of the process, opened once; NoAdapter when the wgpu
    package is missing or no adapter exists."""
    try:
        import wgpu
    except ImportError as e:
        raise NoAdapter(f"the wgpu package is not installed (pip install \"intdet[webgpu]\"): {e}") from None
    _quiet_runtime_dir()
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu raises its own error types for a missing driver
        raise NoAdapter(_one_line(e)) from None
    if adapter is None:
        raise NoAdapter("no WebGPU adapter (no Vulkan, Metal or D3D12 driver found)")
    lim = adapter.limits
    want = {k: lim[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                "max-storage-buffers-per-shader-stage", "max-compute-workgroup-storage-size")}
    device = adapter.request_device_sync(required_limits=want)
    return adapter, device


def _one_line(e: Exception) -> str:
    """wgpu's multi-line error text ("Validation Error\n\nCaused by: ...") as
    one line, without its generic heading."""
    text = " ".join(str(e).split())
    for head in ("Request adapter failed (3): ", "Validation Error Caused by: "):
        text = text.replace(head, "")
    return text or type(e).__name__


def available() -> tuple[bool, str]:
    """(True, adapter description) when a WebGPU adapter opens, else (False, why)."""
    try:
        adapter, _ = gpu()
    except NoAdapter as e:
        return False, str(e)
    return True, adapter_name(adapter)


def adapter_name(adapter) -> str:
    i = adapter.info
    return f"{i.get('device') or i.get('vendor')} ({i.get('backend_type')}, {i.get('adapter_type')})"


@lru_cache(maxsize=1)
def has_dot4() -> bool:
    """Whether WGSL's dot4I8Packed compiles and gives the right value here
    (wgpu-native does not list its language extensions, so it is tried)."""
    _, dev = gpu()
    import wgpu

    try:
        out = run_kernel(_dot4_probe(), [np.zeros(4, np.int32)], (1, 1, 1), dot4=None)[0]
    except wgpu.GPUError:
        return False
    del dev
    return list(out[:2]) == [8, -1]


def _dot4_probe() -> str:
    return """
@group(0) @binding(0) var<storage, read_write> o: array<i32>;
@compute @workgroup_size(1) fn main() {
    o[0] = dot4I8Packed(0x01020304u, 0xff010101u);
    o[1] = dot4I8Packed(0x000000ffu, 0x00000001u);
}"""


def library(dot4: bool | None) -> str:
    """The WGSL libraries; ``dot4`` picks dot4_i8's body: the builtin
    dot4I8Packed (True) or shifts with the same bits (False); None: none."""
    text = (WGSL_DIR / "i64.wgsl").read_text()
    if dot4 is None:
        return text
    body = "return dot4I8Packed(a, b);" if dot4 else (
        "return ((bitcast<i32>(a << 24u) >> 24u) * (bitcast<i32>(b << 24u) >> 24u)"
        " + (bitcast<i32>(a << 16u) >> 24u) * (bitcast<i32>(b << 16u) >> 24u)"
        " + (bitcast<i32>(a << 8u) >> 24u) * (bitcast<i32>(b << 8u) >> 24u)"
        " + (bitcast<i32>(a) >> 24u) * (bitcast<i32>(b) >> 24u));")
    return text + (f"\n// Signed dot product of the 4 bytes of a and b.\nfn dot4_i8(a: u32, b: u32) -> i32 {{ {body} }}\n")


_modules: dict = {}
_pipelines: dict = {}


def shader(source: str, dot4: bool | None = False):
    """The compiled module of ``library(dot4) + source`` (cached)."""
    key = (source, dot4)
    if key not in _modules:
        _, dev = gpu()
        _modules[key] = dev.create_shader_module(code=library(dot4) + "\n" + source)
    return _modules[key]


def run_kernel(source: str, arrays: list, groups, dot4: bool | None = False, entry: str = "main") -> list:
    """Test helper: run one compute shader whose bindings 0..n-1 are
    ``arrays`` (numpy, 4-byte elements) as read_write storage buffers;
    returns them read back with their dtypes and shapes."""
    import wgpu

    _, dev = gpu()
    mod = shader(source, dot4)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    bufs = [dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes() or b"\0" * 4, usage=usage)
            for a in arrays]
    if (mod, entry) not in _pipelines:  # compiling is the slow part (seconds on lavapipe)
        _pipelines[mod, entry] = dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": entry})
    pipe = _pipelines[mod, entry]
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                               entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(*groups)
    cp.end()
    dev.queue.submit([enc.finish()])
    return [np.frombuffer(dev.queue.read_buffer(b), a.dtype)[:a.size].reshape(a.shape).copy()
            for a, b in zip(arrays, bufs)]
