"""The end-of-generation ids of the meta dict (``eos_token_ids``), one rule for
both readers (gguf.py and hf.py); the meta dict itself is described in the
package docstring (intdet/tokenizer/__init__.py)."""

from __future__ import annotations

# Control tokens that end a turn in common chat formats; llama.cpp treats them as
# end-of-generation even when the GGUF only names one EOS id.
_EOG_TOKEN_TEXTS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>",
    "<end_of_turn>", "<|end|>",
)


def _eos_list(eos: int | None, extra: list[int | None]) -> list[int]:
    """EOS first, then the other end-of-generation ids ascending, without repeats."""
    rest = sorted({int(i) for i in extra if i is not None} - {eos})
    return ([eos] if eos is not None else []) + rest
