"""Qwen3 (Qwen3ForCausalLM): Llama's block with per-head RMSNorm of q and k
before RoPE; ``attention_bias`` puts a bias on q, k, v and o."""

from __future__ import annotations

from . import llama
from .block import block

NAME = "qwen3"
HF_CLASSES = ("Qwen3ForCausalLM",)
GGUF_ARCH = None  # llama.cpp's qwen3 GGUF is not read yet

hf_tensor_name = llama.hf_tensor_name
hparams_from_hf = llama.hparams_from_hf


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(qk_norm=True, bias=bias) for _ in range(hp["num_layers"])]
