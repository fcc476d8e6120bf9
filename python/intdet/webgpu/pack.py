"""Host-side layouts of the WebGPU kernels' buffers (4-byte words)."""

from __future__ import annotations

import numpy as np


def words(n: int) -> int:
    """Words of a row of n bytes."""
    return -(-n // 4)


def pack_i8_rows(a) -> np.ndarray:
    """int8 [..., n] -> uint32 [..., ceil(n/4)], byte k of word w = element 4w + k (zero padded)."""
    a = np.asarray(a, dtype=np.int8)
    n = a.shape[-1]
    pad = np.zeros(a.shape[:-1] + (4 * words(n),), np.int8)
    pad[..., :n] = a
    return np.ascontiguousarray(pad).view(np.uint32)


def unpack_i8_rows(w, n: int) -> np.ndarray:
    """pack_i8_rows' inverse: int64 [..., n]."""
    return np.ascontiguousarray(w, dtype=np.uint32).view(np.int8)[..., :n].astype(np.int64)


def pack_i16_act(q) -> np.ndarray:
    """int16 activations [rows, n] -> the quant16 kernel's words [rows, 2 Kw]:
    high bytes floor(q / 256), then low bytes (q mod 256) - 128."""
    q = np.asarray(q, dtype=np.int64)
    hi = (q >> 8).astype(np.int8)
    lo = ((q & 255) - 128).astype(np.int8)
    n = q.shape[-1]
    kw = words(n)
    lo_p = np.full(q.shape[:-1] + (4 * kw,), -128, np.int8)  # padding: q = 0
    lo_p[..., :n] = lo
    return np.concatenate([pack_i8_rows(hi), np.ascontiguousarray(lo_p).view(np.uint32)], axis=-1)


def unpack_i16_act(w, n: int) -> np.ndarray:
    """pack_i16_act's inverse: int64 [rows, n]."""
    w = np.asarray(w, dtype=np.uint32)
    kw = w.shape[-1] // 2
    hi = unpack_i8_rows(w[..., :kw], n)
    lo = unpack_i8_rows(w[..., kw:], n)
    return 256 * hi + lo + 128


def pack_int4(w4) -> np.ndarray:
    """The converter's int4 codes (uint8 [N, K/2], input 2i in the low nibble
    of byte i) -> uint32 [N, K/8], each word 8 inputs: inputs 0..3 in the low
    nibbles of its bytes 0..3, inputs 4..7 in the high nibbles (linear4.wgsl)."""
    w4 = np.asarray(w4, dtype=np.uint8)
    N = w4.shape[0]
    u = np.empty((N, 2 * w4.shape[1]), np.uint8)
    u[:, 0::2] = w4 & 15
    u[:, 1::2] = w4 >> 4
    u = u.reshape(N, -1, 2, 4)  # [N, words, half, byte]
    b = u[:, :, 0, :] | (u[:, :, 1, :] << 4)
    return np.ascontiguousarray(b).view(np.uint32).reshape(N, -1)


def i64_pairs(a) -> np.ndarray:
    """int64 [...] -> uint32 [..., 2] (lo, hi)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.int64)).view(np.uint32).reshape(np.shape(a) + (2,))


def from_pairs(p) -> np.ndarray:
    """uint32 [..., 2] -> int64 [...]."""
    p = np.ascontiguousarray(p, dtype=np.uint32)
    return p.view(np.int64).reshape(p.shape[:-1])
