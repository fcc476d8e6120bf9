"""Named intermediates of one forward pass on a backend (the numpy spec, a
C++ kernel set, or the CUDA engine), and the first tensor where two backends
differ.

Names are GGUF-style, in forward order: ``tok_embd``, then per layer
``blk.N.attn_norm`` ... ``blk.N.residual`` (LAYER_OPS), then ``output`` (the
logits of every position). Every value is an exact integer array, so two
backends agree when every array has the same shape and bits.
"""

from __future__ import annotations

import numpy as np

from .model import Engine, LoadedModel
from .ref.model import RefModel

LAYER_OPS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_out", "attn_output", "ffn_norm", "ffn_gate_inp",
             "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_down", "residual")
_PRE_NORMS = ("attn_norm", "ffn_norm")  # absent where a block has no pre-norm (OLMo 2)
_DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_swiglu")  # a mixture-of-experts block records ffn_gate_inp instead


def layer_ops(block: dict) -> list[str]:
    """The names one layer records, in forward order, from its block entry
    (cfg["layers"][i]: "norms" list, optional "moe")."""
    pre = "attn_norm" in block.get("norms", ["attn_norm"])
    moe = "moe" in block
    return [op for op in LAYER_OPS
            if (pre or op not in _PRE_NORMS) and (op != "ffn_gate_inp" or moe) and not (moe and op in _DENSE_FFN)]


def trace_names(cfg: dict) -> list[str]:
    """Every traced name of the model with config `cfg` (LoadedModel.cfg),
    in forward order: exactly the names every backend records."""
    layers = cfg.get("layers") or [{}] * cfg["num_layers"]
    return ["tok_embd", *(f"blk.{i}.{op}" for i, b in enumerate(layers) for op in layer_ops(b)), "output"]


def trace_ref(lm: LoadedModel, ids) -> dict:
    """name -> int64 array from the numpy spec (python/intdet/ref/model.py)."""
    n = len(ids)
    cfg = dict(lm.cfg, context_length=n)
    t = dict(lm.tensors)
    t["rope.cos"], t["rope.sin"] = t["rope.cos"][:n], t["rope.sin"][:n]
    rec = {}
    RefModel(cfg, t).forward(np.asarray(ids), 0, trace=rec)
    return {name: np.asarray(a) for name, (a, _factor) in rec.items()}


def trace_cpu(engine: Engine, ids, isa: str | None = None) -> dict:
    """name -> int64 array from the C++ core on kernel set `isa` (default: the
    active one), for this call only. engine: an Engine on device "cpu"."""
    return engine.trace(ids, isa)


def trace_cuda(engine: Engine, ids) -> dict:
    """name -> int64 array from the CUDA engine (its module's forward_trace:
    intdet._cuda, or whatever intdet.backends.cuda.cuda_module returns, such as the
    host emulator in tests). engine: an Engine on device "cuda"."""
    return engine.trace(ids)


def first_divergence(a: dict, b: dict, names) -> tuple[str, str] | None:
    """The first name (in `names` order) whose arrays differ in shape or in any
    bit, with a one-line description; None when all agree. A name recorded by
    one side only counts as a difference."""
    for name in names:
        if (name in a) != (name in b):
            return name, f"recorded by {'the first' if name in a else 'the second'} side only"
        if name not in a:
            continue
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            return name, f"shape {x.shape} vs {y.shape}"
        bad = np.flatnonzero(x.astype(np.int64).ravel() != y.astype(np.int64).ravel())
        if bad.size:
            at = tuple(int(i) for i in np.unravel_index(bad[0], x.shape))
            return name, f"{bad.size} of {x.size} values differ; first at {at}: {int(x[at])} vs {int(y[at])}"
    return None


def trace_backend(engine: Engine, ids, backend: str) -> dict:
    """The trace of `backend`: "ref" (the numpy spec), "cuda" (the CUDA
    engine) or a CPU kernel set name. engine: on device "cpu" or "cuda"; an
    Engine for the other device is made from its model when needed."""
    if backend == "ref":
        return trace_ref(engine.lm, ids)
    if backend == "cuda":
        return trace_cuda(engine if engine.device == "cuda" else Engine(engine.lm, "cuda"), ids)
    return trace_cpu(engine if engine.device == "cpu" else Engine(engine.lm, "cpu"), ids, backend)


def compare_backends(engine: Engine, ids, backends) -> list[tuple[str, tuple[str, str] | None]]:
    """Each backend after the first against the first: (backend,
    first_divergence or None)."""
    names = trace_names(engine.lm.cfg)
    base = trace_backend(engine, ids, backends[0])
    return [(b, first_divergence(base, trace_backend(engine, ids, b), names)) for b in backends[1:]]
