"""The per-layer block description of config.json "layers" (format_version
2), as csrc/include/intdet/layout.h BlockDesc reads it."""

from __future__ import annotations

LINEARS_WITH_BIAS = ("attn_q", "attn_k", "attn_v", "attn_output")


def block(qk_norm: bool = False, bias=(), activation: str = "silu", attention_window: int = 0, rope: str = "rope",
          norms=("attn_norm", "ffn_norm")) -> dict:
    """One decoder block: its RMSNorms in order, per-head q/k RMSNorm, the
    linears that have a bias, the gated FFN's activation (silu = SwiGLU),
    the attention window (0 = full causal) and the RoPE table it uses."""
    assert set(bias) <= set(LINEARS_WITH_BIAS), bias
    return {"norms": list(norms), "qk_norm": bool(qk_norm), "bias": [b for b in LINEARS_WITH_BIAS if b in bias],
            "activation": activation, "attention_window": int(attention_window), "rope": rope}
