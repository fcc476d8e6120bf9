"""Mistral (MistralForCausalLM): Llama's block; ``sliding_window`` (Mistral
7B v0.1: 4096; null from v0.2 on) limits every layer's attention to the last
``sliding_window`` positions, as transformers' sliding-window causal mask.
llama.cpp writes Mistral GGUFs as architecture "llama" (no window), read by
models/llama.py."""

from __future__ import annotations

from ..errors import IntdetError
from . import llama

NAME = "mistral"
HF_CLASSES = ("MistralForCausalLM",)
GGUF_ARCH = None  # llama.cpp's converter writes "llama"

hf_tensor_name = llama.hf_tensor_name


def hparams_from_hf(cfg: dict, where: str) -> dict:
    hp = llama.hparams_from_hf({k: v for k, v in cfg.items() if k != "sliding_window"}, where)
    window = cfg.get("sliding_window")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise IntdetError(f"{where}: config.json sliding_window = {window!r} must be a positive integer")
        hp["attention_window"] = window
    return hp


def blocks(hp: dict) -> list:
    """Llama's blocks with the window (none when it covers the whole context)."""
    w = hp.get("attention_window", 0)
    return [dict(b, attention_window=w if w < hp["context_length"] else 0) for b in llama.blocks(hp)]
