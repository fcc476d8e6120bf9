"""Mixture-of-experts pieces shared by the MoE families (qwen3_moe.py,
mixtral.py; Mixtral GGUFs through llama.py): Hugging Face expert names,
stacking per-expert matrices into the [E, N, K] tensors intdet stores, and
the GGUF expert keys.

The arithmetic (csrc/model/forward.cpp moe_ffn, python/intdet/ref/model.py
_moe): the router is an int8 linear straight to Q16 log2 units; the
``experts_per_token`` largest outputs are chosen, ties to the lowest expert
id (torch.topk's order on equal values is unspecified; the float model here
uses the same rule); their weights are the integer softmax over those k
(``norm_topk_prob``: softmax, top-k and renormalising, as Mixtral and
Qwen3-MoE do, is the softmax of the k chosen logits) or the full softmax's
entries; the output is round_shift(sum_j w_j * down_j, 16) in exact int64."""

from __future__ import annotations

import re


from ..errors import IntdetError

# HF per-expert names: (regex on the part after "model.layers.N.", canonical matrix, expert group)
EXPERT_PATTERNS = (
    (re.compile(r"mlp\.experts\.(\d+)\.gate_proj\.weight"), "ffn_gate_exps"),  # Qwen3-MoE, OLMoE
    (re.compile(r"mlp\.experts\.(\d+)\.up_proj\.weight"), "ffn_up_exps"),
    (re.compile(r"mlp\.experts\.(\d+)\.down_proj\.weight"), "ffn_down_exps"),
    (re.compile(r"block_sparse_moe\.experts\.(\d+)\.w1\.weight"), "ffn_gate_exps"),  # Mixtral: w1 gate, w3 up, w2 down
    (re.compile(r"block_sparse_moe\.experts\.(\d+)\.w3\.weight"), "ffn_up_exps"),
    (re.compile(r"block_sparse_moe\.experts\.(\d+)\.w2\.weight"), "ffn_down_exps"),
)
ROUTERS = {"mlp.gate.weight": "ffn_gate_inp", "block_sparse_moe.gate.weight": "ffn_gate_inp"}
# transformers 5's in-memory form, in case a checkpoint was saved that way: [E, 2F, H] and [E, H, F]
FUSED = {"mlp.experts.gate_up_proj": "ffn_gate_up_exps", "mlp.experts.down_proj": "ffn_down_exps"}


def hf_tensor_name(n: str, dense):
    """An expert or router name -> canonical (per-expert matrices as
    ``blk.L.ffn_gate_exps.E``, stacked by stack_experts); else ``dense(n)``."""
    parts = n.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        layer, rest = int(parts[2]), parts[3]
        if rest in ROUTERS:
            return f"blk.{layer}.{ROUTERS[rest]}"
        if rest in FUSED:
            return f"blk.{layer}.{FUSED[rest]}"
        for rx, canon in EXPERT_PATTERNS:
            m = rx.fullmatch(rest)
            if m:
                return f"blk.{layer}.{canon}.{int(m.group(1))}"
    return dense(n)


def stack_experts(weights: dict, hp: dict, where: str) -> None:
    """Per-expert matrices -> one [E, N, K] float32 tensor per layer and kind,
    in place; a missing or surplus expert is an IntdetError naming it."""
    from ..convert.lazy import stack

    moe = hp.get("moe")
    if not moe:
        return
    E = moe["experts"]
    for i in range(hp["num_layers"]):
        p = f"blk.{i}."
        fused = weights.pop(p + "ffn_gate_up_exps", None)
        if fused is not None:  # [E, 2F, H]: gate rows first (transformers chunks it so)
            F = fused.shape[1] // 2
            weights[p + "ffn_gate_exps"], weights[p + "ffn_up_exps"] = fused[:, :F], fused[:, F:]
        for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            parts = {int(k.rsplit(".", 1)[1]): k for k in weights if k.startswith(p + kind + ".")}
            if not parts:
                continue
            if sorted(parts) != list(range(E)):
                missing = sorted(set(range(E)) - set(parts))
                raise IntdetError(f"{where}: layer {i} {kind}: expert {missing[0] if missing else max(parts)} "
                                  f"is {'missing' if missing else 'beyond num_experts ' + str(E)}")
            weights[p + kind] = stack([weights.pop(parts[e]) for e in range(E)])  # lazy: rows read on demand


def moe_config(E, k, F, norm, where: str, shown: str) -> dict:
    """The block's "moe" object, checked."""
    for name, v in (("experts", E), ("experts per token", k), ("expert intermediate size", F)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise IntdetError(f"{where}: {shown} {name} = {v!r} must be a positive integer")
    if k > E:
        raise IntdetError(f"{where}: {shown} experts per token {k} exceeds the {E} experts")
    if E > 4096:
        raise IntdetError(f"{where}: {shown} {E} experts: at most 4096 are supported")
    return {"experts": E, "experts_per_token": k, "expert_ffn_size": F, "norm_topk_prob": bool(norm)}


def from_gguf(need, where: str, arch: str, norm: bool) -> dict | None:
    """<arch>.expert_count / expert_used_count / expert_feed_forward_length
    -> the "moe" object, or None for a dense model. llama.cpp's gating must
    be softmax (expert_gating_func 1, or absent)."""
    E = need("expert_count", default=0)
    if not E:
        return None
    gating = need("expert_gating_func", default=1)
    if gating != 1:
        raise IntdetError(f"{where}: GGUF key {arch}.expert_gating_func = {gating}: only softmax gating (1) is supported")
    if need("expert_shared_feed_forward_length", default=0):
        raise IntdetError(f"{where}: GGUF key {arch}.expert_shared_feed_forward_length: shared experts are not supported")
    F = need("expert_feed_forward_length", default=0) or need("feed_forward_length")
    return moe_config(E, need("expert_used_count"), F, norm, where, f"GGUF {arch}")
