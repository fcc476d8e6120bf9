"""Gemma 2 (Gemma2ForCausalLM; GGUF "gemma2").

Gemma 3's block (models/gemma3.py: four RMSNorms of 1 + w, GeGLU, the
embedding scaled by sqrt(hidden_size), query_pre_attn_scalar^-0.5) without
its q/k RMSNorm and second RoPE base, plus soft-capping (Gemma Team 2024,
"Gemma 2: Improving Open Language Models at a Practical Size", sec. 2.2):
the attention scores become c_a tanh(s / c_a) before the softmax
(attn_logit_softcapping, 50) and the logits c_f tanh(l / c_f)
(final_logit_softcapping, 30), as transformers' modeling_gemma2.py computes
them. In integers: intmath.softcap on the Q16 log2-domain scores of every
layer (block key attn_softcap, tensors blk.N.attn_softcap.*) and on the Q16
logits (config final_logit_softcap, tensors output_softcap.*).

Layers alternate: even layers slide (window sliding_window), odd layers are
global: transformers' layer_types (``sliding_attention`` iff (i + 1) % 2)
and llama.cpp ``LLM_ARCH_GEMMA2`` (``set_swa_pattern(2)``).

Values a GGUF file does not hold, and where they come from:
- the layer pattern above; the RoPE base: llama.cpp's default 10000 (its
  converter writes no gemma2.rope.freq_base; transformers' default too);
- the attention scale: llama.cpp uses 1/sqrt(head_dim), except for the
  46-layer 27B, where it uses 1/sqrt(n_embd / n_head) (the 27B's
  query_pre_attn_scalar 144); we do the same;
- norm weights hold 1 + w (llama.cpp's Gemma2Model.modify_tensors adds 1);
  Hugging Face files hold w and hf_transform adds the 1.
"""

from __future__ import annotations

import math

from ..errors import IntdetError
from . import gemma3
from .block import PRE_POST_NORMS, block

NAME = "gemma2"
HF_CLASSES = ("Gemma2ForCausalLM",)
GGUF_ARCH = "gemma2"

SLIDING_PATTERN = 2  # llama.cpp set_swa_pattern(2); transformers: layer i slides iff (i + 1) % 2
ROPE_THETA = 10000.0
RESIDUAL_FRAC = gemma3.RESIDUAL_FRAC  # Gemma's residual outgrows Q16 (models/gemma3.py)
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0  # transformers Gemma2Config defaults (a key absent from config.json)
MAX_SOFTCAP = 20000.0  # c * log2(e) * 2^16 (the capped scores, Q16 log2 units) stays below 2^31
LAYERS_27B = 46  # llama.cpp LLM_TYPE_27B: attention scale 1/sqrt(n_embd / n_head)

HF_LAYER = gemma3.HF_LAYER
hf_tensor_name = gemma3.hf_tensor_name
hf_transform = gemma3.hf_transform
gguf_transform = gemma3.gguf_transform


def _caps(attn, final, where: str, key: str) -> dict:
    out = {}
    for name, v, dest in (("attn_logit_softcapping", attn, "attn_softcap"),
                          ("final_logit_softcapping", final, "final_softcap")):
        if v is None or v == 0:
            continue  # none: plain scores / logits
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise IntdetError(f"{where}: {key}{name} = {v!r} must be a positive number")
        if not 2.0**-16 <= v <= MAX_SOFTCAP:
            raise IntdetError(f"{where}: {key}{name} = {v!r} is outside [2^-16, {MAX_SOFTCAP}] (the int32 range of "
                              "the capped Q16 scores)")
        out[dest] = float(v)
    return out


def hparams_from_hf(cfg: dict, where: str) -> dict:
    """Gemma2Config keys -> sizes; IntdetError for what no engine implements."""
    def bad(key, why):
        raise IntdetError(f"{where}: config.json {key} = {cfg.get(key)!r}: {why}")

    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        bad("hidden_activation", "only gelu_pytorch_tanh is supported")
    if cfg.get("use_bidirectional_attention"):
        bad("use_bidirectional_attention", "only causal attention is supported")
    rp = cfg.get("rope_parameters") or {}
    if (rp.get("rope_type") or "default") != "default":
        bad("rope_parameters", "RoPE scaling is not supported")
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type") or "default") != "default":
        bad("rope_scaling", "RoPE scaling is not supported")
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    L = int(cfg["num_hidden_layers"])
    if nh % nkv:
        raise IntdetError(f"{where}: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention" for i in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in ("sliding_attention", "full_attention") for t in types):
        bad("layer_types", f"need {L} entries of sliding_attention / full_attention")
    window = cfg.get("sliding_window") or 4096
    if not isinstance(window, int) or window < 1:
        bad("sliding_window", "must be a positive integer")
    scalar = cfg.get("query_pre_attn_scalar", 256)
    if not (isinstance(scalar, (int, float)) and math.isfinite(scalar) and scalar > 0):
        bad("query_pre_attn_scalar", "must be a positive number")
    return dict(
        hidden_size=H,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=L,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=int(cfg.get("head_dim") or 256),
        vocab_size=int(cfg["vocab_size"]),
        context_length=int(cfg.get("max_position_embeddings", 8192)),
        rope_theta=float(rp.get("rope_theta", cfg.get("rope_theta", ROPE_THETA))),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        sliding_window=window,
        layer_types=list(types),
        attn_scale=float(scalar) ** -0.5,
        embed_scale=math.sqrt(H),
        residual_frac=RESIDUAL_FRAC,
        # absent: Gemma2Config's defaults; null: no cap
        **_caps(cfg.get("attn_logit_softcapping", ATTN_SOFTCAP), cfg.get("final_logit_softcapping", FINAL_SOFTCAP),
                where, "config.json "),
    )


def hparams_from_gguf(need, where: str) -> dict:
    """GGUF gemma2.* keys -> sizes, with the values the file does not hold
    (module docstring)."""
    H = need("embedding_length")
    nh = need("attention.head_count")
    nkv = need("attention.head_count_kv", default=nh)
    if nh <= 0 or nkv <= 0 or nh % nkv:
        raise IntdetError(f"{where}: inconsistent head counts (heads {nh}, kv heads {nkv})")
    D = need("attention.key_length", default=256)
    if need("attention.value_length", default=D) != D:
        raise IntdetError(f"{where}: gemma2.attention.value_length differs from key_length {D}")
    L = need("block_count")
    scaling = need("rope.scaling.type", str, default="none")
    if scaling != "none":
        raise IntdetError(f"{where}: rope scaling {scaling!r} is not supported")
    window = need("attention.sliding_window")
    if window < 1:
        raise IntdetError(f"{where}: gemma2.attention.sliding_window {window} must be positive")
    return dict(
        hidden_size=H,
        intermediate_size=need("feed_forward_length"),
        num_layers=L,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        context_length=need("context_length"),
        rope_theta=need("rope.freq_base", float, ROPE_THETA),
        rms_eps=need("attention.layer_norm_rms_epsilon", float),
        sliding_window=window,
        layer_types=["sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention" for i in range(L)],
        attn_scale=1.0 / math.sqrt(H / nh if L == LAYERS_27B else D),
        embed_scale=math.sqrt(H),
        residual_frac=RESIDUAL_FRAC,
        **_caps(need("attn_logit_softcapping", float, default=0.0), need("final_logit_softcapping", float, default=0.0),
                where, "gemma2."),
    )


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    cap = "attn_softcap" in hp
    return [block(bias=bias, activation="gelu_tanh", norms=PRE_POST_NORMS, attn_softcap=cap,
                  attention_window=hp["sliding_window"] if t == "sliding_attention" else 0)
            for t in hp["layer_types"]]
