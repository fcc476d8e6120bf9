"""Qwen3 (Qwen3ForCausalLM): Llama's block with per-head RMSNorm of q and k
before RoPE; ``attention_bias`` puts a bias on q, k, v and o."""

from __future__ import annotations

from . import llama
from .block import block

NAME = "qwen3"
HF_CLASSES = ("Qwen3ForCausalLM",)
GGUF_ARCH = "qwen3"  # llama.cpp's Qwen GGUFs keep HF's split-half RoPE rows: no un-permute

hf_tensor_name = llama.hf_tensor_name
hparams_from_hf = llama.hparams_from_hf
hparams_from_gguf = llama.hparams_from_gguf


def gguf_transform(weights: dict, hp: dict) -> None:
    """Nothing to fix: llama.cpp writes Qwen's q/k rows as Hugging Face has them."""


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(qk_norm=True, bias=bias) for _ in range(hp["num_layers"])]
