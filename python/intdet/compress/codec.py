"""The model-driven coder: compress a byte stream into the container, and
decompress it with every chunk of a batch decoded together.

Compression is teacher-forced: a chunk's ids x_1..x_n are one prefill of
(start, x_1, ..., x_{n-1}) from an empty KV cache (in pieces of
``PREFILL_PIECE`` tokens, so the int32 logits held stay at PIECE x V), and
x_t is coded under the table (table.py) of the logits at position t-1.
Decompression repeats the same forward one token at a time on the
scheduler (scheduler.py, the one generation loop), a range decoder choosing
each token instead of a sampler; up to ``batch`` chunks run as rows of one
forward call, a finished chunk's row taken over by the next chunk. Every row's
logits are the same bits alone or in any batch, on any backend, ISA and
thread count, so the tables and thus the bytes are too.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import IntdetError
from .chunking import MAX_CHUNK_BYTES_PER_TOKEN, TokenBytes, chunks
from .container import MODE_CODED, MODE_STORED, Chunk, Header, read_chunk, read_header
from .table import PRECISION

PREFILL_PIECE = 256
DEFAULT_CTX = 2048
DEFAULT_BATCH = 32


@dataclass
class Stats:
    in_bytes: int = 0
    out_bytes: int = 0
    tokens: int = 0
    chunks: int = 0
    stored_chunks: int = 0  # coded size >= raw size: kept as bytes
    byte_fallback_chunks: int = 0  # the tokenizer did not rebuild the bytes: byte tokens
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        orig = self.in_bytes if self.extra.get("direction") != "decompress" else self.out_bytes
        comp = self.out_bytes if self.extra.get("direction") != "decompress" else self.in_bytes
        d["bits_per_byte"] = 8 * comp / orig if orig else 0.0
        d["bytes_per_second"] = orig / self.seconds if self.seconds else 0.0
        return {**d, **self.extra}


def start_token(meta: dict) -> int:
    """The id fed before a chunk's first token: BOS, else the first EOS, else 0."""
    if meta.get("bos_token_id") is not None:
        return int(meta["bos_token_id"])
    eos = meta.get("eos_token_ids") or []
    return int(eos[0]) if eos else 0


def _token_bytes(engine, where="model") -> TokenBytes:
    """The engine's TokenBytes, built once per engine (its 49k-entry table
    takes ~0.5 s of CPU, a cost every compress and decompress call paid)."""
    tb = getattr(engine, "_compress_token_bytes", None)
    if tb is None:
        lm = engine.lm
        tb = TokenBytes(lm.tokenizer, lm.tok_meta, engine.vocab_size, where=lm.path or where)
        engine._compress_token_bytes = tb
    return tb


def logits_buffer(engine, rows: int) -> np.ndarray:
    """An int32 [rows, V] array the forwards write their logits into, one per
    compress or decompress call: a new 50 MB array for every 256-row piece
    was mapped and faulted in afresh each time (on a virtual machine the
    first touch of new pages cost up to several times the lm_head itself)."""
    return np.empty((rows, engine.vocab_size), dtype=np.int32)


def code_chunk(engine, core, ids, start: int, precision: int = PRECISION, buf: np.ndarray | None = None) -> bytes:
    """Range-coded bytes of token ids (list of int, 1..ctx of them); ``buf``:
    a logits_buffer of at least min(len(ids), PREFILL_PIECE) rows."""
    seq = engine.new_state(len(ids))
    inputs = np.asarray([start] + list(ids[:-1]), dtype=np.int32)
    targets = np.asarray(ids, dtype=np.int32)
    if buf is None:
        buf = logits_buffer(engine, min(len(ids), PREFILL_PIECE))
    enc = core.RangeEncoder()
    for i in range(0, len(ids), PREFILL_PIECE):
        n = min(PREFILL_PIECE, len(ids) - i)
        logits = seq.forward(inputs[i:i + n], all_logits=True, out=buf[:n])
        enc.encode_rows(logits, targets[i:i + n], precision)
    return enc.finish()


def compress_stream(engine, read, out, ctx: int = DEFAULT_CTX, model_name: str = "", weights: str = "",
                    progress=None, store_larger: bool = True) -> Stats:
    """Compress the bytes of ``read(n)`` into the seekable binary file ``out``.
    ``progress(n_bytes)`` is called after each chunk. A chunk whose coded
    size is not below its raw size is stored (``store_larger=False`` keeps
    it coded: the tests' random models need that to reach the coder).
    Returns Stats."""
    from .. import _core

    core = _core.compress
    if not 1 <= ctx <= engine.context_length:
        raise IntdetError(f"ctx: {ctx} must be in [1, {engine.context_length}] (the model's context length)",
                          field="ctx")
    tb = _token_bytes(engine)
    lm = engine.lm
    h = Header(precision=PRECISION, model_sha256=lm.model_sha256, engine_format=int(lm.cfg["format_version"]),
               tok_sha256=tb.sha256, ctx=ctx, max_chunk=ctx * MAX_CHUNK_BYTES_PER_TOKEN,
               start_id=start_token(lm.tok_meta), vocab=engine.vocab_size, model_name=model_name, weights=weights)
    t0 = time.perf_counter()
    out.write(h.pack())  # rewritten at the end with the length, checksum and chunk count
    st, sha = Stats(), hashlib.sha256()
    buf = None
    for data, ids, fallback in chunks(read, ctx, tb):
        sha.update(data)
        if ids and buf is None:
            buf = logits_buffer(engine, min(ctx, PREFILL_PIECE))
        payload = code_chunk(engine, core, ids, h.start_id, buf=buf) if ids else data
        if ids is None or (store_larger and len(payload) >= len(data)):
            c = Chunk(MODE_STORED, len(data), 0, zlib.crc32(data), data)
            st.stored_chunks += 1
        else:
            c = Chunk(MODE_CODED, len(data), len(ids), zlib.crc32(data), payload)
        st.byte_fallback_chunks += fallback
        out.write(c.pack())
        st.in_bytes += len(data)
        st.tokens += len(ids or ())
        st.chunks += 1
        if progress:
            progress(len(data))
    h.orig_len, h.orig_sha256, h.n_chunks = st.in_bytes, sha.hexdigest(), st.chunks
    end = out.tell()
    out.seek(0)
    out.write(h.pack())
    out.seek(end)
    st.out_bytes = end
    st.seconds = time.perf_counter() - t0
    st.extra = {"direction": "compress", "ctx": ctx, "model_sha256": lm.model_sha256}
    return st


def check_model(h: Header, engine, tb: TokenBytes, where: str) -> None:
    """The header's model, engine format and token table against the loaded ones."""
    lm = engine.lm
    if h.model_sha256 != lm.model_sha256:
        named = f"{h.model_name!r}, " if h.model_name else ""
        raise IntdetError(f"{where}: compressed with the model {named}of sha256 {h.model_sha256[:16]}..., but "
                          f"{lm.path} has sha256 {lm.model_sha256[:16]}... (give the right model with -m)")
    if h.engine_format != int(lm.cfg["format_version"]):
        raise IntdetError(f"{where}: compressed with engine format version {h.engine_format}, {lm.path} has "
                          f"{lm.cfg['format_version']}")
    if h.tok_sha256 != tb.sha256 or h.vocab != engine.vocab_size:
        raise IntdetError(f"{where}: the token table of {lm.path} differs from the one the file was compressed with")
    if h.ctx > engine.context_length:
        raise IntdetError(f"{where}: chunks of {h.ctx} tokens exceed the model's context {engine.context_length}")


class RangeChooser:
    """Decompression's token chooser for the scheduler (scheduler.Request's
    ``chooser``): the range decoder of one chunk's payload."""

    def __init__(self, core, payload: bytes, precision: int):
        self.core, self.dec, self.precision = core, core.RangeDecoder(payload), precision

    @staticmethod
    def choose_rows(choosers, rows) -> list:
        """Next id of each decoder under its int32 logits row (V values), all
        in one C++ call (in parallel); -1 where the data is impossible."""
        c = choosers[0]
        return c.core.decode_rows([x.dec for x in choosers], [np.ascontiguousarray(r, np.int32) for r in rows],
                                  c.precision).tolist()


def decompress_stream(engine, f, out, where: str, batch: int = DEFAULT_BATCH, progress=None,
                      header: Header | None = None) -> Stats:
    """Decompress the open container ``f`` (positioned after the header when
    ``header`` is given) into the binary file ``out``. Checks every chunk's
    CRC before decoding it, every decoded chunk's CRC, the total length and
    sha256; raises IntdetError naming ``where`` on any mismatch.

    Each coded chunk is a ``scheduler.Request`` (prompt: the start token;
    its ``n_tokens`` tokens chosen by a ``RangeChooser``), up to ``batch``
    of them in flight on one ``LLM`` over ``engine``: the generation loop of
    every other verb, one row per chunk and step."""
    from .. import _core
    from ..api import LLM
    from ..scheduler import CHOOSER_REFUSED, Request

    core = _core.compress
    if batch < 1:
        raise IntdetError(f"batch: {batch} must be >= 1", field="batch")
    h = header or read_header(f, where)
    tb = _token_bytes(engine)
    check_model(h, engine, tb, where)
    t0 = time.perf_counter()
    st, sha = Stats(), hashlib.sha256()
    st.in_bytes = len(h.pack())
    done: dict[int, bytes] = {}  # finished chunks not yet written (out of order)
    next_write, next_read = 0, 0
    inflight: list[tuple[int, Chunk, Request]] = []
    # every chunk's KV cache fits (the engine's context bounds n_tokens); a
    # step holds one row per chunk
    llm = LLM(engine, max_batch=batch, step_tokens=batch, kv_bytes=1 << 62, prefix_cache=False)

    def finish(i: int, c: Chunk, data: bytes | None):
        if data is None or len(data) != c.orig_len or zlib.crc32(data) != c.orig_crc32:
            raise IntdetError(f"{where}: chunk {i} is corrupt (decoded bytes do not match its checksum)")
        done[i] = data

    while next_write < h.n_chunks:
        new = []
        while len(inflight) < batch and next_read < h.n_chunks:
            c = read_chunk(f, h, next_read, where)
            st.in_bytes += 21 + len(c.payload)
            if c.mode == MODE_STORED:
                finish(next_read, c, c.payload)
                st.stored_chunks += 1
            else:
                req = Request([h.start_id], c.n_tokens, chooser=RangeChooser(core, c.payload, h.precision))
                inflight.append((next_read, c, req))
                new.append(req)
            next_read += 1
        if inflight:  # step until a chunk is done: only then is there a slot to refill or data to write
            llm.run(new, until=lambda: any(req.done.is_set() for _, _, req in inflight))
            keep = []
            for i, c, req in inflight:
                if not req.done.is_set():
                    keep.append((i, c, req))
                elif req.error == CHOOSER_REFUSED:
                    raise IntdetError(f"{where}: chunk {i} is corrupt (impossible range-coded data)")
                elif req.finish_reason == "error":
                    raise IntdetError(f"{where}: chunk {i}: {req.error}")
                else:
                    finish(i, c, tb.bytes_of(req.tokens))
                    st.tokens += len(req.tokens)
            inflight = keep
        while next_write in done:
            data = done.pop(next_write)
            sha.update(data)
            out.write(data)
            st.out_bytes += len(data)
            next_write += 1
            if progress:
                progress(len(data))
    if f.read(1):
        raise IntdetError(f"{where}: corrupt (data after the last chunk)")
    if st.out_bytes != h.orig_len or sha.hexdigest() != h.orig_sha256:
        raise IntdetError(f"{where}: corrupt (the output's length or sha256 differs from the header's)")
    st.chunks = h.n_chunks
    st.seconds = time.perf_counter() - t0
    st.extra = {"direction": "decompress", "ctx": h.ctx, "batch": batch}
    return st
