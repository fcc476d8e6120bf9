"""Mixtral (MixtralForCausalLM): Mistral's block with a mixture-of-experts
FFN (models/moe.py): ``num_local_experts`` SwiGLU experts (w1 gate, w3 up,
w2 down) of ``intermediate_size``, the ``num_experts_per_tok`` best by a
softmax router, always renormalised, as transformers' MixtralSparseMoeBlock.
llama.cpp writes Mixtral GGUFs as architecture "llama" with llama.expert_*
keys and blk.N.ffn_{gate,up,down}_exps tensors: read by models/llama.py."""

from __future__ import annotations

from . import mistral, moe

NAME = "mixtral"
HF_CLASSES = ("MixtralForCausalLM",)
GGUF_ARCH = None  # llama.cpp's converter writes "llama"


def hf_tensor_name(n: str):
    return moe.hf_tensor_name(n, mistral.hf_tensor_name)


def hparams_from_hf(cfg: dict, where: str) -> dict:
    hp = mistral.hparams_from_hf({k: v for k, v in cfg.items() if k != "router_jitter_noise"}, where)
    hp["moe"] = moe.moe_config(cfg.get("num_local_experts"), cfg.get("num_experts_per_tok"),
                               hp["intermediate_size"], True, where, "config.json")
    return hp


def hf_transform(weights: dict, hp: dict) -> None:
    moe.stack_experts(weights, hp, "checkpoint")


def blocks(hp: dict) -> list:
    return [dict(b, moe=hp["moe"]) for b in mistral.blocks(hp)]
