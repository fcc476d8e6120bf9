"""A safetensors file written tensor by tensor, block by block.

The converter knows every output tensor's name, dtype and shape before it
quantizes any (quantize.plan_model), so the header and each tensor's offset
are fixed first and the data is written at its offset as it is produced:
no tensor has to sit in memory whole. The layout is the ``safetensors``
package's own (tensors ordered by dtype, largest first, then by name;
compact JSON header with ``__metadata__`` first, padded with spaces to a
multiple of 8), so the file is byte-for-byte what ``save_file`` writes for
the same tensors (tests/convert/test_convert_stream.py checks it).
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import IntdetError

# safetensors' Dtype enum order (its sort key) and names, for the dtypes written here
_RANK = {"BOOL": 0, "U8": 1, "I8": 2, "I16": 3, "U16": 4, "F16": 5, "BF16": 6, "I32": 7, "U32": 8, "F32": 9,
         "F64": 10, "I64": 11, "U64": 12}
_NAME = {np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16",
         np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.float32): "F32",
         np.dtype(np.float64): "F64", np.dtype(np.bool_): "BOOL"}


def layout(specs: dict, metadata: dict | None = None):
    """specs: name -> (numpy dtype, shape). Returns (header bytes including
    the 8-byte length, {name: (dtype, shape, byte offset in the file)},
    total file size)."""
    entries = []
    for name, (dt, shape) in specs.items():
        dt = np.dtype(dt)
        if dt not in _NAME:
            raise IntdetError(f"internal: no safetensors dtype for {dt} ({name})")
        entries.append((name, dt, tuple(int(d) for d in shape)))
    entries.sort(key=lambda e: (-_RANK[_NAME[e[1]]], e[0]))
    header, off, where = {}, 0, {}
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape in entries:
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        header[name] = {"dtype": _NAME[dt], "shape": list(shape), "data_offsets": [off, off + n]}
        where[name] = (dt, shape, off)
        off += n
    hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    head = len(hb).to_bytes(8, "little") + hb
    return head, {k: (dt, shape, len(head) + o) for k, (dt, shape, o) in where.items()}, len(head) + off


class SafetensorsWriter:
    """Open ``path`` for the tensors of ``specs`` (name -> (dtype, shape));
    ``write(name, start, array)`` puts array's elements at element offset
    ``start`` of that tensor (C order), from any thread; ``close()`` checks that every byte
    of every tensor was written once. IntdetError for a
    name not in specs, a wrong dtype or a write past the tensor's end;
    OSError from the file system as is (the caller names the output)."""

    def __init__(self, path: str, specs: dict, metadata: dict | None = None):
        import threading

        head, self._where, self.size = layout(specs, metadata)
        self._written = {name: 0 for name in self._where}
        self._lock = threading.Lock()  # write() is called from the quantizer's threads
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(self._fd, self.size)  # sparse until written
            os.pwrite(self._fd, head, 0)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, name: str, start: int, array) -> None:
        if name not in self._where:
            raise IntdetError(f"internal: tensor '{name}' is not in the output plan")
        dt, shape, off = self._where[name]
        a = np.asarray(array)
        if a.dtype != dt:
            raise IntdetError(f"internal: tensor '{name}' written as {a.dtype}, planned {dt}")
        total = int(np.prod(shape, dtype=np.int64))
        if start < 0 or start + a.size > total:
            raise IntdetError(f"internal: write of {a.size} elements at {start} past the end of '{name}' ({total})")
        b = np.ascontiguousarray(a, dtype=dt.newbyteorder("<")).tobytes()
        pos, view = off + start * dt.itemsize, memoryview(b)
        while view:  # pwrite may write less than asked
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n
        with self._lock:
            self._written[name] += a.size

    def close(self) -> None:
        """Check that every tensor was written whole, then close."""
        try:
            for name, (dt, shape, _) in self._where.items():
                total = int(np.prod(shape, dtype=np.int64))
                if self._written[name] != total:
                    raise IntdetError(f"internal: tensor '{name}' got {self._written[name]} of {total} elements")
        finally:
            self.abort()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
