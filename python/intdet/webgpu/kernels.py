"""The forward's compute pipelines (``wgsl/<kernel>.wgsl`` after the i64
library and ``common.wgsl``) and the recorder that puts one forward step's
dispatches into one command encoder.

Every kernel's binding 0 is a 64-byte uniform slot of 16 int32 parameters,
bound at a dynamic offset into one buffer written once per step; bindings
1.. are storage buffers. Buffers hold 4-byte words: int32 values, int8
weights and int16 activations packed four bytes to a word, int64 values
as (lo, hi) u32 pairs.
"""

from __future__ import annotations

import numpy as np

from .device import WGSL_DIR, gpu, has_dot4, library

SLOT = 256  # bytes between parameter slots (WebGPU's default minUniformBufferOffsetAlignment)
NPARAM = 16
GRID_X = 16384  # common.wgsl GRID_X
WG = 64

# kernel -> (wgsl file, storage bindings, source substitutions[, entry point])
KERNELS = {
    "embed": ("embed", 4, {}),
    "rms_norm": ("rms_norm", 3, {}),
    "rms_norm_quant16": ("rms_norm", 5, {}, "norm_quant16"),
    "quant16_i32": ("quant16", 3, {"XTYPE": "i32", "LOAD(": "i64_from_i32("}),
    "quant16_i64": ("quant16", 3, {"XTYPE": "I64P", "LOAD(": "("}),
    "linear8": ("linear8", 6, {}),
    "linear8_segments": ("linear8", 8, {}, "segments"),
    "linear8_coop": ("linear8", 6, {}, "coop"),
    "linear8_segments_coop": ("linear8", 8, {}, "segments_coop"),
    "linear4": ("linear4", 7, {}),
    "rope": ("rope", 4, {}),
    "kv_store": ("kv_store", 4, {}),
    "attention": ("attention", 6, {}),
    "glu": ("glu", 3, {}),
    "softcap": ("softcap", 1, {}),
    "argmax": ("argmax", 2, {}),
    "moe_route": ("moe", 4, {}, "route"),
    "moe_accumulate": ("moe", 4, {}, "accumulate"),
    "moe_finish": ("moe", 4, {}, "finish"),
}


def source(name: str) -> str:
    file, _, subs = KERNELS[name][:3]
    text = (WGSL_DIR / f"{file}.wgsl").read_text()
    for k, v in subs.items():
        text = text.replace(k, v)
    return (WGSL_DIR / "common.wgsl").read_text() + "\n" + text


def groups_rows(rows: int) -> tuple[int, int, int]:
    """Workgroups for one per row (common.wgsl folds x past GRID_X into y)."""
    return (min(max(rows, 1), GRID_X), -(-max(rows, 1) // GRID_X), 1)


def groups_flat(count: int) -> tuple[int, int, int]:
    """Workgroups for one invocation per element (index gid.x + gid.y * GRID_X * 64)."""
    g = -(-max(count, 1) // WG)
    return (min(g, GRID_X), -(-g // GRID_X), 1)


TPC = 16  # linear8.wgsl TPC: invocations per (channel, row) of the coop linears


def coop_default(adapter) -> bool:
    """Whether the int8 linears split each channel's row over TPC invocations
    (linear8.wgsl ``coop``): on GPUs, not on CPU adapters (lavapipe runs
    barriers slowly); INTDET_WEBGPU_LINEAR=coop or =channel chooses."""
    import os

    choice = os.environ.get("INTDET_WEBGPU_LINEAR", "")
    if choice in ("coop", "channel"):
        return choice == "coop"
    return str(adapter.info.get("adapter_type", "")).upper() != "CPU"


def groups_coop(N: int, rows: int) -> tuple[int, int, int]:
    """Workgroups of the coop linears: blocks of WG / TPC channels (folded past GRID_X into y), rows on z."""
    g = -(-max(N, 1) // (WG // TPC))
    return (min(g, GRID_X), -(-g // GRID_X), max(rows, 1))


class Kernels:
    """The compiled pipelines of one device, dot4_i8 as the builtin or
    shifts; ``coop``: the int8 linears' coop entries (None: coop_default)."""

    def __init__(self, dot4: bool | None = None, coop: bool | None = None):
        import wgpu

        self.wgpu = wgpu
        adapter, self.device = gpu()
        self.dot4 = has_dot4() if dot4 is None else dot4
        self.coop = coop_default(adapter) if coop is None else coop
        self._pipes: dict = {}

    def pipeline(self, name: str):
        """(pipeline, bind group layout) of kernel ``name``, compiled on first use."""
        if name not in self._pipes:
            wgpu = self.wgpu
            nbuf = KERNELS[name][1]
            entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True,
                                   "min_binding_size": NPARAM * 4}}]
            entries += [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                         "buffer": {"type": wgpu.BufferBindingType.storage}} for i in range(1, nbuf + 1)]
            bgl = self.device.create_bind_group_layout(entries=entries)
            layout = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
            mod = self.device.create_shader_module(code=library(self.dot4) + "\n" + source(name), label=name)
            entry = KERNELS[name][3] if len(KERNELS[name]) > 3 else "main"
            pipe = self.device.create_compute_pipeline(layout=layout, compute={"module": mod, "entry_point": entry})
            self._pipes[name] = (pipe, bgl)
        return self._pipes[name]


SUBMIT_EVERY = 128  # dispatches per command buffer: the GPU starts on the first ones while the rest are encoded


class Recorder:
    """Collects a step's dispatches, then encodes them with one parameter
    upload into command buffers of SUBMIT_EVERY dispatches each (queue
    order keeps them in sequence; the GPU runs the first while the host
    encodes the next), copies the requested buffers to a mappable buffer
    and reads them back after one wait."""

    def __init__(self, kernels: Kernels, pool: "BufferPool"):
        self.k = kernels
        self.pool = pool
        self.params: list = []
        self.cmds: list = []

    def dispatch(self, name: str, buffers: list, params, groups) -> None:
        """Kernel ``name`` on storage ``buffers`` (bindings 1..) with at most
        NPARAM int32 ``params`` (binding 0); ValueError (at ``run``) for a
        parameter outside int32."""
        if len(params) > NPARAM:
            raise ValueError(f"{name}: {len(params)} parameters, over the slot's {NPARAM}")
        self.cmds.append((name, tuple(buffers), len(self.params), groups))
        self.params.append(list(params) + [0] * (NPARAM - len(params)))

    def copy(self, src, src_off: int, dst, dst_off: int, size: int) -> None:
        self.cmds.append(("copy", src, src_off, dst, dst_off, size))

    def _upload_params(self):
        ub = self.pool.params(max(len(self.params), 1) * SLOT)
        if self.params:
            p = np.array(self.params, np.int64)
            if p.min() < -2**31 or p.max() >= 2**31:
                i = int(np.argmax((p < -2**31) | (p >= 2**31)) // NPARAM)
                name = [c for c in self.cmds if c[0] != "copy"][i][0]
                self.params, self.cmds = [], []
                raise ValueError(f"{name}: parameters {p[i].tolist()} do not fit int32")
            data = np.zeros((len(self.params), SLOT // 4), np.int32)
            data[:, :NPARAM] = p
            self.k.device.queue.write_buffer(ub, 0, data)
        return ub

    def run(self, read=None):
        """Submit everything; ``read`` = (buffer, nbytes) to read back: returns its bytes."""
        from wgpu.backends.wgpu_native import ffi, lib

        dev = self.k.device
        wgpu = self.k.wgpu
        ub = self._upload_params()
        # The two calls made per dispatch go to wgpu-native directly: the
        # wrapper's per-call error capture costs more than the call (the
        # commands are validated again when the encoder finishes).
        set_pipe, set_bg = lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup
        disp = lib.wgpuComputePassEncoderDispatchWorkgroups
        off = ffi.new("uint32_t[1]")
        enc = dev.create_command_encoder()
        cp = last = None
        n = 0
        pipes = {}
        for c in self.cmds:
            if c[0] == "copy":
                if cp is not None:
                    cp.end()
                    cp = last = None
                enc.copy_buffer_to_buffer(*c[1:])
                continue
            name, bufs, slot, groups = c
            if n == SUBMIT_EVERY:
                if cp is not None:
                    cp.end()
                dev.queue.submit([enc.finish()])
                enc = dev.create_command_encoder()
                cp = last = None
                n = 0
            if cp is None:
                cp = enc.begin_compute_pass()
            if name not in pipes:
                pipes[name] = self.k.pipeline(name)
            pipe, bgl = pipes[name]
            h = cp._internal
            if name != last:
                set_pipe(h, pipe._internal)
                last = name
            off[0] = slot * SLOT
            set_bg(h, 0, self.pool.bind_group(name, bgl, ub, bufs)._internal, 1, off)
            disp(h, *groups)
            n += 1
        if cp is not None:
            cp.end()
        staging = None
        if read is not None:
            buf, nbytes = read
            staging = self.pool.staging(nbytes)
            enc.copy_buffer_to_buffer(buf, 0, staging, 0, nbytes)
        dev.queue.submit([enc.finish()])
        self.params, self.cmds = [], []
        if staging is None:
            return None
        staging.map_sync(wgpu.MapMode.READ, 0, read[1])
        try:
            return bytes(staging.read_mapped(0, read[1]))
        finally:
            staging.unmap()


class BufferPool:
    """Device buffers of one model: named scratch buffers grown on demand,
    the parameter and staging buffers, and the bind groups made from them
    (cached; a grown buffer drops the cache)."""

    def __init__(self, kernels: Kernels):
        self.k = kernels
        self.dev = kernels.device
        self._named: dict = {}
        self._groups: dict = {}
        self._params = None
        self._staging = None

    def storage(self, data: np.ndarray, label: str = ""):
        """A new storage buffer holding ``data`` (4-byte elements)."""
        wgpu = self.k.wgpu
        b = np.ascontiguousarray(data)
        raw = b.tobytes() if b.nbytes else b"\0" * 4
        raw += b"\0" * (-len(raw) % 4)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.dev.create_buffer_with_data(data=raw, usage=usage, label=label)

    def zeros(self, nbytes: int, label: str = ""):
        wgpu = self.k.wgpu
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.dev.create_buffer(size=max(16, -(-nbytes // 16) * 16), usage=usage, label=label)

    def scratch(self, name: str, nbytes: int):
        """Named scratch buffer of at least ``nbytes`` (grown by doubling)."""
        b = self._named.get(name)
        if b is None or b.size < nbytes:
            size = max(nbytes, 2 * b.size if b is not None else 0, 256)
            self._named[name] = self.zeros(size, name)
            self._groups.clear()
        return self._named[name]

    def params(self, nbytes: int):
        if self._params is None or self._params.size < nbytes:
            wgpu = self.k.wgpu
            size = max(nbytes, 2 * self._params.size if self._params is not None else 0, 64 * SLOT)
            self._params = self.dev.create_buffer(size=size, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            self._groups.clear()
        return self._params

    def staging(self, nbytes: int):
        if self._staging is None or self._staging.size < nbytes:
            wgpu = self.k.wgpu
            size = max(-(-nbytes // 16) * 16, 2 * self._staging.size if self._staging is not None else 0)
            self._staging = self.dev.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        return self._staging

    def bind_group(self, name, bgl, ub, bufs: tuple):
        """The bind group of kernel ``name``: the parameter buffer ``ub`` and
        the storage buffers ``bufs``, made once (GPU objects hash by identity,
        and the cache holds them, so a key is never reused by another)."""
        key = (name, ub, bufs)
        hit = self._groups.get(key)
        if hit is None:
            entries = [{"binding": 0, "resource": {"buffer": ub, "offset": 0, "size": NPARAM * 4}}]
            entries += [{"binding": i + 1, "resource": {"buffer": b}} for i, b in enumerate(bufs)]
            hit = self._groups[key] = self.dev.create_bind_group(layout=bgl, entries=entries)
        return hit

    def forget(self, buffers) -> None:
        """Drop cached bind groups that use any of ``buffers`` (a State going away)."""
        ids = {id(b) for b in buffers}
        self._groups = {k: v for k, v in self._groups.items() if not ids.intersection(map(id, k[2]))}


def run_one(kernels: Kernels, name: str, arrays: list, params, groups) -> list:
    """Test helper: kernel ``name`` on numpy arrays (4-byte elements, bound
    in order); returns them read back."""
    pool = BufferPool(kernels)
    bufs = [pool.storage(a) for a in arrays]
    rec = Recorder(kernels, pool)
    rec.dispatch(name, bufs, params, groups)
    rec.run()
    q = kernels.device.queue
    return [np.frombuffer(q.read_buffer(b), a.dtype)[:a.size].reshape(a.shape).copy() for a, b in zip(arrays, bufs)]
