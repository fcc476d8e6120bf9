"""SentencePiece (BPE with scores and byte fallback) tokenizers rebuilt from GGUF fields.

A GGUF with ``tokenizer.ggml.model = "llama"`` (Llama 2, Gemma 3, ...) stores
SentencePiece's pieces (``tokenizer.ggml.tokens``), their scores
(``tokenizer.ggml.scores``, float32) and token types, but no merge list.
llama.cpp tokenizes such a vocabulary (src/llama-vocab.cpp, llm_tokenizer_spm
and tokenize_impl) as follows, and :func:`sentencepiece_bpe` builds a
``tokenizers.Tokenizer`` that does the same:

1. Split the text at user-defined tokens (always) and control tokens (only
   when special tokens are parsed), longest token first; those become their
   own ids. (Here: added tokens; :func:`intdet.tokenizer.encode` switches the
   control tokens on and off.)
2. Each remaining text run gets a leading space if ``add_space_prefix`` is set
   and the run starts the text or follows a special token; spaces become
   U+2581. (Gemma 3: ``add_space_prefix = false``.)
3. Start from the run's UTF-8 characters and repeatedly merge the adjacent
   pair whose concatenation is a vocabulary piece with the highest score
   (ties: leftmost pair). A character that is not a piece becomes its UTF-8
   bytes as ``<0xNN>`` byte tokens (byte fallback).

Step 3 as a ranked merge list for ``tokenizers.models.BPE`` is every split
``(left, right)`` of every mergeable piece into two pieces, best score first
(as transformers' SentencePieceExtractor does for Hugging Face's Gemma and
Llama tokenizers). Where this differs from llama.cpp, on purpose or not:

* Control pieces (``<bos>``, ``<start_of_turn>``, ...) and byte pieces
  (``<0x41>``) are never merge results: llama.cpp looks merged text up among
  all pieces, so plain text spelling such a token could become that token if
  the vocabulary holds a chain of pieces up to it. Here plain text never
  yields a control id or a byte token (user input cannot inject control
  tokens, and ``decode`` gives the text back). Gemma 3 has no such chain (no
  control or byte piece splits into two pieces), so the ids agree.
* A character that is not a piece cannot be merged with its neighbours
  (``tokenizers`` turns it into byte tokens before merging); llama.cpp can
  merge it if the concatenation is a piece. Every character of every Gemma 3
  piece is itself a piece, so this never arises there.
* Equal scores: ``tokenizers`` takes the lower rank, then the leftmost pair;
  llama.cpp the leftmost pair. The same piece reached by two different splits
  at two places in one run can therefore merge in another order. Gemma 3's
  normal pieces have distinct scores.

scripts/check_tokenizer_llamacpp.py compares the ids with llama.cpp's on
WikiText-2 and crafted text.
"""

from __future__ import annotations

import math

from tokenizers import Tokenizer, decoders, models, normalizers

__all__ = ["SPM_SPACE", "sentencepiece_bpe", "spm_merges"]

# GGUF token types (llama.cpp's llama_token_type); the same numbers as in gguf.py.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Pieces that step 3 may produce (see the module docstring for control and byte pieces).
MERGEABLE_TYPES = frozenset((TOKEN_NORMAL, TOKEN_USER_DEFINED))

SPM_SPACE = "\u2581"  # SentencePiece's visible space


def sentencepiece_bpe(tokens: list[str], types: list[int], scores: list[float], unk_id: int | None,
                      add_space_prefix: bool) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` for a SentencePiece vocabulary, llama.cpp's way (module docstring).

    Args:
        tokens: the pieces, ``tokenizer.ggml.tokens`` (id = index).
        types: GGUF token types, one per piece.
        scores: ``tokenizer.ggml.scores``, one finite float per piece; higher merges first.
        unk_id: ``tokenizer.ggml.unknown_token_id``; used as the unknown token only if its type is
            UNKNOWN (2) (byte fallback covers every character when all 256 byte tokens exist).
        add_space_prefix: ``tokenizer.ggml.add_space_prefix`` (llama.cpp's default is true).

    Returns:
        The tokenizer without added tokens (the caller adds control and user-defined tokens) and
        without a post-processor (BOS is :func:`intdet.tokenizer.encode`'s job).

    Raises:
        ValueError: ``scores`` has the wrong length or a non-finite value.
    """
    if len(scores) != len(tokens):
        raise ValueError(f"GGUF tokenizer.ggml.scores has {len(scores)} entries but tokens has {len(tokens)}")
    bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
    if bad is not None:
        raise ValueError(f"GGUF tokenizer.ggml.scores[{bad}] is {scores[bad]} (want a finite number)")
    vocab = _piece_ids(tokens)
    unk = (tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) and types[unk_id] == TOKEN_UNKNOWN
           else None)
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, types, scores, vocab),
                       unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(model)
    # llama.cpp prefixes a space to every text run that starts the prompt or follows a
    # special token, even one that already starts with a space; the normalizer runs once
    # per segment between added tokens, so Prepend does the same. (Metaspace's prepend
    # skips text that already starts with a space.)
    steps = [normalizers.Prepend(SPM_SPACE)] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPM_SPACE)])
    steps = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:  # undo the prefixed space
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def _piece_ids(tokens: list[str]) -> dict[str, int]:
    """Piece text -> id. A text repeated in the vocabulary maps to its last id, as llama.cpp's
    token_to_id map (filled in id order, later ids overwrite) looks merged text up."""
    return {text: i for i, text in enumerate(tokens)}


def spm_merges(tokens: list[str], types: list[int], scores: list[float],
               vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The ranked merge list equivalent to "merge the best-scoring adjacent pair".

    Every ``(left, right)`` split of every mergeable piece (type NORMAL or USER_DEFINED, as
    ``vocab`` maps its text) whose halves can both be symbols (a mergeable piece, or a single
    character that is a piece of any type), best piece score first; ties by piece id, then
    the split point, so the list depends only on the vocabulary.

    Returns:
        ``list[tuple[str, str]]`` of piece texts, for ``tokenizers.models.BPE(merges=...)``.
    """
    mergeable = [(text, i) for text, i in vocab.items() if types[i] in MERGEABLE_TYPES and len(text) > 1]
    symbols = {text for text, i in vocab.items() if types[i] in MERGEABLE_TYPES or len(text) == 1}
    ranked = [(-scores[piece], piece, cut) for text, piece in mergeable for cut in range(1, len(text))
              if text[:cut] in symbols and text[cut:] in symbols]
    ranked.sort()
    return [(tokens[piece][:cut], tokens[piece][cut:]) for _, piece, cut in ranked]
