"""Llama (LlamaForCausalLM; GGUF "llama", e.g. SmolLM2): pre-norm decoder,
SwiGLU, full-dimension RoPE, GQA; ``attention_bias`` puts a bias on q, k, v
and o. Also the base that Qwen2 and Qwen3 reuse (same tensor names)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import IntdetError
from . import moe, rope_scaling
from .block import block

NAME = "llama"
HF_CLASSES = ("LlamaForCausalLM",)
GGUF_ARCH = "llama"

HF_TOP = {"model.embed_tokens.weight": "tok_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}
HF_LAYER = {
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
    "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down",
}


def hf_tensor_name(n: str, layer: dict = HF_LAYER):
    """Hugging Face tensor name -> canonical name; None for non-weights;
    IntdetError-free: returns False for a name this family does not know.
    ``layer``: the per-layer name map (a family with other norms, Gemma 3,
    passes its own)."""
    if n in HF_TOP:
        return HF_TOP[n]
    parts = n.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit() and parts[3] in layer:
        return f"blk.{int(parts[2])}.{layer[parts[3]]}"
    if n.endswith("rotary_emb.inv_freq"):
        return None
    return False


def refuse_hf(cfg: dict, where: str):
    """Refuse every config key that would change the arithmetic and that no
    engine implements."""
    def bad(key, why):
        raise IntdetError(f"{where}: config.json {key} = {cfg.get(key)!r}: {why}")

    if cfg.get("hidden_act", "silu") != "silu":
        bad("hidden_act", "only silu is supported")
    if cfg.get("mlp_bias"):
        bad("mlp_bias", "MLP biases are not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        bad("partial_rotary_factor", "partial RoPE is not supported")
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("partial_rotary_factor", 1.0) != 1.0:
        raise IntdetError(f"{where}: config.json rope_parameters.partial_rotary_factor = "
                          f"{rp['partial_rotary_factor']!r}: partial RoPE is not supported")
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        bad("use_sliding_window", "sliding-window attention is not supported")
    if cfg.get("layer_types") and any(t != "full_attention" for t in cfg["layer_types"]):
        bad("layer_types", "only full attention layers are supported")
    # pretraining_tp (tensor-parallel slicing) and attention_dropout do not
    # change inference arithmetic.


def hparams_from_hf(cfg: dict, where: str) -> dict:
    """config.json -> sizes; KeyError/TypeError/ValueError for a missing or
    malformed value, IntdetError for an unsupported feature."""
    refuse_hf(cfg, where)
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    D = int(cfg.get("head_dim") or H // nh)
    if nh % nkv:
        raise IntdetError(f"{where}: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    rs = cfg.get("rope_parameters") or {}
    return dict(
        hidden_size=H,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        vocab_size=int(cfg["vocab_size"]),
        context_length=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=float(cfg.get("rope_theta", rs.get("rope_theta", 10000.0))),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        **_scaling(rope_scaling.from_hf(cfg, where)),
    )


def _scaling(rs):
    return {"rope_scaling": rs} if rs else {}


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(bias=bias, moe=hp.get("moe")) for _ in range(hp["num_layers"])]  # moe: a Mixtral GGUF


def hparams_from_gguf(need, where: str) -> dict:
    """GGUF llama.* keys -> sizes; need(key, conv, default) reads and checks
    one key (convert/sources.py)."""
    H = need("embedding_length")
    nh = need("attention.head_count")
    nkv = need("attention.head_count_kv", default=nh)
    if nh <= 0 or nkv <= 0 or H % nh or nh % nkv:
        raise IntdetError(f"{where}: inconsistent head counts (hidden {H}, heads {nh}, kv heads {nkv})")
    D = need("attention.key_length", default=H // nh)
    rot = need("rope.dimension_count", default=D)
    if rot != D:
        raise IntdetError(f"{where}: partial rotary embedding (rope.dimension_count {rot} != head_dim {D}) is not supported")
    ctx = need("context_length")
    experts = moe.from_gguf(need, where, "llama", norm=True)  # Mixtral: llama.cpp renormalises the top-k
    scaling = rope_scaling.from_gguf(need, where, ctx)
    theta = need("rope.freq_base", float, 10000.0)
    if not math.isfinite(theta):
        raise IntdetError(f"{where}: rope theta {theta!r} must be finite")
    return dict(
        hidden_size=H,
        intermediate_size=need("feed_forward_length"),
        num_layers=need("block_count"),
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        context_length=ctx,
        rope_theta=theta,
        rms_eps=need("attention.layer_norm_rms_epsilon", float),
        **_scaling(scaling),
        **({"moe": experts} if experts else {}),
    )


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp convert_hf_to_gguf.py's ``permute`` of Q/K rows
    (interleaved pairs -> Hugging Face split halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_transform(weights: dict, hp: dict) -> None:
    """Un-permute Q/K rows to the split-half RoPE pairing, in place (only
    tensors of the right row count: the completeness check reports others)."""
    D = hp["head_dim"]
    for i in range(hp["num_layers"]):
        for nm, heads in (("attn_q", hp["num_heads"]), ("attn_k", hp["num_kv_heads"])):
            w = weights.get(f"blk.{i}.{nm}")
            if w is not None and w.shape[0] == heads * D and D % 2 == 0:
                # as a row index, so a lazily read tensor stays lazy (convert/lazy.py)
                weights[f"blk.{i}.{nm}"] = w[unpermute_rope_rows(np.arange(w.shape[0]), heads)]
