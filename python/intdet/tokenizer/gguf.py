"""Rebuild a ``tokenizers.Tokenizer`` and its meta dict from a GGUF file's vocabulary:
byte-level BPE (``tokenizer.ggml.model = "gpt2"``, with llama.cpp's pre-tokenizer
regexes) here, SentencePiece (``"llama"``) through spm.py."""

from __future__ import annotations

import os
from typing import Any

import gguf
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
)

from .meta import _EOG_TOKEN_TEXTS, _eos_list
from .spm import sentencepiece_bpe

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes, after llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe).
# llama.cpp splits with each regex in turn, keeping both matches and the gaps between
# them; a chain of Split(..., "isolated") pre-tokenizers does the same. llama.cpp spells
# the case-insensitive contractions out because its regex engine lacks (?i:); Oniguruma
# (used by `tokenizers`) has it, so the upstream tokenizer.json forms are used.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT_RES = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]")

_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT_RES,
    **dict.fromkeys(("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais"), (_GPT2_RE,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"),
                    (r"\p{N}", _GPT2_RE)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe",
                     "chatglm-bpe", "glm4"), (_LLAMA3_RE,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2_RE,)),
}
# llama.cpp: these pre-tokenizers also skip BPE when a whole word is in the vocab,
# and their models want a BOS by default.
_LLAMA3_FAMILY = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3"))


def tokenizer_from_gguf(reader: gguf.GGUFReader | str | os.PathLike) -> tuple[Tokenizer, dict]:
    """Rebuild a Hugging Face fast tokenizer from the vocabulary stored in a GGUF file.

    Args:
        reader: an open ``gguf.GGUFReader`` (or a path to a ``.gguf`` file).

    Returns:
        ``(tokenizer, meta)``: a ``tokenizers.Tokenizer`` with no post-processor (BOS is
        the caller's job, see :func:`encode`) and the meta dict described in the module
        docstring. Control tokens (GGUF type 3) become special added tokens, user-defined
        tokens (type 4) plain added tokens; both are matched whole in text, but
        :func:`encode` only honours control tokens when ``special=True`` (as llama.cpp).

    Supported ``tokenizer.ggml.model`` values: ``"gpt2"`` (byte-level BPE with merges;
    the pre-tokenizer follows ``tokenizer.ggml.pre``) and ``"llama"`` (SentencePiece
    BPE from scores, with byte fallback, as llama.cpp tokenizes it: see
    :mod:`intdet.tokenizer.spm`; Llama 2, Gemma 3).

    Raises:
        ValueError: unsupported tokenizer model or pre-tokenizer, missing or inconsistent
            vocab arrays (token/type/score lengths, non-finite scores), malformed merges, or
            special-token ids outside the vocab.
    """
    if not isinstance(reader, gguf.GGUFReader):
        reader = gguf.GGUFReader(os.fspath(reader))
    kind = _kv(reader, "tokenizer.ggml.model")
    tokens = _kv(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF has no tokenizer.ggml.tokens")
    types = _kv(reader, "tokenizer.ggml.token_type")
    if types is None:  # llama.cpp treats a missing type array as all-normal
        types = [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"GGUF token_type has {len(types)} entries but tokens has {len(tokens)}")

    if kind == "gpt2":
        pre = _kv(reader, "tokenizer.ggml.pre") or "default"
        merges = _kv(reader, "tokenizer.ggml.merges")
        if merges is None:
            raise ValueError("GGUF 'gpt2' tokenizer has no tokenizer.ggml.merges")
        tok = _byte_level_bpe(tokens, merges, pre)
        default_add_bos = pre in _LLAMA3_FAMILY
        default_bos = default_eos = None
    elif kind == "llama":
        tok = _sentencepiece_bpe(reader, tokens, types)
        default_add_bos, default_bos, default_eos = True, 1, 2  # llama.cpp's SPM defaults
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r}")
    _add_special_tokens(tok, tokens, types)

    add_bos = _kv(reader, "tokenizer.ggml.add_bos_token")
    meta = _gguf_meta(
        reader, tokens, types,
        bos=_kv(reader, "tokenizer.ggml.bos_token_id", default_bos),
        eos=_kv(reader, "tokenizer.ggml.eos_token_id", default_eos),
        add_bos=default_add_bos if add_bos is None else bool(add_bos),
    )
    return tok, meta


def _kv(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except UnicodeDecodeError:
        raise ValueError(f"GGUF {key} holds invalid UTF-8") from None


def _first_ids(tokens: list[str]) -> dict[str, int]:
    """Token text -> id. Some vocabularies repeat a string; the first id wins, as in llama.cpp's
    text-to-token lookup, and later duplicates can still be decoded through their own id."""
    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        vocab.setdefault(text, i)
    return vocab


def _parse_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    pairs = []
    for rank, merge in enumerate(merges):
        # Split at the first space after position 0, like llama.cpp (a token may start with one).
        cut = merge.find(" ", 1) if isinstance(merge, str) else -1
        left, right = (merge[:cut], merge[cut + 1:]) if cut > 0 else ("", "")
        if not left or not right:
            raise ValueError(f"malformed GGUF merge #{rank}: {merge!r} (want 'left right')")
        for part in (left, right, left + right):
            if part not in vocab:
                raise ValueError(f"GGUF merge #{rank} {merge!r}: {part!r} is not in the vocab")
        pairs.append((left, right))
    return pairs


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    if pre not in _PRE_REGEXES:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")
    vocab = _first_ids(tokens)
    model = models.BPE(vocab=vocab, merges=_parse_merges(merges, vocab),
                       ignore_merges=pre in _LLAMA3_FAMILY)
    tok = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in _PRE_REGEXES[pre]]
    # The regexes already split the text, so ByteLevel only maps bytes to its alphabet.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(reader: gguf.GGUFReader, tokens: list[str], types: list[int]) -> Tokenizer:
    scores = _kv(reader, "tokenizer.ggml.scores")
    if scores is None:
        raise ValueError(f"GGUF 'llama' tokenizer needs tokenizer.ggml.scores with {len(tokens)} entries")
    return sentencepiece_bpe(tokens, types, scores, unk_id=_kv(reader, "tokenizer.ggml.unknown_token_id", 0),
                             add_space_prefix=bool(_kv(reader, "tokenizer.ggml.add_space_prefix", True)))


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    # GGUF stores control and user-defined tokens as raw text (not in the byte-level
    # alphabet), which is what added tokens match against. Caveat: `tokenizers` still runs
    # them through the decoder, so such a token containing a character of the byte-level
    # alphabet beyond ASCII (e.g. "ö") decodes wrongly; real vocabularies rarely have one.
    control, user = [], []
    for text, kind in zip(tokens, types):
        if text and kind == TOKEN_CONTROL:
            control.append(AddedToken(text, special=True, normalized=False))
        elif text and kind == TOKEN_USER_DEFINED:
            user.append(AddedToken(text, special=False, normalized=False))
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def _gguf_meta(reader: gguf.GGUFReader, tokens: list[str], types: list[int],
               bos: int | None, eos: int | None, add_bos: bool) -> dict:
    def checked(token_id: int | None, what: str) -> int | None:
        if token_id is not None and not 0 <= int(token_id) < len(tokens):
            raise ValueError(f"GGUF {what} id {token_id} is outside the vocab (size {len(tokens)})")
        return None if token_id is None else int(token_id)

    bos, eos = checked(bos, "BOS"), checked(eos, "EOS")
    extra = [checked(_kv(reader, f"tokenizer.ggml.{k}_token_id"), k.upper()) for k in ("eot", "eom")]
    extra += [i for i, (text, kind) in enumerate(zip(tokens, types))
              if kind == TOKEN_CONTROL and text in _EOG_TOKEN_TEXTS]
    return {
        "bos_token_id": bos,
        "eos_token_id": eos,
        "bos_token": None if bos is None else tokens[bos],
        "eos_token": None if eos is None else tokens[eos],
        "add_bos_token": add_bos,
        "chat_template": _kv(reader, "tokenizer.chat_template"),
        "eos_token_ids": _eos_list(eos, extra),
    }
