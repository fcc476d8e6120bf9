"""OLMo 2 (Olmo2ForCausalLM; GGUF "olmo2"): no pre-norms; each branch's
output is RMSNorm-ed before its residual add (post_attention_layernorm,
post_feedforward_layernorm: block norms ["post_attention_norm",
"post_ffw_norm"]), so q/k/v and gate/up read the residual stream itself;
q and k get an RMSNorm over the whole projection (nh*D and nkv*D features,
before the split into heads and RoPE: qk_norm_span "projection"), as
transformers' modeling_olmo2.py. SwiGLU, split-half RoPE, GQA otherwise.

llama.cpp's converter writes it without a Q/K permute (TextModel), with the
tensor names blk.N.post_attention_norm / post_ffw_norm / attn_q_norm /
attn_k_norm. OLMo 3's sliding-window layers (olmo2.attention.sliding_window
in GGUF, Olmo3ForCausalLM in HF) are refused."""

from __future__ import annotations

from ..errors import IntdetError
from . import llama
from .block import POST_NORMS, block

NAME = "olmo2"
HF_CLASSES = ("Olmo2ForCausalLM",)
GGUF_ARCH = "olmo2"

HF_LAYER = {**llama.HF_LAYER, "post_attention_layernorm.weight": "post_attention_norm",
            "post_feedforward_layernorm.weight": "post_ffw_norm"}
del HF_LAYER["input_layernorm.weight"]


def hf_tensor_name(n: str):
    return llama.hf_tensor_name(n, HF_LAYER)


def hparams_from_hf(cfg: dict, where: str) -> dict:
    if cfg.get("sliding_window"):
        raise IntdetError(f"{where}: config.json sliding_window = {cfg['sliding_window']!r}: OLMo 2 has none "
                          "(OLMo 3's sliding layers are not supported)")
    return llama.hparams_from_hf(cfg, where)


def hparams_from_gguf(need, where: str) -> dict:
    if need("attention.sliding_window", default=0):
        raise IntdetError(f"{where}: GGUF key olmo2.attention.sliding_window: OLMo 3's sliding-window layers "
                          "are not supported")
    return llama.hparams_from_gguf(need, where)


def gguf_transform(weights: dict, hp: dict) -> None:
    """Nothing to fix: llama.cpp keeps OLMo 2's q/k rows as Hugging Face has them."""


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(qk_norm=True, qk_norm_span="projection", norms=POST_NORMS, bias=bias)
            for _ in range(hp["num_layers"])]
