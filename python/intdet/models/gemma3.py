"""Gemma 3 text (Gemma3ForCausalLM; GGUF "gemma3", e.g. Gemma 3 270M).

The block, as Hugging Face transformers' ``modeling_gemma3.py`` computes it:
RMSNorm -> q/k/v -> per-head q/k RMSNorm -> RoPE -> attention (sliding
window on local layers, full on global ones, each with its own RoPE base) ->
o -> post-attention RMSNorm -> + residual; pre-FFN RMSNorm -> gate/up ->
GeGLU (tanh GELU) -> down -> post-FFN RMSNorm -> + residual. Every RMSNorm
multiplies by ``1 + w``; the embedding is scaled by sqrt(hidden_size).

Integers: the (1 + w) and sqrt(hidden_size) factors are folded into the
stored gammas and the embedding's dyadic scale (convert/quantize.py), the
attention scale query_pre_attn_scalar^-0.5 into attn_score; post-norms,
GeGLU, windows and the local RoPE table are block features (models/block.py,
docs/format.md).

Values a GGUF file does not hold, and where they come from:
- the layer pattern: every 6th layer (il % 6 == 5) is global, the others
  sliding-window. llama.cpp ``llama_model::load_hparams`` LLM_ARCH_GEMMA3
  (``hparams.set_swa_pattern(6)``) and transformers ``Gemma3TextConfig``
  (``sliding_window_pattern`` 6: layer i slides iff (i + 1) % 6 != 0);
- the local layers' RoPE base 10000: llama.cpp
  (``rope_freq_base_train_swa = 10000.0f``) and transformers
  (``rope_local_base_freq`` / ``default_theta["local"]``);
- the attention scale: query_pre_attn_scalar^-0.5 in transformers
  (``Gemma3Attention.scaling``, default 256); llama.cpp uses
  1/sqrt(head_dim) for every size but 27B (n_embd / n_head there), which is
  the same value for head_dim 256 = query_pre_attn_scalar. We use
  1/sqrt(head_dim) for GGUF and refuse the 62-layer (27B) shape, whose
  scalar differs;
- GGUF norm weights already hold 1 + w (llama.cpp's convert_hf_to_gguf.py
  Gemma3Model adds ``norm_shift`` 1.0 to every ``*norm.weight``); Hugging
  Face files hold w, and hf_transform adds the 1;
- Q/K rows: llama.cpp does not permute Gemma's (NEOX-style RoPE, split
  halves like Hugging Face), so no un-permute here.
"""

from __future__ import annotations

import functools
import math

from ..errors import IntdetError
from . import llama
from .block import block

NAME = "gemma3"
HF_CLASSES = ("Gemma3ForCausalLM",)
GGUF_ARCH = "gemma3"

SLIDING_PATTERN = 6  # every 6th layer global (llama.cpp set_swa_pattern(6), transformers sliding_window_pattern)
LOCAL_ROPE_THETA = 10000.0  # llama.cpp rope_freq_base_train_swa, transformers rope_local_base_freq
NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
# Residual stream int32 in Q10, not Q16: Gemma's residual grows past Q16's
# 32767 (Gemma 3 270M on WikiText-2: max |x| 1.0e5 by block 15, float
# reference, scripts/compare_float.py's weights); Q10 holds 2^21 = 2.1e6.
# Branch outputs (o, down) stay Q16 in front of their post-norms.
RESIDUAL_FRAC = 10

# Llama's Hugging Face names, with Gemma's four norms in place of Llama's two
# (post_attention_layernorm is Llama's pre-FFN norm but Gemma's post-attention one).
HF_LAYER = {
    **llama.HF_LAYER,
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm", "post_feedforward_layernorm.weight": "post_ffw_norm",
}
hf_tensor_name = functools.partial(llama.hf_tensor_name, layer=HF_LAYER)


def _rope_theta(cfg: dict, kind: str, legacy: str, default: float, where: str) -> float:
    rp = (cfg.get("rope_parameters") or {}).get(kind) or {}
    rtype = rp.get("rope_type", "default")
    if rtype != "default":
        raise IntdetError(f"{where}: config.json rope_parameters.{kind}.rope_type {rtype!r} is not supported")
    return float(rp.get("rope_theta", cfg.get(legacy, default)))


def hparams_from_hf(cfg: dict, where: str) -> dict:
    """Gemma3TextConfig keys -> sizes (transformers 5 ``rope_parameters`` or
    the older rope_theta / rope_local_base_freq / rope_scaling);
    IntdetError for a feature no engine implements."""
    def bad(key, why):
        raise IntdetError(f"{where}: config.json {key} = {cfg.get(key)!r}: {why}")

    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        bad("hidden_activation", "only gelu_pytorch_tanh is supported")
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(k) is not None:
            bad(k, "logit soft-capping is not supported")
    if cfg.get("use_bidirectional_attention"):
        bad("use_bidirectional_attention", "only causal attention is supported")
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type") or "default") != "default":
        bad("rope_scaling", "RoPE scaling is not supported")
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    D = int(cfg.get("head_dim") or 256)
    L = int(cfg["num_hidden_layers"])
    if nh % nkv:
        raise IntdetError(f"{where}: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    pattern = cfg.get("sliding_window_pattern", SLIDING_PATTERN)
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in ("sliding_attention", "full_attention") for t in types):
        bad("layer_types", f"need {L} entries of sliding_attention / full_attention")
    window = int(cfg.get("sliding_window") or 4096)
    if window < 1:
        bad("sliding_window", "must be a positive integer")
    scalar = float(cfg.get("query_pre_attn_scalar", 256))
    if not (math.isfinite(scalar) and scalar > 0):
        bad("query_pre_attn_scalar", "must be a positive number")
    return dict(
        hidden_size=H,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=L,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        vocab_size=int(cfg["vocab_size"]),
        context_length=int(cfg.get("max_position_embeddings", 131072)),
        rope_theta=_rope_theta(cfg, "full_attention", "rope_theta", 1_000_000.0, where),
        rope_local_theta=_rope_theta(cfg, "sliding_attention", "rope_local_base_freq", LOCAL_ROPE_THETA, where),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        sliding_window=window,
        layer_types=list(types),
        attn_scale=scalar**-0.5,
        embed_scale=math.sqrt(H),
        residual_frac=RESIDUAL_FRAC,
    )


def hparams_from_gguf(need, where: str) -> dict:
    """GGUF gemma3.* keys -> sizes, with the values the file does not hold
    (module docstring)."""
    H = need("embedding_length")
    nh = need("attention.head_count")
    nkv = need("attention.head_count_kv", default=nh)
    if nh <= 0 or nkv <= 0 or nh % nkv:
        raise IntdetError(f"{where}: inconsistent head counts (heads {nh}, kv heads {nkv})")
    D = need("attention.key_length", default=256)
    if need("attention.value_length", default=D) != D:
        raise IntdetError(f"{where}: gemma3.attention.value_length differs from key_length {D}")
    L = need("block_count")
    if L == 62:  # 27B: llama.cpp scales by n_embd / n_head, not head_dim
        raise IntdetError(f"{where}: the 62-layer Gemma 3 (27B) attention scale is not supported")
    scaling = need("rope.scaling.type", str, default="none")
    if scaling != "none":
        raise IntdetError(f"{where}: rope scaling {scaling!r} is not supported")
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if need(k, float, default=0.0) != 0.0:
            raise IntdetError(f"{where}: gemma3.{k}: logit soft-capping is not supported")
    window = need("attention.sliding_window")
    if window < 1:
        raise IntdetError(f"{where}: gemma3.attention.sliding_window {window} must be positive")
    theta = need("rope.freq_base", float, 1_000_000.0)
    return dict(
        hidden_size=H,
        intermediate_size=need("feed_forward_length"),
        num_layers=L,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        context_length=need("context_length"),
        rope_theta=theta,
        rope_local_theta=LOCAL_ROPE_THETA,
        rms_eps=need("attention.layer_norm_rms_epsilon", float),
        sliding_window=window,
        layer_types=["sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention" for i in range(L)],
        attn_scale=1.0 / math.sqrt(D),
        embed_scale=math.sqrt(H),
        residual_frac=RESIDUAL_FRAC,
    )


def gguf_transform(weights: dict, hp: dict) -> None:
    """Nothing to undo: Gemma's Q/K rows are stored in split-half order and
    its norm weights already hold 1 + w."""


def hf_transform(weights: dict, hp: dict) -> None:
    """Hugging Face Gemma3RMSNorm multiplies by (1 + w): store 1 + w, as
    GGUF files do, in place (float32 addition, what transformers computes)."""
    for name in list(weights):
        if name.endswith("norm"):
            weights[name] = (weights[name] + 1.0).astype(weights[name].dtype)


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    out = []
    for t in hp["layer_types"]:
        local = t == "sliding_attention"
        out.append(block(qk_norm=True, bias=bias, activation="gelu_tanh", norms=NORMS,
                         attention_window=hp["sliding_window"] if local else 0,
                         rope="rope_local" if local else "rope"))
    return out
