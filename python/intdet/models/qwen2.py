"""Qwen2 (Qwen2ForCausalLM): Llama's block with a bias on q, k and v (never
on o)."""

from __future__ import annotations

from . import llama
from .block import block

NAME = "qwen2"
HF_CLASSES = ("Qwen2ForCausalLM",)
GGUF_ARCH = "qwen2"  # llama.cpp's Qwen GGUFs keep HF's split-half RoPE rows: no un-permute

hf_tensor_name = llama.hf_tensor_name
hparams_from_hf = llama.hparams_from_hf
hparams_from_gguf = llama.hparams_from_gguf


def gguf_transform(weights: dict, hp: dict) -> None:
    """Nothing to fix: llama.cpp writes Qwen's q/k rows as Hugging Face has them."""


def blocks(hp: dict) -> list:
    return [block(bias=("attn_q", "attn_k", "attn_v")) for _ in range(hp["num_layers"])]
