"""The ``.idz`` container of ``intdet compress`` (docs/compress.md has the
table). Little-endian throughout; every size is checked against its bound
before use, and each part carries a CRC-32 so that a corrupt or truncated
file is named before any model work.

Header::

    magic        8  b"intdetz\\n"
    version      u16  FORMAT_VERSION
    precision    u8   the tables total 2^precision
    reserved     u8   0
    model_sha256 32   sha256 of the model's model.safetensors
    engine_fmt   u32  the model's format_version (config.json)
    tok_sha256   32   TokenBytes.sha256 (the id -> bytes table)
    ctx          u32  most tokens in a chunk
    max_chunk    u32  most bytes in a chunk
    start_id     u32  the token fed before each chunk's first
    vocab        u32  the model's vocabulary size
    orig_len     u64  bytes of the original
    orig_sha256  32   sha256 of the original
    n_chunks     u64
    name_len     u16, name (UTF-8): the -m given to compress ("" = the default model)
    weights_len  u8,  weights ("int8"/"int4")
    crc32        u32  of all the header bytes before it

Chunk record (n_chunks of them, in order)::

    mode         u8   0 = range-coded tokens, 1 = stored bytes
    orig_len     u32  1..max_chunk
    n_tokens     u32  mode 0: 1..ctx; mode 1: 0
    payload_len  u32  mode 0: <= 4 * n_tokens + 8; mode 1: orig_len
    orig_crc32   u32  of the chunk's original bytes
    crc32        u32  of the 17 bytes above and the payload
    payload
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ..errors import IntdetError

MAGIC = b"intdetz\n"
FORMAT_VERSION = 1
MODE_CODED, MODE_STORED = 0, 1
_FIXED = struct.Struct("<8sHBB32sI32sIIII Q32sQ")
_REC = struct.Struct("<BIIII")
_CRC = struct.Struct("<I")


@dataclass
class Header:
    precision: int
    model_sha256: str
    engine_format: int
    tok_sha256: str
    ctx: int
    max_chunk: int
    start_id: int
    vocab: int
    orig_len: int = 0
    orig_sha256: str = "0" * 64
    n_chunks: int = 0
    model_name: str = ""
    weights: str = "int8"

    def pack(self) -> bytes:
        name, w = self.model_name.encode("utf-8"), self.weights.encode("ascii")
        b = _FIXED.pack(MAGIC, FORMAT_VERSION, self.precision, 0, bytes.fromhex(self.model_sha256),
                        self.engine_format, bytes.fromhex(self.tok_sha256), self.ctx, self.max_chunk, self.start_id,
                        self.vocab, self.orig_len, bytes.fromhex(self.orig_sha256), self.n_chunks)
        b += struct.pack("<H", len(name)) + name + struct.pack("<B", len(w)) + w
        return b + _CRC.pack(zlib.crc32(b))


CHUNK_OVERHEAD = _REC.size + _CRC.size  # bytes of a chunk record before its payload
HEADER_MAX = _FIXED.size + 2 + 0xFFFF + 1 + 0xFF + _CRC.size  # the longest model name and weights


def compressed_bound(n_bytes: int, min_chunk: int) -> int:
    """About the most bytes a compressed file of ``n_bytes`` can take when
    no chunk is shorter than ``min_chunk`` bytes (the last may be): every
    chunk stored (a coded one is smaller, else it is stored), plus each
    chunk's record and the header."""
    return HEADER_MAX + n_bytes + CHUNK_OVERHEAD * -(-n_bytes // max(1, min_chunk))


def _read_exact(f, n: int, where: str, what: str) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise IntdetError(f"{where}: truncated ({what} cut short)")
    return b


def read_header(f, where: str) -> Header:
    """Parse and check the header from binary file ``f``. Raises IntdetError
    naming ``where`` for a foreign file, another version, a bad CRC or
    out-of-range values."""
    head = f.read(len(MAGIC))
    if head != MAGIC:
        raise IntdetError(f"{where}: not an intdet compressed file (bad magic)")
    rest = _read_exact(f, _FIXED.size - len(MAGIC), where, "header")
    (_, version, precision, _, msha, efmt, tsha, ctx, max_chunk, start, vocab, olen, osha,
     n_chunks) = _FIXED.unpack(head + rest)
    if version != FORMAT_VERSION:
        raise IntdetError(f"{where}: compressed with container format version {version}; "
                          f"this intdet reads version {FORMAT_VERSION}")
    nl = _read_exact(f, 2, where, "header")
    name = _read_exact(f, struct.unpack("<H", nl)[0], where, "header")
    wl = _read_exact(f, 1, where, "header")
    w = _read_exact(f, wl[0], where, "header")
    crc = _read_exact(f, 4, where, "header")
    if zlib.crc32(head + rest + nl + name + wl + w) != _CRC.unpack(crc)[0]:
        raise IntdetError(f"{where}: header is corrupt (CRC mismatch)")
    try:
        h = Header(precision, msha.hex(), efmt, tsha.hex(), ctx, max_chunk, start, vocab, olen, osha.hex(),
                   n_chunks, name.decode("utf-8"), w.decode("ascii"))
    except UnicodeDecodeError:
        raise IntdetError(f"{where}: header is corrupt (model name not UTF-8)") from None
    from .table import MAX_PRECISION, MAX_VOCAB, MIN_PRECISION

    bad = (not MIN_PRECISION <= precision <= MAX_PRECISION and "precision") or \
        (not 1 <= vocab <= MAX_VOCAB and "vocab") or (not 0 <= start < vocab and "start_id") or \
        (not 1 <= ctx <= 1 << 20 and "ctx") or (not 1 <= max_chunk <= 1 << 26 and "max_chunk") or \
        (n_chunks > olen and "n_chunks") or (olen and not n_chunks and "n_chunks")
    if bad:
        raise IntdetError(f"{where}: header field {bad} out of range")
    return h


@dataclass
class Chunk:
    mode: int
    orig_len: int
    n_tokens: int
    orig_crc32: int
    payload: bytes

    def pack(self) -> bytes:
        r = _REC.pack(self.mode, self.orig_len, self.n_tokens, len(self.payload), self.orig_crc32)
        return r + _CRC.pack(zlib.crc32(self.payload, zlib.crc32(r))) + self.payload


def read_chunk(f, h: Header, index: int, where: str) -> Chunk:
    """Read chunk ``index`` (checked: sizes against the header's bounds, CRC)."""
    what = f"chunk {index}"
    r = _read_exact(f, _REC.size, where, what)
    mode, olen, ntok, plen, ocrc = _REC.unpack(r)
    crc = _CRC.unpack(_read_exact(f, 4, where, what))[0]
    ok = 1 <= olen <= h.max_chunk and (
        (mode == MODE_CODED and 1 <= ntok <= min(h.ctx, olen) and plen <= 4 * ntok + 8) or
        (mode == MODE_STORED and ntok == 0 and plen == olen))
    if not ok:
        raise IntdetError(f"{where}: {what} is corrupt (mode {mode}, {olen} bytes, {ntok} tokens, "
                          f"payload {plen} out of range)")
    payload = _read_exact(f, plen, where, what)
    if zlib.crc32(payload, zlib.crc32(r)) != crc:
        raise IntdetError(f"{where}: {what} is corrupt (CRC mismatch)")
    return Chunk(mode, olen, ntok, ocrc, payload)
