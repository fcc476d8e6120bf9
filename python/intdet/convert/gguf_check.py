"""Structural check of a GGUF file before the ``gguf`` package reads it.

``gguf.GGUFReader`` trusts the header: a string length, array length,
dimension or offset from the file decides how much it reads, how many numpy
views it makes (one per array element) and where it looks, so a hostile or
broken file can make it allocate gigabytes, loop for hours or fail deep
inside numpy. ``check_gguf_structure`` parses the whole header itself, with
Python ints (no 64-bit wrap-around), and compares every count, length,
offset, dimension and the alignment with the file size and with hard limits
before anything is allocated. The first problem raises IntdetError
``"<path>: <what is wrong>"``.

Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all
little-endian: ``GGUF`` magic, uint32 version (2 or 3), uint64 tensor_count,
uint64 kv_count; kv_count x (string key, uint32 value type, value); then
tensor_count x (string name, uint32 n_dims, n_dims x uint64 ne, uint32 ggml
type, uint64 offset); padding to ``general.alignment`` (default 32); tensor
data, each tensor at data_start + offset. A string is a uint64 length and
that many UTF-8 bytes; an array is a uint32 element type, a uint64 count and
the elements.
"""

from __future__ import annotations

import mmap
import os
import struct

from ..errors import IntdetError

MAX_TENSORS = 1 << 16
MAX_KV = 1 << 16
MAX_KEY_LEN = 1 << 16
MAX_NAME_LEN = 63  # GGML_MAX_NAME - 1, as llama.cpp's gguf reader enforces
MAX_STRING_LEN = 1 << 30
MAX_ARRAY_LEN = 1 << 22  # gguf-py makes one numpy view per element
MAX_ARRAY_TOTAL = 1 << 23  # all arrays of the file together
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 1 << 20
DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> (name, fixed size or None)
T_STRING, T_ARRAY = 8, 9
VALUE_TYPES = {
    0: ("UINT8", 1), 1: ("INT8", 1), 2: ("UINT16", 2), 3: ("INT16", 2), 4: ("UINT32", 4), 5: ("INT32", 4),
    6: ("FLOAT32", 4), 7: ("BOOL", 1), 8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", 8),
    11: ("INT64", 8), 12: ("FLOAT64", 8),
}


INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
FLOAT_TYPES = {6, 12}
# Value types of the metadata intdet reads (as llama.cpp checks them), so the
# tokenizer and hyper-parameter code never meets a list where it wants a
# string. key (or "prefix.*") -> (allowed value types, allowed array element types)
KEY_TYPES = {
    "general.architecture": ({T_STRING}, None),
    "tokenizer.ggml.model": ({T_STRING}, None),
    "tokenizer.ggml.pre": ({T_STRING}, None),
    "tokenizer.chat_template": ({T_STRING}, None),
    "tokenizer.chat_template.*": ({T_STRING}, None),
    "tokenizer.ggml.tokens": ({T_ARRAY}, {T_STRING}),
    "tokenizer.ggml.merges": ({T_ARRAY}, {T_STRING}),
    "tokenizer.ggml.token_type": ({T_ARRAY}, INT_TYPES),
    "tokenizer.ggml.scores": ({T_ARRAY}, FLOAT_TYPES),
    "tokenizer.ggml.*_token_id": (INT_TYPES, None),
    "tokenizer.ggml.add_*": ({7}, None),
}


def _expected_types(key: str):
    if key in KEY_TYPES:
        return KEY_TYPES[key]
    for pat, want in KEY_TYPES.items():
        if "*" in pat:
            head, tail = pat.split("*")
            if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
                return want
    return None


def _type_name(vtype, etype=None):
    n = VALUE_TYPES[vtype][0]
    return f"{n} of {VALUE_TYPES[etype][0]}" if vtype == T_ARRAY and etype is not None else n


def _quant_sizes() -> dict:
    """ggml type id -> (name, block size, bytes per block), from gguf-py."""
    from gguf import GGML_QUANT_SIZES

    return {int(t): (t.name, int(bs), int(ts)) for t, (bs, ts) in GGML_QUANT_SIZES.items()}


class _Cursor:
    """Bounds-checked little-endian reads from a buffer of ``size`` bytes."""

    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, what: str):
        raise IntdetError(f"{self.path}: {what}")

    def need(self, n: int, what: str):
        if n < 0 or n > self.size - self.pos:
            self.fail(f"truncated GGUF: {what} at offset {self.pos} needs {n} bytes but the file has "
                      f"{max(self.size - self.pos, 0)} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def name(self, what: str, limit: int) -> str:
        """A key or tensor name: also free of control characters (they end
        up in one-line error messages)."""
        s = self.string(what, limit)
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in s):
            self.fail(f"{what} {s[:80]!r} contains control characters")
        return s

    def string(self, what: str, limit: int = MAX_STRING_LEN) -> str:
        n = self.u64(f"{what} length")
        if n > limit:
            self.fail(f"{what} length {n} exceeds the limit of {limit} bytes")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 (byte {e.start})")

    def skip(self, n: int, what: str):
        self.need(n, what)
        self.pos += n


def _skip_strings(c: _Cursor, n: int, key: str):
    """c.string() n times (the inner loop of a token list: kept lean)."""
    buf, size, pos = c.buf, c.size, c.pos
    unpack = struct.Struct("<Q").unpack_from
    for j in range(n):
        if size - pos < 8:
            c.pos = pos
            c.string(f"element {j} of metadata {key!r}")  # raises the truncation error
        (ln,) = unpack(buf, pos)
        pos += 8
        if ln > size - pos or ln > MAX_STRING_LEN:
            c.pos = pos - 8
            c.string(f"element {j} of metadata {key!r}")  # raises
        try:
            buf[pos:pos + ln].decode("utf-8")
        except UnicodeDecodeError:
            c.pos = pos - 8
            c.string(f"element {j} of metadata {key!r}")  # raises
        pos += ln
    c.pos = pos


def check_gguf_structure(path) -> dict:
    """Check that ``path`` is a well-formed GGUF file whose header describes
    only bytes inside the file; raise IntdetError on the first problem.

    Returns a summary: version, alignment, data_start, kv keys (in file
    order) and tensors as (name, ggml type name, dims, offset, nbytes)."""
    path = str(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise IntdetError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 4:
            raise IntdetError(f"{path}: not a GGUF file (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _check(_Cursor(mm, size, path), size)


def _check(c: _Cursor, size: int) -> dict:
    if bytes(c.buf[0:4]) != b"GGUF":
        c.fail("not a GGUF file (bad magic)")
    c.pos = 4
    version = c.u32("version")
    if version not in (2, 3):
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in (1, 2, 3):
            c.fail("big-endian GGUF files are not supported")
        c.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata key/value count")
    if n_tensors > MAX_TENSORS:
        c.fail(f"tensor count {n_tensors} exceeds the limit of {MAX_TENSORS}")
    if n_kv > MAX_KV:
        c.fail(f"metadata key/value count {n_kv} exceeds the limit of {MAX_KV}")

    keys, alignment, array_total = [], DEFAULT_ALIGNMENT, 0
    seen_keys = set()
    for i in range(n_kv):
        key = c.name(f"metadata key #{i}", MAX_KEY_LEN)
        if key in seen_keys:
            c.fail(f"duplicate metadata key {key!r}")
        seen_keys.add(key)
        keys.append(key)
        vtype = c.u32(f"type of metadata {key!r}")
        if vtype not in VALUE_TYPES:
            c.fail(f"metadata {key!r} has unknown value type {vtype}")
        want = _expected_types(key)
        if want and vtype not in want[0]:
            c.fail(f"metadata {key!r} has type {_type_name(vtype)}, expected "
                   f"{' or '.join(sorted(_type_name(t) for t in want[0]))}")
        if vtype == T_ARRAY:
            etype = c.u32(f"element type of metadata {key!r}")
            if etype not in VALUE_TYPES:
                c.fail(f"metadata {key!r} is an array of unknown value type {etype}")
            if want and want[1] and etype not in want[1]:
                c.fail(f"metadata {key!r} is an {_type_name(vtype, etype)}, expected an ARRAY of "
                       f"{' or '.join(sorted(VALUE_TYPES[t][0] for t in want[1]))}")
            if etype == T_ARRAY:
                c.fail(f"metadata {key!r} is a nested array (not supported)")
            n = c.u64(f"length of metadata array {key!r}")
            if n > MAX_ARRAY_LEN:
                c.fail(f"metadata array {key!r} has {n} elements, more than the limit of {MAX_ARRAY_LEN}")
            array_total += n
            if array_total > MAX_ARRAY_TOTAL:
                c.fail(f"metadata arrays hold more than {MAX_ARRAY_TOTAL} elements in all")
            if etype == T_STRING:
                c.need(8 * n, f"metadata array {key!r} of {n} strings")  # each at least its length field
                _skip_strings(c, n, key)
            else:
                c.skip(n * VALUE_TYPES[etype][1], f"metadata array {key!r} of {n} x {VALUE_TYPES[etype][0]}")
        elif vtype == T_STRING:
            c.string(f"metadata {key!r}")
        else:
            if key == "general.alignment":
                if vtype != 4:
                    c.fail(f"general.alignment has type {VALUE_TYPES[vtype][0]}, expected UINT32")
                alignment = c.u32("general.alignment")
                if not (1 <= alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
                    c.fail(f"general.alignment {alignment} is not a power of two in [1, {MAX_ALIGNMENT}]")
            else:
                c.skip(VALUE_TYPES[vtype][1], f"metadata {key!r}")

    qsizes = _quant_sizes()
    infos, names = [], set()
    for i in range(n_tensors):
        name = c.name(f"name of tensor #{i}", MAX_NAME_LEN)
        if name in names:
            c.fail(f"duplicate tensor name '{name}'")
        names.add(name)
        n_dims = c.u32(f"dimension count of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            c.fail(f"tensor '{name}' has {n_dims} dimensions (must be 1 to {MAX_DIMS})")
        dims = [c.u64(f"dimension {d} of tensor '{name}'") for d in range(n_dims)]
        n_elems = 1
        for d in dims:
            if d == 0:
                c.fail(f"tensor '{name}' has a zero dimension {dims}")
            n_elems *= d
            if n_elems >= 1 << 63:
                c.fail(f"tensor '{name}' dimensions {dims} overflow 64 bits")
        ttype = c.u32(f"type of tensor '{name}'")
        if ttype not in qsizes:
            c.fail(f"tensor '{name}' has unknown ggml type id {ttype}")
        tname, block, tsize = qsizes[ttype]
        if dims[0] % block:
            c.fail(f"tensor '{name}' of type {tname}: first dimension {dims[0]} is not a multiple of the block size {block}")
        nbytes = n_elems // block * tsize
        offset = c.u64(f"data offset of tensor '{name}'")
        infos.append((name, tname, dims, offset, nbytes))

    data_start = -(-c.pos // alignment) * alignment
    data_len = size - data_start
    if infos and data_len < 0:
        c.fail(f"truncated GGUF: the tensor data should start at offset {data_start} but the file has {size} bytes")
    spans = []
    for name, tname, dims, offset, nbytes in infos:
        if offset % alignment:
            c.fail(f"tensor '{name}' data offset {offset} is not a multiple of the alignment {alignment}")
        if offset > data_len or nbytes > data_len - offset:
            c.fail(f"tensor '{name}' ({tname} x {dims}, {nbytes} bytes at data offset {offset}) runs past the end "
                   f"of the file (the data section has {max(data_len, 0)} bytes)")
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            c.fail(f"tensors '{n0}' and '{n1}' overlap in the data section")
    return {"version": version, "alignment": alignment, "data_start": data_start, "keys": keys, "tensors": infos}
