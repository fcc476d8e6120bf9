"""Read a source checkpoint (GGUF file or Hugging Face directory) into float
weights under one naming and one RoPE convention.

Canonical names follow GGUF (``blk.3.attn_q``); every matrix is [out, in]
float32 in Hugging Face orientation, and Q/K rows use the split-half RoPE
pairing of Hugging Face (``rotate_half``): GGUF files from llama.cpp's
converter store them interleaved and are un-permuted here.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import IntdetError

ARCHS = ("llama", "qwen2", "qwen3")


@dataclass
class FloatModel:
    """A source model in float: ``hp`` holds the hyper-parameters
    (hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
    head_dim, vocab_size, context_length, rope_theta, rms_eps, tied_embeddings,
    qk_norm, attn_bias), ``weights`` canonical name -> float32 array."""

    arch: str
    hp: dict
    weights: dict
    tokenizer: object = None  # tokenizers.Tokenizer
    tok_meta: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)


def sha256_file(path, bufsize=1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _check_finite(name, w, where):
    if not np.all(np.isfinite(w)):
        raise IntdetError(f"{where}: tensor '{name}' holds NaN or Inf values")


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
    if not (math.isfinite(theta) and theta >= 1.0):
        raise IntdetError(f"{where}: rope theta {theta!r} must be a finite number >= 1")
    if not (math.isfinite(eps) and 0.0 <= eps and max(hp["hidden_size"], hp["head_dim"]) * eps < 8.0):
        raise IntdetError(f"{where}: RMSNorm epsilon {eps!r} is out of range")


def _unpermute_rope_rows(w, n_head):
    """Undo llama.cpp convert_hf_to_gguf.py's ``permute`` of Q/K rows
    (interleaved pairs -> Hugging Face split halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- GGUF

GGUF_TYPES_OK = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"}


def _gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def read_gguf(path: str) -> FloatModel:
    """Read a llama-architecture GGUF file; tensors are dequantized with the
    gguf package. Raises IntdetError for a file that is not GGUF, is
    truncated, holds another architecture, an unsupported tensor type,
    inconsistent shapes, or NaN/Inf values."""
    import gguf
    from gguf.quants import dequantize

    from ..tokenizer import tokenizer_from_gguf
    from .gguf_check import check_gguf_structure

    size = os.path.getsize(path)
    check_gguf_structure(path)  # every count, length and offset vs the file, before gguf-py allocates
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises many types on malformed input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise IntdetError(f"{path}: malformed or truncated GGUF ({msg})") from None
    arch = _gguf_field(r, "general.architecture")
    if arch != "llama":
        raise IntdetError(f"{path}: unsupported GGUF architecture {arch!r} (supported: llama)")

    def need(key, conv=int, default=None):
        """llama.<key> as a finite int/float (a hostile file may hold a
        string, an array, a bool, NaN or a fraction there)."""
        v = _gguf_field(r, f"llama.{key}", default)
        if v is None:
            raise IntdetError(f"{path}: missing GGUF key llama.{key}")
        if isinstance(v, (bool, str, list)) or not math.isfinite(v) or (conv is int and v != int(v)):
            raise IntdetError(f"{path}: GGUF key llama.{key} = {str(v)[:40]!r} is not a valid {conv.__name__}")
        return conv(v)

    H = need("embedding_length")
    nh = need("attention.head_count")
    nkv = need("attention.head_count_kv", default=nh)
    if nh <= 0 or nkv <= 0 or H % nh or nh % nkv:
        raise IntdetError(f"{path}: inconsistent head counts (hidden {H}, heads {nh}, kv heads {nkv})")
    D = need("attention.key_length", default=H // nh)
    rot = need("rope.dimension_count", default=D)
    if rot != D:
        raise IntdetError(f"{path}: partial rotary embedding (rope.dimension_count {rot} != head_dim {D}) is not supported")
    if _gguf_field(r, "llama.rope.scaling.type") not in (None, "none"):
        raise IntdetError(f"{path}: rope scaling {_gguf_field(r, 'llama.rope.scaling.type')!r} is not supported")
    hp = dict(
        hidden_size=H,
        intermediate_size=need("feed_forward_length"),
        num_layers=need("block_count"),
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        context_length=need("context_length"),
        rope_theta=need("rope.freq_base", float, 10000.0),
        rms_eps=need("attention.layer_norm_rms_epsilon", float),
        qk_norm=False,
        attn_bias=False,
    )
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
        with np.errstate(all="ignore"):  # NaN/Inf block scales are reported just below, without a warning
            w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        name = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
        name = "tok_embd" if name == "token_embd" else name
        if name in weights:
            raise IntdetError(f"{path}: duplicate tensor name '{t.name}'")
        _check_finite(name, w, path)
        weights[name] = w
    V = weights["tok_embd"].shape[0] if "tok_embd" in weights else None
    vocab_kv = need("vocab_size") if r.fields.get("llama.vocab_size") is not None else None
    try:
        tok, meta = tokenizer_from_gguf(r)
    except ValueError as e:  # missing or malformed tokenizer.ggml.* keys
        raise IntdetError(f"{path}: {e}") from None
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    if V is None:
        raise IntdetError(f"{path}: missing tensor token_embd.weight")
    if vocab_kv is not None and vocab_kv != V:
        raise IntdetError(f"{path}: llama.vocab_size {vocab_kv} disagrees with token_embd rows {V}")
    if n_tokens > V:
        raise IntdetError(f"{path}: tokenizer has {n_tokens} tokens but the embedding has {V} rows")
    hp["vocab_size"] = V
    hp["tied_embeddings"] = "output" not in weights
    # Un-permute Q/K rows to the split-half RoPE pairing.
    # (Only tensors of the right row count: _check_complete reports the others.)
    for i in range(hp["num_layers"]):
        for nm, heads in (("attn_q", nh), ("attn_k", nkv)):
            w = weights.get(f"blk.{i}.{nm}")
            ok = w is not None and w.shape[0] == heads * D and D % 2 == 0
            weights[f"blk.{i}.{nm}"] = _unpermute_rope_rows(w, heads) if ok else w
    _check_complete(weights, hp, path)
    return FloatModel(
        arch="llama", hp=hp, weights=weights, tokenizer=tok, tok_meta=meta,
        source={"kind": "gguf", "name": os.path.basename(path), "sha256": sha256_file(path)},
    )


def _check_complete(weights, hp, where):
    """Every tensor the architecture needs is present with the right shape."""
    H, F, V = hp["hidden_size"], hp["intermediate_size"], hp["vocab_size"]
    nh, nkv, D = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"]
    want = {"tok_embd": (V, H), "output_norm": (H,)}
    if not hp["tied_embeddings"]:
        want["output"] = (V, H)
    for i in range(hp["num_layers"]):
        p = f"blk.{i}."
        want.update({
            p + "attn_norm": (H,), p + "attn_q": (nh * D, H), p + "attn_k": (nkv * D, H),
            p + "attn_v": (nkv * D, H), p + "attn_output": (H, nh * D), p + "ffn_norm": (H,),
            p + "ffn_gate": (F, H), p + "ffn_up": (F, H), p + "ffn_down": (H, F),
        })
        if hp["qk_norm"]:
            want.update({p + "attn_q_norm": (D,), p + "attn_k_norm": (D,)})
        if hp["attn_bias"]:
            want.update({p + "attn_q.bias": (nh * D,), p + "attn_k.bias": (nkv * D,), p + "attn_v.bias": (nkv * D,)})
        if hp.get("o_bias"):
            want[p + "attn_output.bias"] = (H,)
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

HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def _refuse_config(cfg, where, arch):
    """Refuse every config key that would change the arithmetic and that
    intdet does not implement."""
    def bad(key, why):
        raise IntdetError(f"{where}: config.json {key} = {cfg.get(key)!r}: {why}")

    if cfg.get("hidden_act", "silu") != "silu":
        bad("hidden_act", "only silu is supported")
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if rs and (rs.get("rope_type") or rs.get("type") or "default") != "default":
        raise IntdetError(f"{where}: config.json rope_scaling type {rs.get('rope_type') or rs.get('type')!r} is not supported")
    if cfg.get("mlp_bias"):
        bad("mlp_bias", "MLP biases are not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        bad("partial_rotary_factor", "partial RoPE is not supported")
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        bad("use_sliding_window", "sliding-window attention is not supported")
    if arch == "llama" and cfg.get("pretraining_tp", 1) not in (1, None):
        pass  # tensor-parallel slicing does not change the math in inference
    if cfg.get("attention_dropout", 0.0) not in (0, 0.0):
        pass  # dropout is off at inference
    if cfg.get("layer_types") and any(t != "full_attention" for t in cfg["layer_types"]):
        bad("layer_types", "only full attention layers are supported")


def _hf_hparams(cfg, cfg_path, arch) -> dict:
    """config.json -> hp; KeyError/TypeError/ValueError for a missing or
    malformed value, IntdetError for an unsupported feature."""
    _refuse_config(cfg, cfg_path, arch)
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    D = int(cfg.get("head_dim") or H // nh)
    if nh % nkv:
        raise IntdetError(f"{cfg_path}: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    rs = cfg.get("rope_parameters") or {}
    return dict(
        hidden_size=H,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=D,
        vocab_size=int(cfg["vocab_size"]),
        context_length=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=float(cfg.get("rope_theta", rs.get("rope_theta", 10000.0))),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=arch == "qwen3",
        attn_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=arch == "llama" and bool(cfg.get("attention_bias", False)),
    )


def read_hf_dir(path: str) -> FloatModel:
    """Read a Hugging Face checkpoint directory (config.json, *.safetensors,
    tokenizer.json) of LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM.
    Raises IntdetError naming the file for anything missing or unsupported."""
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
    arch = HF_ARCHS.get(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        raise IntdetError(f"{cfg_path}: unsupported architecture {archs!r} (supported: {', '.join(HF_ARCHS)})")
    try:
        hp = _hf_hparams(cfg, cfg_path, arch)
    except KeyError as e:
        raise IntdetError(f"{cfg_path}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise IntdetError(f"{cfg_path}: invalid value ({e})") from None
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise IntdetError(f"{path}: no *.safetensors weights (PyTorch .bin checkpoints are not read)")
    hf = {}
    for fp in files:
        st = SafetensorsFile(fp)
        for n in st.names():
            w = np.array(st.get(n), dtype=np.float32)
            _check_finite(n, w, fp)
            hf[n] = w
    _check_hparams(hp, cfg_path, len(hf))
    weights = _hf_to_canonical(hf, hp, path)
    if hp["tied_embeddings"]:
        weights.pop("output", None)
    elif "output" not in weights:
        raise IntdetError(f"{path}: tie_word_embeddings is false but lm_head.weight is missing")
    _check_complete(weights, hp, path)
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
        arch=arch, hp=hp, weights=weights, tokenizer=tok, tok_meta=tok_meta,
        source={"kind": "hf", "name": os.path.basename(os.path.abspath(path)), "sha256": source_sha256(path)},
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


def _hf_to_canonical(hf, hp, where):
    m = {"model.embed_tokens.weight": "tok_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}
    sub = {
        "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
        "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
        "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
        "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
        "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
        "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down",
    }
    out = {}
    for n, w in hf.items():
        if n in m:
            out[m[n]] = w
            continue
        parts = n.split(".", 3)
        if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit() and parts[3] in sub:
            out[f"blk.{int(parts[2])}.{sub[parts[3]]}"] = w
            continue
        if n.endswith("rotary_emb.inv_freq"):
            continue
        raise IntdetError(f"{where}: unexpected tensor '{n}' (an architecture feature intdet does not implement)")
    return out


def read_source(path: str) -> FloatModel:
    """GGUF file or Hugging Face directory -> FloatModel."""
    if os.path.isdir(path):
        return read_hf_dir(path)
    if not os.path.exists(path):
        raise IntdetError(f"{path}: no such file or directory")
    return read_gguf(path)
