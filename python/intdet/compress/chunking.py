"""Bytes <-> token ids for compression, and the cut of an input into chunks.

``TokenBytes`` gives every token id its exact byte string (byte-level BPE:
the GPT-2 byte alphabet mapped back to bytes; SentencePiece with byte
fallback, as tokenizer/spm.py builds it: U+2581 back to a space and
``<0xNN>`` to byte NN; added tokens: their UTF-8 content), so the decoder rebuilds the bytes from ids alone, without the
tokenizer's text decoder. The encoder tokenizes a chunk's valid UTF-8 runs
with the model's tokenizer and codes each byte of an invalid run as its byte
token; when the ids do not rebuild the chunk byte for byte it falls back to
byte tokens for the whole chunk. The decoder never calls the tokenizer, so
its version cannot matter; the header's tokenizer hash is the hash of this
table.

Chunks: at most ``ctx`` tokens and ``ctx * MAX_CHUNK_BYTES_PER_TOKEN``
bytes, cut where the tokens run out, preferably after a newline or before a
space in the last quarter of the span, never inside a UTF-8 character
(unless the input is not UTF-8 there). The cut depends only on the bytes and
the tokenizer, so a file compresses to the same bytes on every machine.
"""

from __future__ import annotations

import hashlib
import json
import re

from ..errors import IntdetError
from ..random_model import byte_symbols
from ..tokenizer import encode

MAX_CHUNK_BYTES_PER_TOKEN = 8  # a chunk's byte budget per token of context
_INVALID_RUN = re.compile("([\udc80-\udcff]+)")


def _decoder_types(d) -> list:
    if not d:
        return []
    if d.get("type") == "Sequence":
        return [t for x in d.get("decoders", []) for t in _decoder_types(x)]
    return [d.get("type")]


_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
SPM_SPACE = "\u2581"


def _without_space_prefix(tok):
    """A copy of a SentencePiece tokenizer without its normalizer's Prepend
    step (llama.cpp's add_space_prefix), or ``tok`` itself when it has none.
    The prefixed space is not in the input's bytes, so ids made with it
    would not rebuild them; without it they do (the model sees each chunk
    without the extra leading space, which costs only a little at its start)."""
    from tokenizers import Tokenizer

    j = json.loads(tok.to_str())
    norm = j.get("normalizer") or {}
    steps = norm.get("normalizers") if norm.get("type") == "Sequence" else [norm]
    kept = [n for n in steps if n and n.get("type") != "Prepend"]
    if len(kept) == len([n for n in steps if n]):
        return tok
    j["normalizer"] = {"type": "Sequence", "normalizers": kept}
    return Tokenizer.from_str(json.dumps(j))


class TokenBytes:
    """The byte string of every token id of a byte-level BPE or a
    SentencePiece (byte fallback) tokenizer.

    Args:
        tok, meta: the model's ``tokenizers.Tokenizer`` and tokenizer meta.
        vocab_size: the model's vocabulary (ids beyond the tokenizer have no bytes).

    Attributes: ``table`` (list of bytes or None, one per id), ``byte_ids``
    (the id of each single byte 0..255), ``sha256`` (hex, of the table).

    Raises IntdetError when the tokenizer is neither (its decoder's kinds
    are named).
    """

    def __init__(self, tok, meta: dict, vocab_size: int, where: str = "model"):
        self.meta = meta
        kinds = _decoder_types(json.loads(tok.to_str()).get("decoder"))
        if "ByteLevel" in kinds:
            self.kind = "byte-level BPE"
            u2b = {c: b for b, c in enumerate(byte_symbols())}
            piece = lambda s: bytes(u2b[c] for c in s) if s and all(c in u2b for c in s) else None  # noqa: E731
            sym = byte_symbols()
            byte_piece = [sym[b] for b in range(256)]
            self.tok = tok
        elif "ByteFallback" in kinds:
            self.kind = "SentencePiece"

            def piece(s):
                m = _BYTE_PIECE.fullmatch(s) if s else None
                if m:
                    return bytes([int(m.group(1), 16)])
                return s.replace(SPM_SPACE, " ").encode("utf-8") if s else None

            byte_piece = [f"<0x{b:02X}>" for b in range(256)]
            self.tok = _without_space_prefix(tok)
        else:
            raise IntdetError(f"{where}: compress needs a byte-level BPE (GPT-2 style) or a SentencePiece tokenizer "
                              f"with byte fallback; this one's decoder is {'/'.join(map(str, kinds)) or 'none'}")
        added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
        table: list = []
        for i in range(vocab_size):
            if i in added:
                table.append(added[i].encode("utf-8") or None)
                continue
            table.append(piece(tok.id_to_token(i)))
        self.table = table
        vocab = tok.get_vocab()
        # SmolLM2's vocabulary lacks 21 byte values (0x04, 0xC0, 0xF5-0xFF, ...): None there.
        self.byte_ids = [i if i is not None and i < vocab_size else None for i in (vocab.get(byte_piece[b]) for b in range(256))]
        h = hashlib.sha256(b"intdet token bytes v1\0")
        for t in table:
            h.update(b"\xff" if t is None else len(t).to_bytes(4, "little") + t)
        self.sha256 = h.hexdigest()

    def ids_of(self, data: bytes) -> tuple[list[int] | None, bool]:
        """(token ids that rebuild ``data`` exactly, whether byte tokens were
        needed for text the tokenizer does not rebuild). Valid UTF-8 runs go
        through the tokenizer; a run it does not rebuild byte for byte, and
        every invalid byte, become byte tokens. None when some such byte has
        no byte token (the chunk is then stored)."""
        parts = _INVALID_RUN.split(data.decode("utf-8", "surrogateescape"))
        ids: list[int] = []
        fallback = False
        for k, part in enumerate(parts):
            if not part:
                continue
            raw = part.encode("utf-8", "surrogateescape")
            if k % 2 == 0:
                got = encode(self.tok, self.meta, part, add_bos=False)
                if self.bytes_of(got) == raw:
                    ids += got
                    continue
                fallback = True
            byte_ids = [self.byte_ids[b] for b in raw]
            if None in byte_ids:
                return None, fallback
            ids += byte_ids
        return ids, fallback

    def bytes_of(self, ids) -> bytes | None:
        """The bytes of ``ids``; None when an id has no bytes."""
        try:
            return b"".join(self.table[i] for i in ids)
        except (TypeError, IndexError):
            return None


def _char_start(data: bytes, cut: int) -> int:
    """cut moved back by at most 3 bytes (never below 1) so that it does not
    split a UTF-8 character."""
    for c in range(cut, max(cut - 4, 0), -1):
        if c >= len(data) or (data[c] & 0xC0) != 0x80:
            return c
    return cut


def _nice_cut(data: bytes, cut: int) -> int:
    """Prefer a cut after a newline, else before a space, in [3/4 cut, cut]."""
    lo = cut - cut // 4
    i = data.rfind(b"\n", lo, cut)
    if i >= 0:
        return i + 1
    i = data.rfind(b" ", lo, cut)
    return i if i > 0 else _char_start(data, cut)


def chunks(read, ctx: int, tb: TokenBytes, block: int = 1 << 20):
    """Yield (chunk bytes, token ids or None, byte-token fallback used) for the
    input read by ``read(n) -> bytes`` (b"" at the end). Each chunk has 1..ctx
    ids (None: it holds a byte without a token and is stored);
    memory holds at most one block plus one chunk's span."""
    span = ctx * MAX_CHUNK_BYTES_PER_TOKEN
    buf, eof = b"", False
    while True:
        while not eof and len(buf) < span:
            more = read(max(block, span))
            eof = not more
            buf += more
        if not buf:
            return
        window = buf[:span]
        ids, fb = tb.ids_of(window)
        if ids is None:  # some byte has no token: stored, cut by bytes alone
            cut = len(window) if (eof and len(buf) <= span) else _nice_cut(window, len(window))
            yield window[:cut], None, fb
            buf = buf[cut:]
            continue
        if len(ids) <= ctx:
            cut = len(window) if (eof and len(buf) <= span) else _nice_cut(window, len(window))
        else:
            cut = _nice_cut(window, len(tb.bytes_of(ids[:ctx])))
        while True:
            if cut != len(window) or len(ids) > ctx:
                ids, fb = tb.ids_of(window[:cut])
            if ids is None or len(ids) <= ctx:
                break
            cut = _char_start(window, max(1, cut - max(1, cut // 16)))
        yield window[:cut], ids, fb
        buf = buf[cut:]
