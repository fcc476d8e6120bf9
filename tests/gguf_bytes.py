"""Byte-level GGUF parsing and writing for crafting broken files in tests.

Independent of intdet's own checker (python/intdet/convert/gguf_check.py):
``parse`` splits a valid file into its header pieces, ``build`` writes them
back byte for byte, so a test can change any one field (a count, a length, a
dimension, an offset, the alignment) and keep the rest of the file valid.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# GGUF value type id -> fixed size (8 = string, 9 = array)
VSIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
T_UINT32, T_STRING, T_ARRAY, T_UINT64 = 4, 8, 9, 10


@dataclass
class KV:
    key: bytes
    vtype: int
    raw: bytes  # the value's bytes (after the uint32 type field)


@dataclass
class TensorInfo:
    name: bytes
    dims: list
    ttype: int
    offset: int


@dataclass
class GGUF:
    version: int
    kvs: list
    tensors: list
    data: bytes  # the data section (from data_start to the end of the file)
    alignment: int = 32
    boundaries: list = field(default_factory=list)  # byte offsets where a header field ends

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key.encode())

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name.encode())

    def nbytes(self, t: TensorInfo) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ttype)]
        n = 1
        for d in t.dims:
            n *= d
        return n // block * size

    def blob(self, t: TensorInfo) -> bytes:
        return self.data[t.offset:t.offset + self.nbytes(t)]


def u32(v: int) -> tuple:
    return T_UINT32, struct.pack("<I", v)


def u64(v: int) -> tuple:
    return T_UINT64, struct.pack("<Q", v)


def string(s) -> tuple:
    b = s.encode() if isinstance(s, str) else s
    return T_STRING, struct.pack("<Q", len(b)) + b


def _value_end(b: bytes, vtype: int, pos: int) -> int:
    if vtype == T_STRING:
        (n,) = struct.unpack_from("<Q", b, pos)
        return pos + 8 + n
    if vtype == T_ARRAY:
        et, n = struct.unpack_from("<IQ", b, pos)
        pos += 12
        if et in VSIZE:
            return pos + n * VSIZE[et]
        for _ in range(n):
            pos = _value_end(b, et, pos)
        return pos
    return pos + VSIZE[vtype]


def parse(b: bytes) -> GGUF:
    assert b[:4] == b"GGUF"
    (version,) = struct.unpack_from("<I", b, 4)
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    pos, bounds, kvs, tensors, alignment = 24, [4, 8, 16, 24], [], [], 32
    for _ in range(n_kv):
        (kl,) = struct.unpack_from("<Q", b, pos)
        key = b[pos + 8:pos + 8 + kl]
        (vt,) = struct.unpack_from("<I", b, pos + 8 + kl)
        vstart = pos + 12 + kl
        end = _value_end(b, vt, vstart)
        bounds += [pos + 8, pos + 8 + kl, vstart]
        if vt == T_ARRAY:
            bounds += [vstart + 4, vstart + 12]
        bounds.append(end)
        kvs.append(KV(key, vt, b[vstart:end]))
        if key == b"general.alignment":
            (alignment,) = struct.unpack_from("<I", b, vstart)
            if not (0 < alignment <= 1 << 16 and alignment & (alignment - 1) == 0):
                raise ValueError(f"alignment {alignment}")  # (the fuzzers' mutator must not pad by 2^31)
        pos = end
    for _ in range(n_t):
        (nl,) = struct.unpack_from("<Q", b, pos)
        name = b[pos + 8:pos + 8 + nl]
        p = pos + 8 + nl
        (nd,) = struct.unpack_from("<I", b, p)
        dims = list(struct.unpack_from(f"<{nd}Q", b, p + 4))
        p += 4 + 8 * nd
        tt, off = struct.unpack_from("<IQ", b, p)
        bounds += [pos + 8, pos + 8 + nl, pos + 12 + nl, p, p + 4, p + 12]
        tensors.append(TensorInfo(name, dims, tt, off))
        pos = p + 12
    data_start = -(-pos // alignment) * alignment
    g = GGUF(version, kvs, tensors, b[data_start:], alignment)
    g.boundaries = sorted(set(bounds + [data_start] + [data_start + t.offset for t in tensors]))
    return g


def build(g: GGUF, tensor_count=None, kv_count=None, pad_to=None) -> bytes:
    """Bytes of ``g``; the counts and the padding can be overridden (the
    padding follows g.alignment unless pad_to is given)."""
    out = [b"GGUF", struct.pack("<I", g.version),
           struct.pack("<QQ", len(g.tensors) if tensor_count is None else tensor_count,
                       len(g.kvs) if kv_count is None else kv_count)]
    for kv in g.kvs:
        out += [struct.pack("<Q", len(kv.key)), kv.key, struct.pack("<I", kv.vtype), kv.raw]
    for t in g.tensors:
        out += [struct.pack("<Q", len(t.name)), t.name, struct.pack("<I", len(t.dims)),
                struct.pack(f"<{len(t.dims)}Q", *t.dims), struct.pack("<IQ", t.ttype, t.offset)]
    head = b"".join(out)
    a = pad_to or g.alignment
    if not 0 < a <= 1 << 16:
        raise ValueError(f"padding to {a}")
    return head + b"\0" * (-len(head) % a) + g.data


def set_kv(g: GGUF, key: str, value: tuple):
    """Replace (or append) metadata ``key`` with value (vtype, raw bytes)."""
    vt, raw = value
    for kv in g.kvs:
        if kv.key == key.encode():
            kv.vtype, kv.raw = vt, raw
            return
    g.kvs.append(KV(key.encode(), vt, raw))


def relayout(g: GGUF, alignment: int):
    """Re-pack the tensor data with every offset a multiple of ``alignment``
    and record general.alignment (keeps the file valid)."""
    blobs = [g.blob(t) for t in g.tensors]
    data = b""
    for t, blob in zip(g.tensors, blobs):
        data += b"\0" * (-len(data) % alignment)
        t.offset = len(data)
        data += blob
    g.data, g.alignment = data, alignment
    set_kv(g, "general.alignment", u32(alignment))
