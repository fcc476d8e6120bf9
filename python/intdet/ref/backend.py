"""The ref backend: the numpy integer spec (ref/model.py's RefModel) under
the backends API (python/intdet/backends/__init__.py), so that
``Engine(lm, "ref")`` runs through the same calls as the C++ core.

Slow and single-threaded; one "kernel set", ``ref``. The out-buffer checks
and their messages are the core's (csrc/bindings/model_bindings.h)."""

from __future__ import annotations

import json

import numpy as np

from .model import RefModel


class Model:
    """The checked model: config.json's dict and the loader's tensors
    (name -> numpy array), read by each State's RefModel. ValueError naming
    the file for anything the loader refuses."""

    def __init__(self, cfg: dict, tensors: dict, *, mapped: bool = False, config_path: str = "config.json",
                 tensors_path: str = "model.safetensors"):
        from .._core import check_model

        check_model(json.dumps(cfg), tensors, config_path, tensors_path, mapped=mapped)
        self.cfg, self.tensors = cfg, tensors


class State:
    """One sequence: a RefModel whose cache holds ``max_len`` positions
    (its rope tables cut to them)."""

    def __init__(self, model: Model, max_len: int):
        cfg = dict(model.cfg, context_length=max_len)
        t = dict(model.tensors)
        t["rope.cos"], t["rope.sin"] = t["rope.cos"][:max_len], t["rope.sin"][:max_len]
        self.ref = RefModel(cfg, t)
        self.n_past = 0

    def truncate(self, n: int) -> None:
        """Keep positions [0, n): the cache is indexed by position, so the next forward writes over the rest."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"truncate: {n} is outside [0, {self.n_past}]")
        self.n_past = n

    def copy_prefix(self, src: "State", n: int) -> None:
        """Positions [0, n) of ``src``'s cache (a state of the same model)."""
        if not 0 <= n <= src.n_past:
            raise ValueError(f"copy_prefix: {n} is outside [0, {src.n_past}]")
        self.ref.copy_prefix(src.ref, n)
        self.n_past = n


def _check_out(out, rows: int, V: int) -> np.ndarray:
    """The caller's logits buffer, checked as the core checks it; a new one when None."""
    if out is None:
        return np.empty((rows, V), dtype=np.int32)
    if not isinstance(out, np.ndarray) or out.dtype != np.int32:
        raise ValueError("out: an int32 numpy array expected")
    if out.shape != (rows, V):
        raise ValueError(f"out: shape [{rows}, {V}] expected")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out: a writable C-contiguous array expected")
    return out


def _run(state: State, tokens, start: int) -> np.ndarray:
    """int64 logits [T, V] of tokens at start.. (the cache advanced)."""
    if start != state.n_past:
        raise ValueError("start must equal the number of cached positions")
    z = state.ref.forward(np.asarray(tokens, dtype=np.int32), start)
    state.n_past = start + len(tokens)
    return z


def forward(model: Model, state: State, tokens, start: int, all_logits: bool = False, out=None) -> np.ndarray:
    """int32 logits [T or 1, V] (Q16) of tokens (int [T]) at positions start..start+T-1, into ``out`` if given."""
    rows = len(tokens) if all_logits else 1
    out = _check_out(out, rows, model.cfg["vocab_size"])
    z = _run(state, tokens, start)
    out[...] = z if all_logits else z[-1:]
    return out


def forward_batch(model: Model, states, tokens, all_logits=False, out=None) -> list:
    """Each sequence in turn (the spec has no batched path); one int32
    array per sequence, views of one [rows, V] buffer (``out`` if given)."""
    flags = [bool(all_logits)] * len(states) if isinstance(all_logits, (bool, np.bool_)) else list(all_logits)
    if len(flags) != len(states) or len(tokens) != len(states):
        raise ValueError(f"forward_batch: {len(states)} states, {len(tokens)} token lists, {len(flags)} flags")
    nout = [len(t) if f else 1 for t, f in zip(tokens, flags)]
    buf = _check_out(out, sum(nout), model.cfg["vocab_size"])
    res, off = [], 0
    for s, t, f, n in zip(states, tokens, flags, nout):
        z = _run(s, t, s.n_past)
        buf[off:off + n] = z if f else z[-1:]
        res.append(buf[off:off + n])
        off += n
    return res


def forward_trace(model: Model, state: State, tokens, start: int, isa: str | None = None):
    """(logits int32 [T, V], {name: int64 array} of the spec's named
    intermediates, "ref"); ``isa`` is not used (one kernel set)."""
    if start != state.n_past:
        raise ValueError("start must equal the number of cached positions")
    rec = {}
    z = state.ref.forward(np.asarray(tokens, dtype=np.int32), start, trace=rec)
    state.n_past = start + len(tokens)
    return z.astype(np.int32), {name: np.asarray(a) for name, (a, _factor) in rec.items()}, "ref"


def kernels_ready() -> None:
    pass


def isa() -> str:
    return "ref"


def available_isas() -> list:
    return ["ref"]


def set_isa(name: str) -> None:
    raise ValueError("set_isa: the ref backend has one kernel set")


def set_num_threads(n: int) -> None:
    pass  # numpy decides


def num_threads() -> int:
    return 1


def thread_setting() -> int:
    return 0


def last_forward_threads() -> int:
    return 1


def device_name() -> str:
    return "ref (ref)"
