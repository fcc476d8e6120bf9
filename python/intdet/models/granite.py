"""Granite (GraniteForCausalLM; GGUF "granite"): Llama's block with four
multipliers, all folded at conversion into integers the engines already
have, so no engine changes:

- ``embedding_multiplier`` m_e (x = m_e * E[token]): hp["embed_scale"], into
  tok_embd's per-row dyadic scale (the lm_head keeps its own scale, so a tied
  head is unaffected);
- ``attention_multiplier`` (replaces 1/sqrt(head_dim)): hp["attn_scale"],
  into attn_score's dyadic scale;
- ``residual_multiplier`` m_r (x += m_r * branch): multiplies attn_output
  and ffn_down (weights and biases) before quantization; per-row absmax
  int8 gives the same codes with the scale times m_r;
- ``logits_scaling`` s (logits / s): divides output_norm's gamma, whose
  int16 form renormalises to [2^13, 2^14) with its own exponent, so only the
  lm_head's dyadic scale changes.

transformers' GraniteForCausalLM (modeling_granite.py) is the reference:
the same four places. llama.cpp writes them as granite.embedding_scale,
granite.attention.scale, granite.residual_scale, granite.logit_scale."""

from __future__ import annotations

import math

import numpy as np

from ..errors import IntdetError
from . import llama

NAME = "granite"
HF_CLASSES = ("GraniteForCausalLM",)
GGUF_ARCH = "granite"

hf_tensor_name = llama.hf_tensor_name
blocks = llama.blocks

# config.json key -> (GGUF key, hp key); hp keys are read by quantize.py / floatref.py
MULTIPLIERS = {
    "embedding_multiplier": ("embedding_scale", "embed_scale"),
    "attention_multiplier": ("attention.scale", "attn_scale"),
    "residual_multiplier": ("residual_scale", "residual_scale"),
    "logits_scaling": ("logit_scale", "logit_scale"),
}


def _put(hp: dict, where: str, key: str, v, shown: str) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise IntdetError(f"{where}: {shown} = {v!r} must be a finite positive number")
    hp[MULTIPLIERS[key][1]] = float(v)


def hparams_from_hf(cfg: dict, where: str) -> dict:
    hp = llama.hparams_from_hf(cfg, where)
    for key in MULTIPLIERS:
        _put(hp, where, key, cfg.get(key), f"config.json {key}")
    return hp


def hparams_from_gguf(need, where: str) -> dict:
    hp = llama.hparams_from_gguf(need, where)
    for key, (gkey, _) in MULTIPLIERS.items():
        v = need(gkey, float, 0.0)
        if v:
            _put(hp, where, key, v, f"GGUF key granite.{gkey}")
    return hp


def _fold(weights: dict, hp: dict) -> None:
    """Residual multiplier into o/down, logits scaling into output_norm (float32
    products, as transformers multiplies in float32)."""
    m_r = np.float32(hp.pop("residual_scale", 1.0))
    s = np.float32(hp.pop("logit_scale", 1.0))
    for i in range(hp["num_layers"]):
        for n in ("attn_output", "attn_output.bias", "ffn_down"):
            k = f"blk.{i}.{n}"
            if weights.get(k) is not None and m_r != 1.0:
                weights[k] = (weights[k] * m_r).astype(np.float32)
    if weights.get("output_norm") is not None and s != 1.0:
        weights["output_norm"] = (weights["output_norm"] / s).astype(np.float32)


def hf_transform(weights: dict, hp: dict) -> None:
    _fold(weights, hp)


def gguf_transform(weights: dict, hp: dict) -> None:
    llama.gguf_transform(weights, hp)
    _fold(weights, hp)
