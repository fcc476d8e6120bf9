"""Read a source checkpoint (GGUF file or Hugging Face directory) into float
weights under one naming and one RoPE convention.

Canonical names follow GGUF (``blk.3.attn_q``); every matrix is [out, in]
float32 in Hugging Face orientation, and Q/K rows use the split-half RoPE
pairing of Hugging Face (``rotate_half``): GGUF files from llama.cpp's
converter store them interleaved and are un-permuted (models/llama.py).
What is architecture-specific (names, config keys, refused features, block
description) lives in python/intdet/models/; this file only reads files.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from ..background import Background, resolve_source, sha256_file  # noqa: F401  (re-exported)
from ..errors import IntdetError
from .lazy import LazyTensor

@dataclass
class FloatModel:
    """A source model in float: ``hp`` holds the hyper-parameters
    (hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
    head_dim, vocab_size, context_length, rope_theta, rms_eps, tied_embeddings)
    and ``layers``, the per-layer block description (models/block.py);
    ``weights`` canonical name -> float32 array, exactly the tensors the
    block description needs (check_complete)."""

    arch: str
    hp: dict
    weights: dict
    tokenizer: object = None  # tokenizers.Tokenizer
    tok_meta: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    # hp as it stood before the family's weight fix-ups (some of which
    # consume keys: Granite's multipliers), without "layers": config.json's
    # "hparams", from which LLM.update_weights quantizes new weights as
    # this conversion did (update.py)
    hparams: dict = field(default_factory=dict)


def hparams_record(hp: dict) -> dict:
    """A JSON-ready copy of ``hp`` without the block description."""
    return json.loads(json.dumps({k: v for k, v in hp.items() if k != "layers"}))


def _check_hparams(hp, where, n_tensors):
    """Refuse hyper-parameters no real model has and that would make the
    reader loop for ages (a billion layers), reshape impossibly or overflow
    later (rms_eps_q60 is an int64, RoPE angles stay below 2^19)."""
    for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "context_length", "vocab_size"):
        v = hp.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise IntdetError(f"{where}: {k} {v!r} must be a positive integer")
    if hp["num_layers"] > n_tensors:
        raise IntdetError(f"{where}: {hp['num_layers']} layers cannot fit in {n_tensors} tensors")
    theta, eps = hp["rope_theta"], hp["rms_eps"]
    for th in (theta, hp.get("rope_local_theta", theta)):
        if not (math.isfinite(th) and th >= 1.0):
            raise IntdetError(f"{where}: rope theta {th!r} must be a finite number >= 1")
    if not (math.isfinite(eps) and 0.0 <= eps and max(hp["hidden_size"], hp["head_dim"]) * eps < 8.0):
        raise IntdetError(f"{where}: RMSNorm epsilon {eps!r} is out of range")


# ---------------------------------------------------------------- GGUF

GGUF_TYPES_OK = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"}


def _gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def read_gguf(path: str) -> FloatModel:
    """Read a GGUF file of an architecture in models/; tensors are
    dequantized with the gguf package. Raises IntdetError for a file that is
    not GGUF, is truncated, holds another architecture, an unsupported
    tensor type, inconsistent shapes, or NaN/Inf values."""
    import gguf

    from .. import models
    from ..tokenizer import tokenizer_from_gguf
    from .gguf_check import check_gguf_structure

    size = os.path.getsize(path)
    check_gguf_structure(path)  # every count, length and offset vs the file, before gguf-py allocates
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises many types on malformed input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise IntdetError(f"{path}: malformed or truncated GGUF ({msg})") from None
    arch_name = _gguf_field(r, "general.architecture")
    arch = models.by_gguf_arch(arch_name) if isinstance(arch_name, str) else None
    if arch is None:
        raise IntdetError(f"{path}: unsupported GGUF architecture {arch_name!r} (supported: {', '.join(models.gguf_archs())})")

    def need(key, conv=int, default=None):
        """<arch>.<key> as a finite int/float or a str (a hostile file may hold
        a string, an array, a bool, NaN or a fraction where a number belongs)."""
        v = _gguf_field(r, f"{arch_name}.{key}", default)
        if v is None:
            raise IntdetError(f"{path}: missing GGUF key {arch_name}.{key}")
        if conv is str:
            if not isinstance(v, str):
                raise IntdetError(f"{path}: GGUF key {arch_name}.{key} = {str(v)[:40]!r} is not a string")
            return v
        if isinstance(v, (bool, str, list)) or not math.isfinite(v) or (conv is int and v != int(v)):
            raise IntdetError(f"{path}: GGUF key {arch_name}.{key} = {str(v)[:40]!r} is not a valid {conv.__name__}")
        return conv(v)

    hp = arch.hparams_from_gguf(need, path)
    _check_hparams(hp, path, len(r.tensors))
    weights = {}
    for t in r.tensors:
        tname = t.tensor_type.name
        if tname not in GGUF_TYPES_OK:
            raise IntdetError(f"{path}: tensor '{t.name}' has unsupported type {tname}")
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise IntdetError(f"{path}: tensor '{t.name}' data runs past the end of the file")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists ne0 first
        name = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
        name = "tok_embd" if name == "token_embd" else name
        if name in weights:
            raise IntdetError(f"{path}: duplicate tensor name '{t.name}'")
        weights[name] = _gguf_lazy(r, t, shape, name, path)
    V = weights["tok_embd"].shape[0] if "tok_embd" in weights else None
    vocab_kv = need("vocab_size") if r.fields.get(f"{arch_name}.vocab_size") is not None else None
    try:
        tok, meta = tokenizer_from_gguf(r)
    except ValueError as e:  # missing or malformed tokenizer.ggml.* keys
        raise IntdetError(f"{path}: {e}") from None
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    if V is None:
        raise IntdetError(f"{path}: missing tensor token_embd.weight")
    if vocab_kv is not None and vocab_kv != V:
        raise IntdetError(f"{path}: {arch_name}.vocab_size {vocab_kv} disagrees with token_embd rows {V}")
    if n_tokens > V:
        raise IntdetError(f"{path}: tokenizer has {n_tokens} tokens but the embedding has {V} rows")
    hp["vocab_size"] = V
    hp["tied_embeddings"] = "output" not in weights
    hp["layers"] = arch.blocks(hp)
    models.rope_scaling.take_freq_factors(weights, hp, path)  # llama.cpp's form of Llama 3's RoPE scaling
    record = hparams_record(hp)
    arch.gguf_transform(weights, hp)
    check_complete(weights, hp, path)
    return FloatModel(
        arch=arch.NAME, hp=hp, weights=weights, tokenizer=tok, tok_meta=meta,
        source={"kind": "gguf", "name": os.path.basename(path), "sha256": Background(sha256_file, path)},
        hparams=record,
    )


def _gguf_lazy(reader, t, shape, name: str, path: str) -> LazyTensor:
    """One GGUF tensor as a LazyTensor: rows dequantized from the file's map
    (every GGUF type stores whole rows: blocks run along ne0)."""
    from gguf.quants import dequantize

    nrows = 1
    for d in shape[:-1]:
        nrows *= d
    data, qtype, K = t.data, t.tensor_type, shape[-1]

    def read(lo, hi):
        with np.errstate(all="ignore"):  # NaN/Inf block scales are reported by LazyTensor.rows, without a warning
            return dequantize(data.reshape(nrows, -1)[lo:hi], qtype).astype(np.float32).reshape(hi - lo, K)

    mm = getattr(reader.data, "_mmap", None)  # the np.memmap's mmap.mmap: its pages can be dropped

    def release():
        if mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = -(-int(t.data_offset) // page) * page
        hi = (int(t.data_offset) + int(t.n_bytes)) // page * page
        if hi > lo:
            try:
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except (OSError, ValueError):
                pass

    return LazyTensor(shape, read, name, path, release)


def check_complete(weights, hp, where):
    """The float tensors present are exactly those the model's parameters
    (the one tensor table, intdet._core.model_params) are made from, with
    their shapes: a missing one, a wrong shape or an extra one (a feature
    no engine implements) is an IntdetError."""
    from .quantize import source_tensors

    want = source_tensors(hp, where)
    for name, shape in want.items():
        w = weights.get(name)
        if w is None:
            raise IntdetError(f"{where}: missing tensor '{name}'")
        if tuple(w.shape) != shape:
            raise IntdetError(f"{where}: tensor '{name}' has shape {tuple(w.shape)}, expected {shape}")
    extra = sorted(set(k for k, v in weights.items() if v is not None) - set(want))
    if extra:
        raise IntdetError(f"{where}: unexpected tensor '{extra[0]}' (an architecture feature intdet does not implement)")


# ---------------------------------------------------------------- Hugging Face

# config.json sizes the readers take with int(): checked first, so 72.5, "72"
# or true is refused by name instead of read as 72 (or 1); None is allowed
# for the optional ones (transformers' configs write null for a default).
HF_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
HF_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings", "moe_intermediate_size",
                     "num_experts", "num_experts_per_tok", "num_local_experts")
HF_NUMBERS = ("rope_theta", "rms_norm_eps")


def _check_hf_types(cfg: dict, where: str) -> None:
    """IntdetError naming the key for a size that is not a positive integer
    or a number field that is not a finite number."""
    for k in HF_SIZES + HF_OPTIONAL_SIZES:
        if k not in cfg or (cfg[k] is None and k in HF_OPTIONAL_SIZES):
            continue
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise IntdetError(f"{where}: {k} = {json.dumps(v)} must be a positive integer")
    for k in HF_NUMBERS:
        v = cfg.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise IntdetError(f"{where}: {k} = {json.dumps(v)} must be a finite number")


def read_hf_dir(path: str) -> FloatModel:
    """Read a Hugging Face checkpoint directory (config.json, *.safetensors,
    tokenizer.json) of an architecture in models/ (LlamaForCausalLM,
    Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM). Raises IntdetError naming the file
    for anything missing or unsupported."""
    from .. import models
    from ..safetensors_io import SafetensorsFile
    from ..tokenizer import meta_from_hf_dir

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise IntdetError(f"{path}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise IntdetError(f"{cfg_path}: cannot read JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise IntdetError(f"{cfg_path}: not a JSON object")
    archs = cfg.get("architectures") or []
    arch = models.by_hf_class(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        raise IntdetError(f"{cfg_path}: unsupported architecture {archs!r} (supported: {', '.join(models.hf_classes())})")
    _check_hf_types(cfg, cfg_path)
    try:
        hp = arch.hparams_from_hf(cfg, cfg_path)
    except KeyError as e:
        raise IntdetError(f"{cfg_path}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise IntdetError(f"{cfg_path}: invalid value ({e})") from None
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise IntdetError(f"{path}: no *.safetensors weights (PyTorch .bin checkpoints are not read)")
    hf = {}
    for fp in files:  # mapped, read a block of rows at a time by the quantizer (convert/lazy.py)
        st = SafetensorsFile(fp)
        for n in st.names():
            hf[n] = LazyTensor(st.info(n)[1], lambda lo, hi, st=st, n=n: st.rows(n, lo, hi), n, fp,
                               lambda st=st, n=n: st.release(n))
    _check_hparams(hp, cfg_path, len(hf))
    weights = {}
    for n, w in hf.items():
        c = arch.hf_tensor_name(n)
        if c is False:
            raise IntdetError(f"{path}: unexpected tensor '{n}' (an architecture feature intdet does not implement)")
        if c is not None:
            weights[c] = w
    if hp["tied_embeddings"]:
        weights.pop("output", None)
    elif "output" not in weights:
        raise IntdetError(f"{path}: tie_word_embeddings is false but lm_head.weight is missing")
    hp["layers"] = arch.blocks(hp)
    record = hparams_record(hp)
    if hasattr(arch, "hf_transform"):  # before the check: it may split fused tensors (Phi-3)
        arch.hf_transform(weights, hp)
    check_complete(weights, hp, path)
    tok_path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_path):
        raise IntdetError(f"{path}: no tokenizer.json")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(tok_path)
    except Exception as e:
        raise IntdetError(f"{tok_path}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
    try:
        tok_meta = meta_from_hf_dir(path)
    except (OSError, ValueError) as e:  # malformed tokenizer_config.json and friends
        raise IntdetError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    return FloatModel(
        arch=arch.NAME, hp=hp, weights=weights, tokenizer=tok, tok_meta=tok_meta,
        source={"kind": "hf", "name": os.path.basename(os.path.abspath(path)), "sha256": Background(source_sha256, path)},
        hparams=record,
    )


HF_HASHED = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def source_sha256(path: str) -> str:
    """sha256 identifying a source: the file's own for GGUF; for a Hugging Face
    directory, a sha256 over (name, sha256) of config.json, the tokenizer files
    and every *.safetensors, in sorted name order."""
    if not os.path.isdir(path):
        return sha256_file(path)
    names = sorted(n for n in os.listdir(path) if n in HF_HASHED or n.endswith(".safetensors"))
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode() + b"\0" + sha256_file(os.path.join(path, n)).encode())
    return h.hexdigest()


def read_source(path: str) -> FloatModel:
    """GGUF file or Hugging Face directory -> FloatModel."""
    if os.path.isdir(path):
        return read_hf_dir(path)
    if not os.path.exists(path):
        raise IntdetError(f"{path}: no such file or directory")
    return read_gguf(path)
