"""Token ids back to text while they are generated: :class:`StreamDecoder`."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders


class StreamDecoder:
    """Incremental detokenizer: feed generated ids one at a time, get printable text.

    The chunking is ``tokenizers.decoders.DecodeStream``'s: a byte-level or
    byte-fallback token can hold part of a UTF-8 character, and DecodeStream
    holds text back while it ends in U+FFFD, so no character is split between
    chunks; it decodes only a short window of recent ids, so each step is
    cheap. The concatenation of all ``push`` results plus ``flush()`` equals
    ``tok.decode(all_ids)``. Kept here, because DecodeStream lacks them:

    * ``flush()``: DecodeStream never releases a character left incomplete at
      the end (generation stopped inside it), which ``tok.decode`` shows as
      U+FFFD; flush decodes all ids once and returns what is still owed.
    * the vocab check: DecodeStream decodes an unknown id as no text at all.
    * a fallback for decoders whose text is not prefix-stable (one rewriting
      text across token boundaries, e.g. Replace("ab", "X")): DecodeStream
      raises on them, which must not end a generation, so from then on each
      step decodes all ids and returns the new stable text.

    Args:
        tok: the ``tokenizers.Tokenizer`` that produced the ids.
        skip_special_tokens: drop special tokens from the text (default: show them).
    """

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tok
        self._skip = skip_special_tokens
        self._stream = decoders.DecodeStream(skip_special_tokens=skip_special_tokens)  # None: fallen back
        self._ids: list[int] = []  # every id pushed since the last flush
        self._emitted = 0          # chars of decode(self._ids) already returned

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        """Add one id (``int``); return the newly completed text (``str``, maybe empty).

        Raises:
            ValueError: ``token_id`` is not in the tokenizer's vocab.
        """
        token_id = int(token_id)
        if token_id < 0 or self._tok.id_to_token(token_id) is None:
            raise ValueError(f"token id {token_id} is not in the vocab")
        self._ids.append(token_id)
        if self._stream is not None:
            try:
                out = self._stream.step(self._tok, token_id) or ""
                self._emitted += len(out)
                return out
            except Exception:  # tokenizers raises a bare Exception (InvalidPrefix)
                self._stream = None
        text = self._decode(self._ids)
        stable = len(text.rstrip("\ufffd"))
        out = text[self._emitted:stable]
        self._emitted = max(self._emitted, stable)
        return out

    def flush(self) -> str:
        """Return everything not yet returned (``str``, may end in U+FFFD for a truncated
        character) and reset the decoder."""
        out = self._decode(self._ids)[self._emitted:]
        self.__init__(self._tok, self._skip)
        return out
