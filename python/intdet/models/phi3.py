"""Phi-3 (Phi3ForCausalLM; GGUF "phi3"): Llama's block with q, k and v in
one fused projection (``qkv_proj``: rows q, then k, then v) and gate and up
in one (``gate_up_proj``: rows gate, then up; transformers' Phi3MLP chunks
it in that order). Both are split at conversion, so the engines see Llama's
tensors. ``sliding_window`` limits every layer's attention as in Mistral
(Phi-3-mini-4k: 2047); llama.cpp writes it as phi3.attention.sliding_window
(0: none, Phi-4). LongRoPE (the 128k checkpoints' two factor lists, GGUF
rope_factors_long / rope_factors_short) is refused by name; so is partial
rotary (Phi-4-mini's 0.75), which intdet's full-width RoPE tables lack.

llama.cpp's converter keeps Hugging Face's split-half RoPE rows for phi3 (no
permute) and names the fused tensors blk.N.attn_qkv and blk.N.ffn_up (2F rows)."""

from __future__ import annotations

from ..errors import IntdetError
from . import llama, mistral

NAME = "phi3"
HF_CLASSES = ("Phi3ForCausalLM",)
GGUF_ARCH = "phi3"

HF_LAYER = {**llama.HF_LAYER, "self_attn.qkv_proj.weight": "attn_qkv", "mlp.gate_up_proj.weight": "ffn_gate_up"}


def hf_tensor_name(n: str):
    return llama.hf_tensor_name(n, HF_LAYER)


def hparams_from_hf(cfg: dict, where: str) -> dict:
    return mistral.hparams_from_hf(cfg, where)


def hparams_from_gguf(need, where: str) -> dict:
    hp = llama.hparams_from_gguf(need, where)
    window = need("attention.sliding_window", default=0)
    if window < 0:
        raise IntdetError(f"{where}: GGUF key phi3.attention.sliding_window = {window} must not be negative")
    if window:
        hp["attention_window"] = window
    return hp


blocks = mistral.blocks


def _split(weights: dict, hp: dict, fused_up: str) -> None:
    """attn_qkv -> attn_q, attn_k, attn_v; the fused gate/up -> ffn_gate, ffn_up
    (only tensors of the expected row count: check_complete reports the rest,
    and a GGUF's rope_factors_long / _short as unexpected tensors)."""
    qd, kvd, F = hp["num_heads"] * hp["head_dim"], hp["num_kv_heads"] * hp["head_dim"], hp["intermediate_size"]
    for i in range(hp["num_layers"]):
        p = f"blk.{i}."
        w = weights.get(p + "attn_qkv")
        if w is not None and w.shape[0] == qd + 2 * kvd:
            del weights[p + "attn_qkv"]
            weights[p + "attn_q"], weights[p + "attn_k"], weights[p + "attn_v"] = w[:qd], w[qd:qd + kvd], w[qd + kvd:]
        w = weights.get(p + fused_up)
        if w is not None and w.shape[0] == 2 * F:
            del weights[p + fused_up]
            weights[p + "ffn_gate"], weights[p + "ffn_up"] = w[:F], w[F:]


def hf_transform(weights: dict, hp: dict) -> None:
    _split(weights, hp, "ffn_gate_up")


def gguf_transform(weights: dict, hp: dict) -> None:
    """No un-permute (llama.cpp keeps Phi-3's rows); split the fused tensors."""
    _split(weights, hp, "ffn_up")
