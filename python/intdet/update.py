"""New float weights for a loaded model, quantized exactly as ``intdet
convert`` would quantize them (``LLM.update_weights``: an RL trainer's new
policy, pushed into the inference engine without a file round trip).

The float side is convert's own: the family module maps Hugging Face names
to intdet's and applies its fix-ups (models/), quantize.plan_model plans
every output tensor, and only the jobs of the tensors given run. What the
given tensors' outputs depend on besides themselves is read from the model:
the hyper-parameters convert recorded in config.json ("hparams") and, for
each RMSNorm, its gamma exponent G ("norm_gamma_exponents"), the factor of
the activations the layers after it read. So a subset update gives the
bits of a full conversion as long as no RMSNorm changes its exponent while
a layer reading it keeps its old weights; such an update is refused,
naming the tensors to send along (an RL step's small changes keep G).

``plan_update(lm, weights)`` returns the model's new tensors and config,
and ``file_sha256(tensors)`` the sha256 ``intdet convert`` would give
their model.safetensors (the same layout, hashed without writing it);
nothing of ``lm`` changes.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from collections.abc import Mapping

import numpy as np

from .errors import IntdetError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class _NotGiven(Exception):
    """A quantize job read a tensor the update does not hold (internal)."""


class _Absent:
    """Stands for a float tensor the update leaves as it is: its shape for
    the planner; reading it is an internal error (its job must not run)."""

    dtype = np.dtype(np.float32)

    def __init__(self, name: str, shape):
        self.name, self.shape = name, tuple(shape)

    @property
    def ndim(self):
        return len(self.shape)

    def rows(self, lo, hi):
        raise _NotGiven(self.name)

    def __getitem__(self, key):
        raise _NotGiven(self.name)

    def __array__(self, dtype=None, copy=None):
        raise _NotGiven(self.name)


def _lazy(name: str, t):
    """A torch tensor or numpy array of float32/float16/bfloat16 as convert's
    LazyTensor: rows widened to float32 (exact) a block at a time, in the
    quantizer's threads, and checked for NaN/Inf there (as a checkpoint
    file's are), so no float32 copy of the whole model is made up front.
    IntdetError naming the tensor for another dtype."""
    from .convert.lazy import LazyTensor

    mod = type(t).__module__
    if mod.startswith("torch"):
        import torch

        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise IntdetError(f"weights: tensor '{name}' is {str(t.dtype).replace('torch.', '')}; "
                              f"give {', '.join(FLOAT_DTYPES)}", field="weights")
        try:
            t = t.detach().to("cpu")
        except (RuntimeError, NotImplementedError) as e:  # a meta tensor has no data
            raise IntdetError(f"weights: tensor '{name}' cannot be read on the CPU ({str(e).splitlines()[0][:120]})",
                              field="weights") from None
        shape = tuple(t.shape)
        rows = t.reshape(-1, shape[-1]) if shape else t.reshape(1, 1)

        def read(lo, hi, rows=rows):
            return rows[lo:hi].to(torch.float32).numpy()
    else:
        a = np.asarray(t)
        if a.dtype.name not in FLOAT_DTYPES:
            raise IntdetError(f"weights: tensor '{name}' is {a.dtype.name}; give {', '.join(FLOAT_DTYPES)}",
                              field="weights")
        shape = a.shape
        rows = a.reshape(-1, shape[-1]) if shape else a.reshape(1, 1)

        def read(lo, hi, rows=rows):
            return rows[lo:hi].astype(np.float32)
    return LazyTensor(shape, read, name, "weights")


def read_weights(weights) -> dict:
    """``weights`` -> {Hugging Face name: convert's lazy tensor (float32
    rows read on demand)}: a mapping or an iterable of (name, tensor) pairs (torch or
    numpy, float32/float16/bfloat16), or the path of a .safetensors file
    or of a directory of them (read lazily, a row block at a time).
    IntdetError naming the file or tensor otherwise."""
    if isinstance(weights, (str, os.PathLike)):
        return _read_path(os.fspath(weights))
    items = weights.items() if isinstance(weights, Mapping) else weights
    out: dict = {}
    try:
        it = iter(items)
    except TypeError:
        raise IntdetError("weights: give a mapping or pairs of (name, tensor), or a .safetensors path",
                          field="weights") from None
    for pair in it:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise IntdetError("weights: each item must be a (name, tensor) pair", field="weights")
        name, t = pair
        if name in out:
            raise IntdetError(f"weights: tensor '{name}' given twice", field="weights")
        out[name] = _lazy(name, t)
    if not out:
        raise IntdetError("weights: no tensors given", field="weights")
    return out


def _read_path(path: str) -> dict:
    import glob

    from .convert.lazy import LazyTensor
    from .safetensors_io import SafetensorsFile

    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise IntdetError(f"{path}: no *.safetensors files", field="weights")
    if not os.path.isfile(files[0]):
        raise IntdetError(f"{path}: no such file", field="weights")
    out: dict = {}
    for fp in files:
        st = SafetensorsFile(fp)
        for n in st.names():
            if n in out:
                raise IntdetError(f"{fp}: tensor '{n}' is also in another file", field="weights")
            out[n] = LazyTensor(st.info(n)[1], lambda lo, hi, st=st, n=n: st.rows(n, lo, hi), n, fp,
                                lambda st=st, n=n: st.release(n))
    return out


def plan_update(lm, weights, workers: int = 1):
    """(tensors, cfg, written): every tensor of ``lm`` (a
    model.LoadedModel) with those that ``weights`` (read_weights' forms)
    changes quantized anew, the config (new norm exponents), and the names
    of the intdet tensors written anew (``file_sha256(tensors)`` is the new
    model's sha256). IntdetError (field "weights") naming the tensor for
    an unknown name, a wrong shape, a dtype that is not float, NaN/Inf, or
    an RMSNorm whose exponent changes while a layer reading it is not
    given; naming config.json for a model converted before "hparams" was
    recorded."""
    from . import models
    from .convert.quantize import model_params, plan_model, quant_gamma, source_tensors
    from .convert.sources import FloatModel

    cfg = lm.cfg
    where = lm.cfg_path or "config.json"
    if not cfg.get("hparams"):
        raise IntdetError(f"{where}: no \"hparams\" record (converted by an older intdet): convert the model again "
                          "to update its weights", field="model")
    arch = models.ARCHITECTURES.get(cfg.get("architecture"))
    if arch is None:
        raise IntdetError(f"{where}: architecture {cfg.get('architecture')!r} is unknown", field="model")
    hp = copy.deepcopy(cfg["hparams"])
    hp["layers"] = copy.deepcopy(cfg["layers"])
    given = read_weights(weights)

    canon: dict = {}
    hf_of: dict = {}
    for n, w in given.items():
        c = arch.hf_tensor_name(n)
        if c is False:
            raise IntdetError(f"weights: '{n}' is not a tensor of this {arch.NAME} model", field="weights")
        if c is None:
            continue  # not a weight (rotary inv_freq)
        canon[c], hf_of[c] = w, n
    if hp["tied_embeddings"] and "output" in canon:
        del canon["output"]  # as convert: a tied model reads lm_head from the embedding
    if not canon:
        raise IntdetError("weights: none of the tensors given is a weight of this model", field="weights")
    if hasattr(arch, "hf_transform"):
        arch.hf_transform(canon, hp)  # may consume hp keys (Granite), as in convert
    want = source_tensors(hp, where)
    for c, w in canon.items():
        name = hf_of.get(c, c)
        if c not in want:
            raise IntdetError(f"weights: '{name}' is not a tensor of this {arch.NAME} model", field="weights")
        if tuple(w.shape) != want[c]:
            raise IntdetError(f"weights: tensor '{name}' has shape {list(w.shape)}, this model's is {list(want[c])}",
                              field="weights")

    params = model_params(cfg, where)
    exps = cfg.get("norm_gamma_exponents", {})
    W: dict = {}
    for p in params:
        name, kind = p["name"], p["kind"]
        if kind in ("norm", "post_norm") and name not in canon:
            # its exponent is what the layers after it use; a gamma that
            # quantizes to the stored one (its dequantized value) gives it
            g = np.asarray(lm.tensors[name + ".g"], np.float64) * 2.0 ** -exps[name]
            W[name] = g / math.sqrt(p["shape"][0]) if kind == "post_norm" else g
        elif name in want and name not in canon:
            W[name] = _Absent(name, want[name])
        if p.get("bias") and name + ".bias" in want and name + ".bias" not in canon:
            W[name + ".bias"] = np.zeros(want[name + ".bias"], np.float32)  # its static is not taken
    W.update(canon)

    # an RMSNorm whose exponent changes rescales every layer reading it
    for p in params:
        name = p["name"]
        if p["kind"] == "norm" and name in canon:
            G = quant_gamma(np.asarray(canon[name]))[1]
            if G != exps.get(name):
                readers = [q["name"] for q in params if q.get("input") == name]
                if name == "output_norm" and hp["tied_embeddings"]:
                    readers.append("tok_embd")
                missing = [r for r in readers if r not in canon and (r != "output" or not hp["tied_embeddings"])]
                if missing:
                    raise IntdetError(
                        f"weights: '{hf_of.get(name, name)}' changes its fixed-point exponent ({exps.get(name)} -> {G}), "
                        f"which rescales the layers reading it; send their weights too: "
                        f"{', '.join(_hf_names(arch, missing))}", field="weights")

    fm = FloatModel(arch=arch.NAME, hp=hp, weights=W)
    plan = plan_model(fm, weights=cfg.get("weight_format", "int8"), with_rope=False)
    plan.close()
    # which outputs to take: the statics and jobs of the given tensors, and
    # what is derived from norms alone (attention score scales)
    changed_src = set(canon)
    lm_head_scales = hp["tied_embeddings"] and ("tok_embd" in canon or "output_norm" in canon)
    take_jobs = [i for i, t in enumerate(plan.job_tensors)
                 if t in changed_src or (t == "output" and lm_head_scales)]
    job_of = {t for i, t in enumerate(plan.job_tensors) if i in set(take_jobs)}
    outputs = {k for k in plan.specs if k not in plan.static and k.rsplit(".", 1)[0] in job_of}
    static_take = {}
    for k, a in plan.static.items():
        src = k if k.endswith(".bias") else k.rsplit(".", 1)[0]  # a bias is its own source tensor
        if src in changed_src or src.endswith("attn_score"):
            static_take[k] = a
    new = {k: np.empty(plan.specs[k][1], plan.specs[k][0]) for k in outputs}

    def put(name, start, a):
        if name in new:
            flat = new[name].reshape(-1)
            flat[start:start + a.size] = np.asarray(a).reshape(-1)

    plan.jobs, plan.static = [plan.jobs[i] for i in take_jobs], {}  # its statics are taken below
    try:
        plan.run(put, workers)  # convert's runner: the same threads, a bounded number of blocks in flight
    except _NotGiven as e:
        raise IntdetError(f"internal: update needed tensor '{e.args[0]}' it was not given") from None
    new.update(static_take)

    tensors = dict(lm.tensors)
    for k, a in new.items():
        old = tensors.get(k)
        if old is None or old.dtype != a.dtype or old.shape != a.shape:
            raise IntdetError(f"internal: updated tensor '{k}' does not match the model's")
        tensors[k] = a
    new_cfg = copy.deepcopy(cfg)
    new_cfg["norm_gamma_exponents"] = {**exps, **{k: v for k, v in plan.cfg["norm_gamma_exponents"].items()
                                                  if k in canon}}
    new_cfg.pop("model_sha256", None)
    return tensors, new_cfg, sorted(new)


def _hf_names(arch, names):
    """Hugging Face names of intdet tensor names (for messages)."""
    inv = {}
    for n in names:
        for hf in _candidates(n):
            if arch.hf_tensor_name(hf) == n:
                inv[n] = hf
                break
    return [inv.get(n, n) for n in names]


def _candidates(n: str):
    from .models.llama import HF_LAYER, HF_TOP

    for hf, c in HF_TOP.items():
        if c == n:
            yield hf
    if n.startswith("blk."):
        _, layer, rest = n.split(".", 2)
        for hf, c in HF_LAYER.items():
            if c == rest:
                yield f"model.layers.{layer}.{hf}"


def file_sha256(tensors: dict) -> str:
    """sha256 of the model.safetensors ``intdet convert`` writes for
    ``tensors`` (name -> int array): its header (convert/writer.py layout,
    metadata {"format": "intdet"}) and every tensor's little-endian bytes
    in the file's order, hashed without writing the file."""
    from .convert.writer import layout

    specs = {k: (a.dtype, a.shape) for k, a in tensors.items()}
    head, where, _ = layout(specs, {"format": "intdet"})
    h = hashlib.sha256(head)
    for name in sorted(where, key=lambda k: where[k][2]):
        a = tensors[name]
        h.update(memoryview(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))).cast("B"))
    return h.hexdigest()
