"""SmolLM3 (SmolLM3ForCausalLM; GGUF "smollm3"): Llama's block, except that
some layers use no positional encoding at all (NoPE): config.json
``no_rope_layers`` holds 1 for a layer with RoPE and 0 for one without
(by default every 4th layer: ``no_rope_layer_interval`` 4), as transformers'
modeling_smollm3.py. Such a layer's block has rope "none".

llama.cpp's GGUF has no key for it: llama.cpp itself fixes every 4th layer
((il + 1) % 4 == 0) as NoPE for this architecture, and so does this reader.
Its converter is Llama's (Q/K rows permuted; un-permuted here)."""

from __future__ import annotations

from ..errors import IntdetError
from . import llama
from .block import block

NAME = "smollm3"
HF_CLASSES = ("SmolLM3ForCausalLM",)
GGUF_ARCH = "smollm3"
GGUF_NOPE_INTERVAL = 4  # llama.cpp: hparams.n_no_rope_layer_step for LLM_ARCH_SMOLLM3

hf_tensor_name = llama.hf_tensor_name
gguf_transform = llama.gguf_transform


def hparams_from_hf(cfg: dict, where: str) -> dict:
    hp = llama.hparams_from_hf(cfg, where)
    L = hp["num_layers"]
    interval = cfg.get("no_rope_layer_interval", GGUF_NOPE_INTERVAL)
    flags = cfg.get("no_rope_layers")
    if flags is None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise IntdetError(f"{where}: config.json no_rope_layer_interval = {interval!r} must be a positive integer")
        flags = [int((i + 1) % interval != 0) for i in range(L)]
    if not isinstance(flags, list) or len(flags) != L or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise IntdetError(f"{where}: config.json no_rope_layers must list {L} entries of 1 (RoPE) or 0 (NoPE)")
    hp["rope_layers"] = [bool(f) for f in flags]
    return hp


def hparams_from_gguf(need, where: str) -> dict:
    hp = llama.hparams_from_gguf(need, where)
    hp["rope_layers"] = [(i + 1) % GGUF_NOPE_INTERVAL != 0 for i in range(hp["num_layers"])]
    return hp


def blocks(hp: dict) -> list:
    bias = ("attn_q", "attn_k", "attn_v", "attn_output") if hp.get("attention_bias") else ()
    return [block(bias=bias, rope="rope" if r else "none") for r in hp["rope_layers"]]
