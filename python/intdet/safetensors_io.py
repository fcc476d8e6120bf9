"""Checked, memory-mapped safetensors reading.

The ``safetensors`` package cannot give numpy arrays for BF16 and trusts the
header's offsets; model files come from strangers, so every size, offset and
dtype from the header is checked against the file before any array is made.
Writing uses the ``safetensors`` package (its byte layout is deterministic).
"""

from __future__ import annotations

import json
import mmap
import os
import struct

import numpy as np

from .errors import IntdetError

# dtype name -> (numpy dtype, itemsize). BF16 is read as uint16 and widened.
DTYPES = {
    "F64": (np.float64, 8),
    "F32": (np.float32, 4),
    "F16": (np.float16, 2),
    "BF16": (np.uint16, 2),
    "I64": (np.int64, 8),
    "I32": (np.int32, 4),
    "I16": (np.int16, 2),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "BOOL": (np.bool_, 1),
}
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile:
    """A safetensors file opened read-only through mmap.

    ``names()`` lists tensors; ``get(name)`` returns a read-only numpy view
    (BF16 comes back as float32, the only copy made). Raises IntdetError with
    the path and the problem for a truncated file, a header larger than the
    file, a bad JSON header, an unknown dtype, a shape whose byte size
    disagrees with its offsets, offsets past the data or overlapping tensors.
    """

    def __init__(self, path: str):
        self.path = str(path)
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise IntdetError(f"{self.path}: cannot open: {e.strerror}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise IntdetError(f"{self.path}: truncated safetensors file ({size} bytes)")
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > size - 8 or hlen > MAX_HEADER:
                raise IntdetError(f"{self.path}: safetensors header length {hlen} exceeds the file size {size}")
            try:
                header = json.loads(f.read(hlen))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise IntdetError(f"{self.path}: safetensors header is not valid JSON ({e})") from None
            except RecursionError:  # "[[[[..." nested deeper than the interpreter's stack
                raise IntdetError(f"{self.path}: safetensors header JSON is nested too deeply") from None
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else None
        if not isinstance(header, dict):
            raise IntdetError(f"{self.path}: safetensors header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        if not isinstance(self.metadata, dict):
            raise IntdetError(f"{self.path}: safetensors __metadata__ is not a JSON object")
        self._base = 8 + hlen
        data_len = size - self._base
        self._entries = {}
        spans = []
        for name, ent in header.items():
            try:
                dt, shape, (b, e) = ent["dtype"], ent["shape"], ent["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise IntdetError(f"{self.path}: tensor '{name}' has a malformed header entry") from None
            if not isinstance(dt, str) or dt not in DTYPES:  # (a list or dict is unhashable)
                raise IntdetError(f"{self.path}: tensor '{name}' has unsupported dtype {dt!r:.60}")
            if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**40 for d in shape)):
                raise IntdetError(f"{self.path}: tensor '{name}' has an invalid shape {shape!r:.80}")
            if not (type(b) is int and type(e) is int and 0 <= b <= e <= data_len):
                raise IntdetError(f"{self.path}: tensor '{name}' offsets [{b}, {e}] lie outside the {data_len}-byte data section")
            nbytes = DTYPES[dt][1]
            for d in shape:
                nbytes *= d
            if nbytes != e - b:
                raise IntdetError(f"{self.path}: tensor '{name}' is {e - b} bytes but dtype {dt} x shape {shape} needs {nbytes}")
            self._entries[name] = (dt, tuple(shape), b, e)
            if e > b:
                spans.append((b, e, name))
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise IntdetError(f"{self.path}: tensors '{n0}' and '{n1}' overlap")

    def names(self):
        return list(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def info(self, name):
        """(dtype name, shape) of a tensor."""
        dt, shape, _, _ = self._entries[name]
        return dt, shape

    def get(self, name) -> np.ndarray:
        dt, shape, b, e = self._entries[name]
        npdt = np.dtype(DTYPES[dt][0]).newbyteorder("<")
        count = (e - b) // npdt.itemsize
        if count == 0:
            arr = np.zeros(shape, dtype=npdt)
        else:
            arr = np.frombuffer(self._mm, dtype=npdt, count=count, offset=self._base + b).reshape(shape)
        if dt == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr

    def rows(self, name, lo: int, hi: int) -> np.ndarray:
        """float32 rows lo..hi of the tensor's 2-D view (all axes but the
        last flattened), converting only those rows (F16, BF16, F64 and
        integer dtypes widened or narrowed to float32)."""
        dt, shape, b, _ = self._entries[name]
        K = shape[-1] if shape else 1
        npdt = np.dtype(DTYPES[dt][0]).newbyteorder("<")
        n = (hi - lo) * K
        if n == 0:
            return np.zeros((hi - lo, K), np.float32)
        arr = np.frombuffer(self._mm, dtype=npdt, count=n, offset=self._base + b + lo * K * npdt.itemsize)
        if dt == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32).reshape(hi - lo, K)
        return arr.astype(np.float32).reshape(hi - lo, K)

    def release(self, name):
        """Drop this tensor's pages from the process (madvise MADV_DONTNEED on
        the whole pages inside its byte range), e.g. once the C++ core holds a
        repacked copy. The mapping is read-only and file-backed, so a later
        read faults the bytes back in from the file: views stay valid."""
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        _, _, b, e = self._entries[name]
        page = mmap.PAGESIZE
        lo = -(-(self._base + b) // page) * page
        hi = (self._base + e) // page * page
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def save_atomic(tensors: dict, path: str, metadata: dict | None = None):
    """Write tensors (name -> numpy array, little-endian) to ``path`` with the
    safetensors package, through a temporary file renamed into place."""
    from safetensors.numpy import save_file

    tmp = f"{path}.tmp{os.getpid()}"
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
