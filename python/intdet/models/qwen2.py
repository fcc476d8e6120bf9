"""Qwen2 (Qwen2ForCausalLM): Llama's block with a bias on q, k and v (never
on o)."""

from __future__ import annotations

from . import llama
from .block import block

NAME = "qwen2"
HF_CLASSES = ("Qwen2ForCausalLM",)
GGUF_ARCH = None  # llama.cpp's qwen2 GGUF is not read yet

hf_tensor_name = llama.hf_tensor_name
hparams_from_hf = llama.hparams_from_hf


def blocks(hp: dict) -> list:
    return [block(bias=("attn_q", "attn_k", "attn_v")) for _ in range(hp["num_layers"])]
