"""Load a converted intdet model directory and run it on a backend.

``load_model(dir)`` checks config.json and every tensor's dtype and shape
before use. ``Engine`` wraps a backend: ``cpu`` (the C++ core, the default),
``cuda`` (the CUDA kernels of ``intdet._cuda``, the same bits; docs/cuda.md)
or ``ref`` (the numpy integer spec, slow, for cross-checking).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .convert.quantize import FORMAT_VERSION, W4_GROUP, W4_MAX
from .convert.sources import sha256_file
from .errors import IntdetError
from .safetensors_io import SafetensorsFile

DEVICES = ("cpu", "ref", "cuda")
NATIVE = ("cpu", "cuda")  # backends with the intdet._core API (Model, State, forward, forward_batch)
_DT = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass
class LoadedModel:
    path: str
    cfg: dict
    tensors: dict  # name -> read-only numpy view into the mmapped file
    tokenizer: object
    tok_meta: dict
    model_sha256: str
    st: object = None  # the SafetensorsFile the tensors view


def _expected_shapes(c: dict) -> dict:
    H, F, V, D = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    nh, nkv, P = c["num_heads"], c["num_kv_heads"], c["context_length"]
    want = {"tok_embd.q": (V, H), "tok_embd.mant": (V,), "tok_embd.shift": (V,), "rope.cos": (P, D // 2),
            "rope.sin": (P, D // 2), "output_norm.g": (H,), "output.mant": (V,), "output.shift": (V,)}
    if not c["tied_embeddings"]:
        want["output.q"] = (V, H)
    int4 = c.get("weight_format", "int8") == "int4"
    lin = {"attn_q": (nh * D, H), "attn_k": (nkv * D, H), "attn_v": (nkv * D, H), "attn_output": (H, nh * D),
           "ffn_gate": (F, H), "ffn_up": (F, H), "ffn_down": (H, F)}
    for i in range(c["num_layers"]):
        p = f"blk.{i}."
        want[p + "attn_norm.g"] = want[p + "ffn_norm.g"] = (H,)
        want[p + "attn_score.mant"] = want[p + "attn_score.shift"] = (1,)
        for n, (N, K) in lin.items():
            if int4:
                want[p + n + ".q4"] = (N, K // 2)
                want[p + n + ".gd"] = want[p + n + ".gm"] = (N, K // W4_GROUP)
            else:
                want[p + n + ".q"] = (N, K)
            want[p + n + ".mant"] = want[p + n + ".shift"] = (N,)
        if c["attn_bias"]:
            for n in ("attn_q", "attn_k", "attn_v"):
                want[p + n + ".bias"] = (lin[n][0],)
        if c["qk_norm"]:
            want[p + "attn_q_norm.g"] = want[p + "attn_k_norm.g"] = (D,)
    return want


_DTYPE_OF_SUFFIX = {".q": np.int8, ".q4": np.uint8, ".gd": np.int16, ".gm": np.int16, ".mant": np.int32, ".shift": np.int32, ".bias": np.int32, ".g": np.int16,
                    ".cos": np.int16, ".sin": np.int16}


def load_model(path: str) -> LoadedModel:
    """Open a converted model directory. Raises IntdetError naming the file
    for a missing file, a foreign or newer format, a bad config value, or a
    tensor whose dtype or shape is not what the config implies."""
    from .tokenizer import load_tokenizer

    cfg_path = os.path.join(path, "config.json")
    st_path = os.path.join(path, "model.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.isfile(p):
            raise IntdetError(f"{path}: not an intdet model directory (missing {os.path.basename(p)})")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise IntdetError(f"{cfg_path}: cannot read JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != "intdet":
        raise IntdetError(f"{cfg_path}: not an intdet config (convert the model with `intdet convert` first)")
    if cfg.get("format_version") != FORMAT_VERSION:
        raise IntdetError(f"{cfg_path}: format_version {cfg.get('format_version')!r} is not {FORMAT_VERSION}; re-convert the model")
    ints = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "vocab_size", "context_length")
    for k in ints:
        v = cfg.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 2**31:
            raise IntdetError(f"{cfg_path}: {k} = {v!r} is not a positive integer")
    if cfg["num_heads"] % cfg["num_kv_heads"] or cfg["head_dim"] % 2 or cfg["head_dim"] > 256 or cfg["hidden_size"] > 8192:
        raise IntdetError(f"{cfg_path}: head counts/sizes outside the overflow-checked range (docs/format.md)")
    if max(cfg["intermediate_size"], cfg["num_heads"] * cfg["head_dim"]) >= 1 << 24 or cfg["context_length"] >= 1 << 19:
        raise IntdetError(f"{cfg_path}: a linear input of 2^24 features or a context of 2^19 positions could overflow an accumulator")
    wf = cfg.get("weight_format", "int8")
    if wf not in ("int8", "int4"):
        raise IntdetError(f"{cfg_path}: weight_format {wf!r} is not int8 or int4")
    if wf == "int4":
        ks = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_heads"] * cfg["head_dim"])
        gs = cfg.get("weight_group_size")
        if type(gs) is not int or gs != W4_GROUP or any(k % W4_GROUP for k in ks) or max(ks) >= 1 << 21:
            raise IntdetError(f"{cfg_path}: int4 weights need weight_group_size {W4_GROUP}, linear inputs that are "
                              f"multiples of {W4_GROUP} and below 2^21")
    st = SafetensorsFile(st_path)
    # Weights of the other format would be silently ignored: refuse them (as intdet_run does).
    other = ".q" if wf == "int4" else ".q4"
    for name in st.names():
        if name.startswith("blk.") and name.endswith(other):
            raise IntdetError(f"{st_path}: tensor '{name}' is {'int8' if wf == 'int4' else 'int4'} weights but "
                              f"config.json says weight_format {wf}")
    tensors = {}
    for name, shape in _expected_shapes(cfg).items():
        if name not in st:
            raise IntdetError(f"{st_path}: missing tensor '{name}'")
        arr = st.get(name)
        want_dt = _DTYPE_OF_SUFFIX["." + name.rsplit(".", 1)[1]]
        if arr.dtype != want_dt or arr.shape != shape:
            raise IntdetError(f"{st_path}: tensor '{name}' is {arr.dtype}{list(arr.shape)}, expected {np.dtype(want_dt)}{list(shape)}")
        tensors[name] = arr
        _check_value_ranges({name: arr}, st_path)
        if name.endswith(".gm"):  # the int4 bound |gd * u + gm| <= 2047 for u in 0..15 (int64: abs(-32768) in int16 stays negative)
            gd, gm = tensors[name[:-3] + ".gd"].astype(np.int64), arr.astype(np.int64)
            bad = (gd < 0) | (np.abs(gm) > W4_MAX) | (np.abs(gm + 15 * gd) > W4_MAX)
            if bad.any():
                n, g = (int(i) for i in np.argwhere(bad)[0])
                raise IntdetError(f"{st_path}: tensors '{name[:-3]}.gd/.gm' group [{n}, {g}]: gd {gd[n, g]}, gm {gm[n, g]} "
                                  f"break the int4 bound gd >= 0, |gd * u + gm| <= {W4_MAX}")
        if name.endswith((".q", ".q4")):  # checked: drop its pages until the engine reads (or packs) it
            st.release(name)
    try:
        tok, meta = load_tokenizer(path)
    except (OSError, ValueError) as e:  # missing or malformed tokenizer files
        raise IntdetError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    return LoadedModel(path=path, cfg=cfg, tensors=tensors, tokenizer=tok, tok_meta=meta, model_sha256=sha256_file(st_path), st=st)


def _check_value_ranges(t: dict, where: str):
    """Values the overflow bounds rely on: mantissas < 2^15 + 1, shifts in a sane
    range, gammas within 15 bits."""
    for name, a in t.items():
        if name.endswith(".mant") and a.size and (a.min() < 0 or a.max() > 1 << 15):
            raise IntdetError(f"{where}: tensor '{name}' has a dyadic mantissa outside [0, 2^15]")
        if name.endswith(".shift") and a.size and (a.min() < -64 or a.max() > 200):
            raise IntdetError(f"{where}: tensor '{name}' has a shift outside [-64, 200]")
        if name.endswith(".q") and a.size and a.min() < -127:
            raise IntdetError(f"{where}: tensor '{name}' holds -128 (weights are symmetric int8)")


class Sequence:
    """One sequence's KV cache on a backend. ``forward(tokens, all_logits)``
    appends tokens (int [T]) and returns int32 logits [T or 1, vocab] (Q16)."""

    def __init__(self, engine: "Engine", max_len: int):
        self.engine = engine
        self.max_len = max_len
        self.n_past = 0
        if engine.device in NATIVE:
            self._state = engine._core.State(engine._model, max_len)
        else:
            from .ref.model import RefModel

            cfg = dict(engine.lm.cfg, context_length=max_len)
            t = dict(engine.lm.tensors)
            t["rope.cos"], t["rope.sin"] = t["rope.cos"][:max_len], t["rope.sin"][:max_len]
            self._ref = RefModel(cfg, t)

    def forward(self, tokens, all_logits: bool = False) -> np.ndarray:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if self.n_past + len(tokens) > self.max_len:
            raise IntdetError(f"sequence of {self.n_past + len(tokens)} tokens exceeds the context ({self.max_len})")
        if self.engine.device in NATIVE:
            out = self.engine._core.forward(self.engine._model, self._state, tokens, self.n_past, all_logits)
        else:
            out = self._ref.forward(tokens, self.n_past)
            out = (out if all_logits else out[-1:]).astype(np.int32)
        self.n_past += len(tokens)
        return out


def cuda_module():
    """intdet._cuda when it was built and a CUDA GPU is visible; else
    IntdetError saying why."""
    try:
        from . import _cuda
    except ImportError as e:
        raise IntdetError(f"--device cuda: no CUDA GPU available (intdet was built without its CUDA module: {e})") from None
    if _cuda.device_count() < 1:
        raise IntdetError(f"--device cuda: no CUDA GPU available ({_cuda.no_device_reason() or 'no device'})")
    return _cuda


def default_threads() -> int:
    """Cores this process may run on (the machines here have no SMT; on SMT
    machines OpenMP's default of one thread per logical CPU applies)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Engine:
    """A loaded model on one backend (``cpu``: C++ core; ``cuda``: GPU kernels;
    ``ref``: numpy spec). ``cuda_graphs`` (cuda only): replay decode steps from
    CUDA graphs (None: the INTDET_CUDA_GRAPHS environment variable)."""

    def __init__(self, lm: LoadedModel, device: str = "cpu", threads: int | None = None,
                 cuda_graphs: bool | None = None):
        if device not in DEVICES:
            raise IntdetError(f"--device {device!r} is not available (choose from {', '.join(DEVICES)})")
        if threads is not None and not 0 <= threads <= 1024:
            raise IntdetError(f"--threads: {threads} must be in [0, 1024] (0 = all cores)")
        self.lm = lm
        self.device = device
        if device == "cpu":
            from . import _core

            self._core = _core
            try:
                _core.kernels_ready()
            except ValueError as e:  # INTDET_ISA names a kernel set this CPU or build lacks
                raise IntdetError(str(e)) from None
            if threads is not None:
                _core.set_num_threads(threads or default_threads())
            try:
                # mapped: the tensors are views of the read-only file mapping,
                # so the core may drop each weight's pages once it has packed it.
                self._model = _core.Model(lm.cfg, lm.tensors, mapped=lm.st is not None)
            except ValueError as e:
                raise IntdetError(f"{lm.path}: {e}") from None
        elif device == "cuda":
            self._core = cuda_module()
            try:
                self._model = self._core.Model(lm.cfg, lm.tensors, cuda_graphs)
            except ValueError as e:
                raise IntdetError(f"{lm.path}: {e}") from None
            except RuntimeError as e:  # out of device memory, a driver error
                raise IntdetError(f"--device cuda: {e}") from None

    def forward_batch(self, seqs, tokens, all_logits: bool = False):
        """Advance several sequences in one call (their rows share every linear
        layer); returns one int32 logits array per sequence, bit-identical to
        ``seq.forward(tokens_i)`` run alone. cpu and cuda backends (ref runs
        the sequences one by one)."""
        if self.device not in NATIVE:
            return [s.forward(t, all_logits) for s, t in zip(seqs, tokens)]
        for s, t in zip(seqs, tokens):
            if s.n_past + len(t) > s.max_len:
                raise IntdetError(f"sequence of {s.n_past + len(t)} tokens exceeds the context ({s.max_len})")
        outs = self._core.forward_batch(self._model, [s._state for s in seqs],
                                        [np.ascontiguousarray(t, dtype=np.int32) for t in tokens], all_logits)
        for s, t in zip(seqs, tokens):
            s.n_past += len(t)
        return outs

    @property
    def vocab_size(self) -> int:
        return self.lm.cfg["vocab_size"]

    @property
    def context_length(self) -> int:
        return self.lm.cfg["context_length"]

    def new_sequence(self, max_len: int | None = None) -> Sequence:
        return Sequence(self, min(max_len or self.context_length, self.context_length))
