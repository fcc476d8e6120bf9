"""The per-layer block description of config.json "layers" (format_version
2), as csrc/include/intdet/layout.h BlockDesc reads it."""

from __future__ import annotations

LINEARS_WITH_BIAS = ("attn_q", "attn_k", "attn_v", "attn_output")


PRE_NORMS = ("attn_norm", "ffn_norm")
PRE_POST_NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")  # Gemma
POST_NORMS = ("post_attention_norm", "post_ffw_norm")  # OLMo 2: no pre-norm


def block(qk_norm: bool = False, bias=(), activation: str = "silu", attention_window: int = 0, rope: str = "rope",
          norms=PRE_NORMS, qk_norm_span: str = "head", moe: dict | None = None, attn_softcap: bool = False) -> dict:
    """One decoder block: its RMSNorms in order, q/k RMSNorm (per head, or
    with qk_norm_span "projection" over the whole q and k projections), the
    linears that have a bias, the gated FFN's activation (silu = SwiGLU),
    the attention window (0 = full causal) and the RoPE table it uses
    ("rope", "rope_local", or "none" for a NoPE layer); ``moe`` (mixture of
    experts instead of the dense FFN): {"experts", "experts_per_token",
    "expert_ffn_size", "norm_topk_prob"}; ``attn_softcap``: the attention
    scores soft-capped (Gemma 2; the cap itself is hp["attn_softcap"], stored
    as the layer's attn_softcap tensors)."""
    assert set(bias) <= set(LINEARS_WITH_BIAS), bias
    assert tuple(norms) in (PRE_NORMS, PRE_POST_NORMS, POST_NORMS), norms
    assert rope in ("rope", "rope_local", "none") and qk_norm_span in ("head", "projection")
    out = {"norms": list(norms), "qk_norm": bool(qk_norm), "bias": [b for b in LINEARS_WITH_BIAS if b in bias],
           "activation": activation, "attention_window": int(attention_window), "rope": rope}
    if qk_norm_span != "head":  # only when not the default, so existing files keep their bytes
        assert qk_norm
        out["qk_norm_span"] = qk_norm_span
    if attn_softcap:  # absent without, so existing files keep their bytes
        out["attn_softcap"] = True
    if moe:  # absent for a dense FFN
        assert set(moe) == {"experts", "experts_per_token", "expert_ffn_size", "norm_topk_prob"}, moe
        out["moe"] = {k: (bool(v) if k == "norm_topk_prob" else int(v)) for k, v in moe.items()}
    return out
