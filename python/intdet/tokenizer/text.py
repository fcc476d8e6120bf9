"""Text to token ids: :func:`encode` (BOS from the meta dict, special-token strings
kept plain unless asked) and :func:`check_text` (text that cannot be UTF-8, named)."""

from __future__ import annotations

import threading

from tokenizers import Tokenizer

from ..errors import IntdetError

# encode() flips Tokenizer.encode_special_tokens for one call; the lock keeps threads that
# share a tokenizer from seeing each other's setting.
_ENCODE_LOCK = threading.Lock()
# tokenizers' encode and decode hold the GIL, the batch forms let it go: past these sizes (a MB
# of text takes ~1 s) a batch of one, so other threads (the server's event loop) run meanwhile.
# encode_batch_fast (tokenizers >= 0.21; the same ids, no offsets) also frees its result in ms
# where encode_batch's holds the GIL ~0.25 s a MB.
RELEASE_GIL_CHARS = 1 << 16
RELEASE_GIL_IDS = 1 << 14


def check_text(text: str, what: str = "text") -> None:
    """IntdetError naming ``what`` when ``text`` cannot be UTF-8: a lone
    surrogate code point (JSON allows "\\ud800"), or a byte of a command-line
    argument that was not UTF-8 (Python carries it as a surrogate escape,
    U+DC80..U+DCFF). The tokenizer takes text only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        if 0xDC80 <= c <= 0xDCFF:
            at = len(text[:e.start].encode("utf-8", "surrogateescape"))
            raise IntdetError(f"{what}: not valid UTF-8 (byte {at})") from None
        raise IntdetError(f"{what}: character {e.start} is a lone surrogate (U+{c:04X}), not text") from None


def encode(tok: Tokenizer, meta: dict, text: str, add_bos: bool | None = None,
           special: bool = False, what: str = "text") -> list[int]:
    """Tokenize ``text`` into ``list[int]``.

    Args:
        tok, meta: from :func:`tokenizer_from_gguf` or :func:`load_tokenizer`.
        text: the text; with ``special=False`` (default) special-token strings in it such as
            ``"<|im_end|>"`` are tokenized as plain text, so user input cannot inject control
            tokens. ``special=True`` matches them as single tokens (for rendered chat prompts).
        add_bos: prepend ``meta['bos_token_id']``; default ``meta['add_bos_token']``.

        what: the name an error gives ``text`` (check_text).

    Raises:
        TypeError: ``text`` is not a ``str``.
        IntdetError: ``text`` is not valid Unicode (check_text).
        ValueError: BOS requested but the model has none.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    if add_bos is None:
        add_bos = bool(meta.get("add_bos_token"))
    with _ENCODE_LOCK:
        before = tok.encode_special_tokens
        tok.encode_special_tokens = not special  # True = treat special tokens as text
        try:
            if len(text) > RELEASE_GIL_CHARS:
                batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
                ids = batch([text], add_special_tokens=False)[0].ids
            else:
                ids = tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # tokenizers refuses text that is not UTF-8: name it (checked only then)
            check_text(text, what)
            raise
        finally:
            tok.encode_special_tokens = before
    if not add_bos:
        return ids
    if meta.get("bos_token_id") is None:
        raise ValueError("BOS requested but the model has no bos_token_id")
    return [int(meta["bos_token_id"])] + ids
