"""Float model -> intdet integer model: the only place where float meets the
integer spec.

Reproducibility: every float step here is a correctly rounded IEEE-754
operation on float64 (multiply, divide, sqrt, rint, frexp, max) applied
element by element, with no sums, no BLAS and no libm transcendental
function, so two machines produce byte-identical files.

Formats produced (see docs/format.md):
- linear weights int8 [N, K], symmetric per output channel:
  q = rint(w / s), s = max|w_row| / 127; or, with ``weights="int4"``, 4-bit
  codes on a per-group (32 inputs) integer grid (quant_rows_int4);
- per-channel dyadic output scales ``mant`` int32 (< 2^15), ``shift`` int32:
  c_in * s * 2^F_out ~= mant * 2^-shift;
- RMSNorm gammas int16: round(gamma * 2^G), max |g| in [2^13, 2^14);
- RoPE tables int16 Q14 (rope_tables.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import IntdetError
from ..format import FORMAT_VERSION, W4_GROUP, W4_MAX, WEIGHT_FORMATS
from ..ref.ops import NORM_OUT_FRAC, PROB_FRAC
from ..models.rope_scaling import attention_factor
from .rope_tables import rope_tables

RESIDUAL_FRAC = 16  # residual stream int32 Q16
PROJ_FRAC = 16  # q/k/v/gate/up/o/down outputs int32 Q16
LOGIT_FRAC = 16  # logits int32 Q16
LOG2E = 1.4426950408889634  # float64 nearest to log2(e)


def dyadic(c: float):
    """Positive float64 c -> (mant, shift) with c ~= mant * 2^-shift and
    2^14 <= mant <= 2^15 (relative error <= 2^-15). c == 0 -> (0, 0)."""
    if c == 0.0:
        return 0, 0
    if not (c > 0.0 and math.isfinite(c)):
        raise IntdetError(f"internal: dyadic scale {c!r} is not a positive finite number")
    m, e = math.frexp(c)  # c = m * 2^e, m in [0.5, 1): exact
    mant = int(np.rint(m * 32768.0))
    return mant, 15 - e


def softcap_constants(c: float, k: float, what: str):
    """Soft-capping c * tanh(X / c) of a value held as x = X * k
    (ref/intmath.py softcap) -> (cap, inv_mant, inv_shift): cap = round(c k)
    and inv_mant / 2^inv_shift ~= 2 log2(e) 2^16 / (c k) with inv_mant in
    [2^30, 2^31). IntdetError naming ``what`` if c k is not in [1, 2^31)."""
    ck = float(c) * k
    if not (math.isfinite(ck) and 1.0 <= ck < 2.0**31 - 1):
        raise IntdetError(f"{what} = {c!r}: soft-capping needs a cap c with c * {k:g} in [1, 2^31)")
    v = 2.0 * LOG2E * 2.0**16 / ck
    m, e = math.frexp(v)  # v = m 2^e, m in [0.5, 1)
    mant, shift = int(np.rint(m * 2.0**31)), 31 - e
    if mant == 2**31:
        mant, shift = 2**30, shift - 1
    if not 5 <= shift <= 62:
        raise IntdetError(f"{what} = {c!r}: soft-capping cap outside the supported range")
    return int(np.rint(ck)), mant, shift


def dyadic_vec(c: np.ndarray):
    """Vector form of ``dyadic``: float64 [N] -> int32 mant [N], int32 shift [N]."""
    c = np.asarray(c, dtype=np.float64)
    m, e = np.frexp(c)
    mant = np.rint(m * 32768.0).astype(np.int64)
    shift = (15 - e).astype(np.int64)
    zero = c == 0.0
    mant[zero] = 0
    shift[zero] = 0
    return mant.astype(np.int32), shift.astype(np.int32)


def quant_rows_int8(w: np.ndarray):
    """Symmetric per-row int8: returns (q int8 [N, K], s float64 [N]) with
    w ~= q * s[:, None]; an all-zero row gets s = 0."""
    w = np.asarray(w, dtype=np.float64)
    amax = np.abs(w).max(axis=1)
    s = amax / 127.0
    safe = np.where(s > 0, s, 1.0)
    q = np.clip(np.rint(w / safe[:, None]), -127, 127).astype(np.int8)
    return q, s


def quant_rows_int4(w: np.ndarray):
    """Per-group asymmetric int4 on an integer grid under a per-row scale.

    w: float [N, K] with K % 32 == 0. Every group of 32 inputs of a row gets
    an integer step ``gd >= 0`` and offset ``gm`` (int16) so that the
    effective integer weight is ``w_eff = gd * u + gm`` for a code u in
    0..15, with |w_eff| <= 2047 (12-bit weights: exact int32 dot blocks of 32
    inputs against int16 activations). Like GGUF Q4_1 (min and step per block
    of 32), so a Q4_1 source keeps its codes; the integer step and offset add
    at most 8 units of 2047 per weight.
    Returns (w4 uint8 [N, K/2]: code of input 2i in the low nibble of byte i,
    2i+1 in the high nibble; gd int16 [N, K/32]; gm int16 [N, K/32];
    s float64 [N]) with w ~= w_eff * s[:, None]. Elementwise float64 only
    (min, max, divide, rint), so reproducible.
    """
    w = np.asarray(w, dtype=np.float64)
    N, K = w.shape
    if K % W4_GROUP:
        raise IntdetError(f"int4 weights need input sizes that are multiples of {W4_GROUP} (got {K})")
    g = w.reshape(N, K // W4_GROUP, W4_GROUP)
    lo, hi = g.min(axis=2), g.max(axis=2)  # [N, G]; min/max are exact in any order
    amax = np.maximum(np.abs(lo), np.abs(hi)).max(axis=1)
    # 2039, not 2047: rounding gm and gd moves gm + 15 gd by at most 0.5 + 7.5.
    s = amax / (W4_MAX - 8)
    safe = np.where(s > 0, s, 1.0)[:, None]
    gm = np.rint(lo / safe)
    gd = np.rint((hi - lo) / 15.0 / safe)
    u = np.rint((g / safe[..., None] - gm[..., None]) / np.where(gd > 0, gd, 1.0)[..., None])
    u = np.clip(np.where(gd[..., None] > 0, u, 0.0), 0, 15).astype(np.uint8).reshape(N, K)
    w4 = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    return w4, gd.astype(np.int16), gm.astype(np.int16), s


def quant_gamma(g: np.ndarray):
    """RMSNorm gamma -> (int16 [n], G) with g_int = rint(gamma * 2^G) and
    max |g_int| in [2^13, 2^14)."""
    g = np.asarray(g, dtype=np.float64)
    amax = float(np.abs(g).max())
    if amax == 0.0:
        return np.zeros(g.shape, np.int16), 0
    _, e = math.frexp(amax)  # amax in [2^(e-1), 2^e)
    G = 14 - e
    gi = np.rint(g * 2.0**G)
    return gi.astype(np.int16), G


def model_config(arch: str, hp: dict, weights: str = "int8") -> dict:
    """The config.json of a converted model (format_version 2) without the
    fixed-point notes: sizes, the integer RMSNorm epsilons, the weight
    format and the per-layer block description ``hp["layers"]``."""
    H, D = hp["hidden_size"], hp["head_dim"]
    cfg = {
        "format": "intdet",
        "format_version": FORMAT_VERSION,
        "architecture": arch,
        **{k: hp[k] for k in (
            "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "vocab_size", "context_length", "rope_theta", "rms_eps", "tied_embeddings")},
        **({"rope_local_theta": hp["rope_local_theta"]} if "rope_local_theta" in hp else {}),
        **({"rope_scaling": hp["rope_scaling"]} if hp.get("rope_scaling") else {}),
        # Only when not 16, so the files of the other families keep their bytes.
        **({"residual_frac_bits": hp["residual_frac"]} if hp.get("residual_frac", 16) != 16 else {}),
        "rms_eps_q60": {
            "hidden": int(np.rint(H * hp["rms_eps"] * 2.0**60)),
            "head": int(np.rint(D * hp["rms_eps"] * 2.0**60)),
            # a projection-wide q/k RMSNorm (OLMo 2) over nh*D and nkv*D features
            **({"q_proj": int(np.rint(hp["num_heads"] * D * hp["rms_eps"] * 2.0**60)),
                "k_proj": int(np.rint(hp["num_kv_heads"] * D * hp["rms_eps"] * 2.0**60))}
               if any(b.get("qk_norm_span") == "projection" for b in hp["layers"]) else {}),
        },
        "layers": hp["layers"],
    }
    if hp.get("final_softcap"):  # absent without (Gemma 2 has it), so other files keep their bytes
        cfg["final_logit_softcap"] = True
    if weights == "int4":  # absent for int8
        cfg["weight_format"] = "int4"
        cfg["weight_group_size"] = W4_GROUP
    return cfg


def model_params(cfg: dict, where: str = "config.json") -> list:
    """The one tensor table (csrc/model/layout.cpp) for a config dict;
    IntdetError naming ``where`` for a config the loader refuses."""
    from .. import _core

    try:
        return _core.model_params(cfg, where)
    except ValueError as e:
        raise IntdetError(str(e)) from None


def source_tensors(hp: dict, where: str) -> dict:
    """Float tensor name -> shape of every source tensor the model is made
    from (rope and attention score scales are derived, not read)."""
    want = {}
    for p in model_params(model_config("", hp), where):
        if p["kind"] in ("embedding", "norm", "post_norm", "linear", "router", "experts") or (p["kind"] == "lm_head" and not hp["tied_embeddings"]):
            want[p["name"]] = tuple(p["shape"])
        if p["bias"]:
            want[p["name"] + ".bias"] = (p["shape"][0],)
    return want


def quantize_model(fm, progress: bool = False, weights: str = "int8") -> tuple[dict, dict]:
    """FloatModel -> (tensors: name -> int array, config dict), one tensor
    table entry (model_params) at a time.

    weights: "int8" (per-channel int8) or "int4" (the decoder layers' linear
    weights as per-group int4, quant_rows_int4; the embedding and lm_head
    stay int8). Raises IntdetError for another value.

    Activations entering each linear layer carry a static factor c_in (the
    value of one unit of the int16 activation at exponent 0):
    - after RMSNorm over n elements: sqrt(n) * 2^-(14 + G);
    - the residual stream itself (blocks without pre-norms, OLMo 2): 2^-R;
    - attention output: 1 / (127 * 2^(16 + PROJ_FRAC));
    - SwiGLU / GeGLU output: 2^-(2 * PROJ_FRAC).

    The residual stream is int32 in Q R, R = hp["residual_frac"] (default
    16; Gemma 3: 10). Folded into existing integers (docs/format.md): the
    embedding scale hp["embed_scale"] into tok_embd's dyadic scale, the
    attention scale hp["attn_scale"] (default 1/sqrt(D)) into attn_score,
    and a post-norm's sqrt(H) into its gamma (post_norm kind).
    """
    hp, W = fm.hp, fm.weights
    D = hp["head_dim"]
    R = hp.get("residual_frac", RESIDUAL_FRAC)
    if weights not in WEIGHT_FORMATS:
        raise IntdetError(f"--weights {weights!r}: choose int8 or int4")
    _check_bounds(hp, weights)
    cfg = model_config(fm.arch, hp, weights)
    T = {}
    norm_exp = {}  # G of every RMSNorm gamma (analysis: int -> real of norm outputs)
    c_of = {"residual": 2.0**-R}  # activation name -> c_in of the layers reading it (no pre-norm: the residual, Q R)

    def put_linear(name, w, c_in, f_out, bias=None, int4=weights == "int4"):
        if int4:
            T[name + ".q4"], T[name + ".gd"], T[name + ".gm"], s = quant_rows_int4(w)
        else:
            T[name + ".q"], s = quant_rows_int8(w)
        T[name + ".mant"], T[name + ".shift"] = dyadic_vec(c_in * s * 2.0**f_out)
        if bias is not None:
            T[name + ".bias"] = _fixed_i32(bias, f_out, name + ".bias")

    from tqdm import tqdm

    params = model_params(cfg)
    bar = tqdm(total=hp["num_layers"], desc="quantize", unit="layer", disable=not progress, leave=False)
    for p in params:
        name, kind, layer = p["name"], p["kind"], p["layer"]
        pre = f"blk.{layer}."
        if kind == "embedding":  # int8 rows, dyadic per-row scale straight to the residual
            T[name + ".q"], s = quant_rows_int8(W[name])
            T[name + ".mant"], T[name + ".shift"] = dyadic_vec(s * hp.get("embed_scale", 1.0) * 2.0**R)
        elif kind == "rope":  # "rope" (rope_theta) or "rope_local" (rope_local_theta: Gemma's local layers)
            theta = hp["rope_local_theta"] if name == "rope_local" else hp["rope_theta"]
            scaling = None if name == "rope_local" else hp.get("rope_scaling")  # local layers keep plain RoPE
            T[name + ".cos"], T[name + ".sin"] = rope_tables(theta, D, hp["context_length"], scaling=scaling)
        elif kind == "post_norm":  # RMSNorm of a branch straight to the residual (Gemma)
            gi, G = quant_gamma(np.asarray(W[name], np.float64) * math.sqrt(p["shape"][0]))
            T[name + ".g"] = gi
            T[name + ".shift"] = np.array([NORM_OUT_FRAC + G - R], np.int32)
            norm_exp[name] = G
        elif kind == "norm":
            gi, G = quant_gamma(W[name])
            T[name + ".g"] = gi
            norm_exp[name] = G
            c_of[name] = math.sqrt(p["shape"][0]) * 2.0 ** -(NORM_OUT_FRAC + G)
        elif kind == "linear":
            c_of[pre + "attn_out"] = 1.0 / (127.0 * 2.0 ** (PROB_FRAC + PROJ_FRAC))
            c_of[pre + "ffn_act"] = 2.0 ** -(2 * PROJ_FRAC)
            # o and down write the residual (Q R), or with post-norms their Q16 input.
            post = "post_attention_norm" in hp["layers"][layer]["norms"]
            f_out = R if p["input"] in (pre + "attn_out", pre + "ffn_act") and not post else PROJ_FRAC
            put_linear(name, W[name], c_of[p["input"]], f_out, W.get(name + ".bias") if p["bias"] else None)
            if name.endswith("ffn_down"):
                bar.update(1)
        elif kind == "router":  # MoE router: int8, straight to Q16 log2 units (the integer softmax's input)
            T[name + ".q"], s = quant_rows_int8(W[name])
            T[name + ".mant"], T[name + ".shift"] = dyadic_vec(c_of[p["input"]] * s * LOG2E * 2.0**16)
        elif kind == "experts":  # [E, N, K]: each expert's rows as a linear's, stored as one tensor
            E, N, K = p["shape"]
            c_of[pre + "ffn_act"] = 2.0 ** -(2 * PROJ_FRAC)  # SwiGLU output Q32
            post = "post_ffw_norm" in hp["layers"][layer]["norms"]
            f_out = R if name.endswith("ffn_down_exps") and not post else PROJ_FRAC
            w = np.asarray(W[name]).reshape(E * N, K)
            if weights == "int4":
                q4, gd, gm, s = quant_rows_int4(w)
                T[name + ".q4"], T[name + ".gd"], T[name + ".gm"] = (
                    q4.reshape(E, N, K // 2), gd.reshape(E, N, K // W4_GROUP), gm.reshape(E, N, K // W4_GROUP))
            else:
                q, s = quant_rows_int8(w)
                T[name + ".q"] = q.reshape(E, N, K)
            mant, shift = dyadic_vec(c_of[p["input"]] * s * 2.0**f_out)
            T[name + ".mant"], T[name + ".shift"] = mant.reshape(E, N), shift.reshape(E, N)
            if name.endswith("ffn_down_exps"):
                bar.update(1)
        elif kind == "attn_score":
            # z (Q16 log2 units) = raw * mk * 2^(e_q + ek) * c_q * c_k * log2(e) / (127 * sqrt(D)) * 2^16;
            # q and k leave their projection in Q16, or a per-head RMSNorm.
            c_q = c_of.get(pre + "attn_q_norm", 2.0**-PROJ_FRAC)
            c_k = c_of.get(pre + "attn_k_norm", 2.0**-PROJ_FRAC)
            af2 = attention_factor(hp.get("rope_scaling")) ** 2  # YaRN scales cos and sin: q.k by its square
            if "attn_scale" in hp or af2 != 1.0:  # Gemma: query_pre_attn_scalar^-0.5
                scale = hp.get("attn_scale", 1.0 / math.sqrt(D)) * af2
                sm, ss = dyadic(c_q * c_k * LOG2E * 2.0**16 * scale / 127.0)
            else:  # 1/sqrt(D), written as before so existing files keep their bits
                sm, ss = dyadic(c_q * c_k * LOG2E * 2.0**16 / (127.0 * math.sqrt(D)))
            T[name + ".mant"] = np.array([sm], np.int32)
            T[name + ".shift"] = np.array([ss], np.int32)
        elif kind == "softcap":  # Gemma 2: of the Q16 log2-domain scores (a layer's) or of the Q16 logits
            c, k, what = ((hp["attn_softcap"], LOG2E * 2.0**16, "attn_logit_softcapping") if layer >= 0
                          else (hp["final_softcap"], 2.0**LOGIT_FRAC, "final_logit_softcapping"))
            vals = softcap_constants(c, k, what)
            for suffix, v in zip((".cap", ".inv_mant", ".inv_shift"), vals):
                T[name + suffix] = np.array([v], np.int32)
        elif kind == "lm_head":
            if hp["tied_embeddings"]:
                _, s_out = quant_rows_int8(W["tok_embd"])
            else:
                T[name + ".q"], s_out = quant_rows_int8(W[name])
            T[name + ".mant"], T[name + ".shift"] = dyadic_vec(c_of[p["input"]] * s_out * 2.0**LOGIT_FRAC)
        else:
            raise IntdetError(f"internal: no quantizer for parameter kind {kind!r}")
    bar.close()
    cfg["fixed_point"] = {
        "residual_frac_bits": R,
        "proj_frac_bits": PROJ_FRAC,
        "logit_frac_bits": LOGIT_FRAC,
        "norm_out_frac_bits": NORM_OUT_FRAC,
        "rope_frac_bits": 14,
        "prob_frac_bits": PROB_FRAC,
        "exp_in_frac_bits": 16,
        "exp_out_frac_bits": 30,
        "activations": "int16 per token, power-of-two scale",
        "weights": "int8 per output channel, dyadic scale (15-bit mantissa)" if weights == "int8" else (
            "decoder linears: int4 codes, per group of 32 inputs w = gd * u + gm (|w| <= 2047), per-channel dyadic "
            "scale; embedding and lm_head int8 per channel"),
        "kv_cache": "int8 per (position, kv head), absmax scale",
    }
    cfg["norm_gamma_exponents"] = norm_exp
    cfg["source"] = fm.source
    return T, cfg


def _fixed_i32(v, frac, name):
    x = np.rint(np.asarray(v, dtype=np.float64) * 2.0**frac)
    if np.abs(x).max(initial=0) > 2**31 - 1:
        raise IntdetError(f"tensor '{name}' does not fit int32 in Q{frac}")
    return x.astype(np.int32)


def _check_bounds(hp, weights="int8"):
    """Refuse models whose sizes could overflow an accumulator (docs/format.md
    derives each bound)."""
    H, F, D = hp["hidden_size"], hp["intermediate_size"], hp["head_dim"]
    nh = hp["num_heads"]
    if weights == "int4":
        for n, k in (("hidden_size", H), ("intermediate_size", F), ("num_heads * head_dim", nh * D)):
            if k % W4_GROUP:
                raise IntdetError(f"--weights int4: {n} = {k} is not a multiple of {W4_GROUP} (int4 groups)")
        if max(H, F, nh * D) >= 1 << 21:
            raise IntdetError("--weights int4: a linear layer's input reaches 2^21 features: int64 accumulator bound")
    if H > 8192 or D > 8192:
        raise IntdetError(f"hidden_size {H} exceeds 8192: RMSNorm's int64 sum of squares could overflow")
    for b in hp.get("layers", ()):
        fm = b.get("moe", {}).get("expert_ffn_size", 0)
        if weights == "int4" and fm % W4_GROUP:
            raise IntdetError(f"--weights int4: expert intermediate size {fm} is not a multiple of {W4_GROUP}")
        if fm > 1 << 24:
            raise IntdetError("an expert's input exceeds 2^24 features: int64 accumulator bound")
    if nh * D > 8192 and any(b.get("qk_norm_span") == "projection" for b in hp.get("layers", ())):
        raise IntdetError(f"num_heads * head_dim = {nh * D} exceeds 8192: the projection-wide q/k RMSNorm's "
                          "int64 sum of squares could overflow")
    if max(H, F, nh * D) > 1 << 24:
        raise IntdetError("a linear layer's input exceeds 2^24 features: int64 accumulator bound")
    if D > 256 or D % 2:
        raise IntdetError(f"head_dim {D} must be even and at most 256 (attention score bound)")
    if hp["context_length"] >= 1 << 19:
        raise IntdetError(f"context_length {hp['context_length']} exceeds 2^19 positions")
