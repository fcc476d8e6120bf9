"""RoPE frequency scaling of long-context checkpoints (Llama 3.x, Qwen2.5 /
Qwen3 with YaRN, linear position interpolation): a conversion-time change of
the inverse frequencies the cos/sin tables are built from, plus, for YaRN, an
attention factor folded into the attention score's dyadic scale. No engine
changes: the tables and the score scale are already data.

A scaling is a dict (JSON in config.json "rope_scaling"): ``{"type":
"linear", "factor": f}``, ``{"type": "llama3", "factor", "low_freq_factor",
"high_freq_factor", "original_context_length"}``, ``{"type": "yarn",
"factor", "original_context_length", "beta_fast", "beta_slow",
"attention_factor", "truncate"}``, or ``{"type": "freq_factors", "factors":
[...]}`` (a GGUF's ``rope_freqs`` tensor: llama.cpp divides each frequency by
its factor; its converter writes that tensor for Llama 3's scaling). Dynamic
NTK (its frequencies depend on the sequence length) and LongRoPE (two
factor lists switched by length) are refused by name.

Sources: linear interpolation, Chen et al. 2023 (arXiv:2306.15595); YaRN,
Peng et al. 2023 (arXiv:2309.00071) eq. 17-21, as transformers'
``_compute_yarn_parameters``; Llama 3's smoothing, Meta's llama3 reference
``apply_scaling`` (as transformers' ``_compute_llama3_parameters``).

Reproducibility: theta^(-2i/D) and every logarithm come from ``decimal``
(correctly rounded); the rest is float64 +, -, *, / (IEEE, correctly rounded),
so the tables have the same bits on every machine.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np

from ..errors import IntdetError

TWO_PI = 6.283185307179586  # float64 nearest 2*pi (what 2 * math.pi gives)


def _ln(x: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 40
        return float(Decimal(x).ln())


def _num(rs: dict, key: str, where: str, default=None, positive: bool = True) -> float:
    v = rs.get(key, default)
    if v is None:
        raise IntdetError(f"{where}: rope scaling {rs.get('type')!r} needs {key}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise IntdetError(f"{where}: rope scaling {key} = {v!r} must be a finite positive number")
    return float(v)


def from_hf(cfg: dict, where: str) -> dict | None:
    """config.json rope_scaling / rope_parameters -> a scaling dict, or None
    for plain RoPE; IntdetError naming the type for one no engine runs."""
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rs, dict):
        raise IntdetError(f"{where}: config.json rope_scaling = {str(rs)[:40]!r} is not an object")
    kind = rs.get("rope_type") or rs.get("type") or "default"
    if kind == "default":
        return None
    ctx = cfg.get("max_position_embeddings")
    if kind == "linear":
        return {"type": "linear", "factor": _num(rs, "factor", where)}
    if kind == "llama3":
        out = {"type": "llama3", "factor": _num(rs, "factor", where),
               "low_freq_factor": _num(rs, "low_freq_factor", where),
               "high_freq_factor": _num(rs, "high_freq_factor", where),
               "original_context_length": _num(rs, "original_max_position_embeddings", where, ctx)}
        if out["low_freq_factor"] >= out["high_freq_factor"]:
            raise IntdetError(f"{where}: rope scaling llama3 low_freq_factor must be below high_freq_factor")
        return out
    if kind == "yarn":
        orig = _num(rs, "original_max_position_embeddings", where, ctx)
        factor = rs.get("factor")
        factor = _num(rs, "factor", where) if factor is not None else _num({"f": (ctx or 0) / orig}, "f", where)
        if rs.get("mscale") or rs.get("mscale_all_dim"):
            raise IntdetError(f"{where}: rope scaling yarn with mscale / mscale_all_dim (DeepSeek's form) is not supported")
        af = rs.get("attention_factor")
        return {"type": "yarn", "factor": factor, "original_context_length": orig,
                "beta_fast": _num(rs, "beta_fast", where, 32.0), "beta_slow": _num(rs, "beta_slow", where, 1.0),
                "attention_factor": _num(rs, "attention_factor", where) if af is not None else yarn_mscale(factor),
                "truncate": bool(rs.get("truncate", True))}
    if kind in ("dynamic", "longrope", "su"):
        why = "its frequencies depend on the sequence length" if kind == "dynamic" else \
            "two factor lists switched by sequence length"
        raise IntdetError(f"{where}: config.json rope_scaling type {kind!r} is not supported ({why})")
    raise IntdetError(f"{where}: config.json rope_scaling type {kind!r} is not supported")


def from_gguf(need, where: str, ctx: int) -> dict | None:
    """GGUF <arch>.rope.scaling.* keys -> a scaling dict or None (the
    rope_freqs tensor, if any, is taken by take_freq_factors)."""
    kind = need("rope.scaling.type", str, default="none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _num({"factor": need("rope.scaling.factor", float)}, "factor", where)}
    if kind == "yarn":
        factor = need("rope.scaling.factor", float)
        ext = need("rope.scaling.yarn_ext_factor", float, 1.0)
        if ext != 1.0:
            raise IntdetError(f"{where}: rope scaling yarn_ext_factor {ext!r} is not supported (only 1.0)")
        rs = {"factor": factor, "original_max_position_embeddings": need("rope.scaling.original_context_length"),
              "beta_fast": need("rope.scaling.yarn_beta_fast", float, 32.0),
              "beta_slow": need("rope.scaling.yarn_beta_slow", float, 1.0),
              "type": "yarn"}
        af = need("rope.scaling.yarn_attn_factor", float, 0.0)
        if af:
            rs["attention_factor"] = af
        return from_hf({"rope_scaling": rs, "max_position_embeddings": ctx}, where)
    raise IntdetError(f"{where}: rope scaling {kind!r} is not supported")


def take_freq_factors(weights: dict, hp: dict, where: str) -> None:
    """Move a GGUF's ``rope_freqs`` tensor ([D/2] float: each frequency is
    divided by its factor) out of the weights into hp["rope_scaling"]."""
    f = weights.pop("rope_freqs", None)
    if f is None:
        return
    f = np.asarray(f, dtype=np.float64).reshape(-1)
    if f.shape[0] != hp["head_dim"] // 2 or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise IntdetError(f"{where}: tensor 'rope_freqs' must hold head_dim/2 = {hp['head_dim'] // 2} finite "
                          f"positive factors (has {f.shape[0]})")
    if hp.get("rope_scaling"):
        raise IntdetError(f"{where}: tensor 'rope_freqs' together with rope scaling {hp['rope_scaling']['type']!r}")
    hp["rope_scaling"] = {"type": "freq_factors", "factors": [float(x) for x in f]}


def yarn_mscale(factor: float) -> float:
    """YaRN's attention factor 0.1 * ln(s) + 1 (Peng et al. eq. 21); 1 for s <= 1."""
    return 1.0 if factor <= 1.0 else 0.1 * _ln(factor) + 1.0


def attention_factor(scaling: dict | None) -> float:
    """The factor HF multiplies cos and sin by (so q.k by its square); 1
    unless YaRN."""
    return float(scaling["attention_factor"]) if scaling and scaling["type"] == "yarn" else 1.0


def scaled_inv_freq(base: np.ndarray, theta: float, head_dim: int, scaling: dict | None) -> np.ndarray:
    """base = theta^(-2i/D) (float64 [D/2], rope_tables.inv_freq) -> the
    scaled inverse frequencies, float64 [D/2]."""
    if not scaling:
        return base
    kind = scaling["type"]
    if kind == "linear":
        return base / scaling["factor"]
    if kind == "freq_factors":
        return base / np.asarray(scaling["factors"], dtype=np.float64)
    if kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_context_length"]
        wavelen = TWO_PI / base
        low_wavelen, high_wavelen = old / lo, old / hi
        out = np.where(wavelen > low_wavelen, base / factor, base)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, out)
    if kind == "yarn":
        D, factor, orig = head_dim, scaling["factor"], scaling["original_context_length"]
        ln_theta = _ln(theta)

        def corr_dim(rot):  # the dimension whose wavelength makes `rot` turns over orig positions
            return (D * _ln(orig / (rot * TWO_PI))) / (2 * ln_theta)

        low, high = corr_dim(scaling["beta_fast"]), corr_dim(scaling["beta_slow"])
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(D // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extra = 1 - ramp  # 1: keep the original frequency (fast dims), 0: interpolate
        return (base / factor) * (1 - extra) + base * extra
    raise IntdetError(f"rope scaling type {kind!r} is not supported")
