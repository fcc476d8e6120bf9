"""Qwen3-MoE (Qwen3MoeForCausalLM; GGUF "qwen3moe", e.g. Qwen3-30B-A3B):
Qwen3's attention (per-head q/k RMSNorm) with a mixture-of-experts FFN
(models/moe.py): ``num_experts`` (transformers 5 writes
``num_local_experts``) SwiGLU experts of ``moe_intermediate_size``, the
``num_experts_per_tok`` best by a softmax router, renormalised when
``norm_topk_prob``. Layers in ``mlp_only_layers`` or off the
``decoder_sparse_step`` keep a dense FFN of ``intermediate_size``, as
transformers' Qwen3MoeDecoderLayer decides.

GGUF: llama.cpp's qwen3moe graph always renormalises the top-k weights (it
has no key for norm_topk_prob; every Qwen3-MoE checkpoint sets it) and makes
every layer MoE; its rows are Hugging Face's (no un-permute)."""

from __future__ import annotations

from ..errors import IntdetError
from . import llama, moe
from .block import block

NAME = "qwen3_moe"
HF_CLASSES = ("Qwen3MoeForCausalLM",)
GGUF_ARCH = "qwen3moe"


def hf_tensor_name(n: str):
    return moe.hf_tensor_name(n, llama.hf_tensor_name)


def hparams_from_hf(cfg: dict, where: str) -> dict:
    hp = llama.hparams_from_hf(cfg, where)
    E = cfg.get("num_experts") or cfg.get("num_local_experts")
    hp["moe"] = moe.moe_config(E, cfg.get("num_experts_per_tok"), cfg.get("moe_intermediate_size"),
                               cfg.get("norm_topk_prob", False), where, "config.json")
    step = cfg.get("decoder_sparse_step", 1)
    only = cfg.get("mlp_only_layers") or []
    if isinstance(step, bool) or not isinstance(step, int) or step < 1 or not isinstance(only, list):
        raise IntdetError(f"{where}: config.json decoder_sparse_step / mlp_only_layers are malformed")
    hp["moe_layers"] = [i not in only and (i + 1) % step == 0 for i in range(hp["num_layers"])]
    return hp


def hparams_from_gguf(need, where: str) -> dict:
    hp = llama.hparams_from_gguf(need, where)
    m = moe.from_gguf(need, where, GGUF_ARCH, norm=True)
    if m is None:
        raise IntdetError(f"{where}: missing GGUF key qwen3moe.expert_count")
    hp["moe"], hp["moe_layers"] = m, [True] * hp["num_layers"]
    return hp


def hf_transform(weights: dict, hp: dict) -> None:
    moe.stack_experts(weights, hp, "checkpoint")


def gguf_transform(weights: dict, hp: dict) -> None:
    """Nothing to fix: llama.cpp writes Qwen's q/k rows as Hugging Face has them."""


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(qk_norm=True, bias=bias, moe=hp["moe"] if m else None) for m in hp["moe_layers"]]
