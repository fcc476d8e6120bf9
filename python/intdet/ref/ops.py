"""Integer ops of the decoder: the readable spec (numpy, int64 only).

Each op names its input and output fixed-point formats. Shapes use
T = tokens in this call, H = hidden size, N = output features,
K = input features, D = head_dim, P = cached positions.
The C++ core (``csrc/cpu/ops_generic.cpp``) implements the same ops and is
tested bit for bit against these functions.
"""

from __future__ import annotations

import numpy as np

from .intmath import (
    EXP2_FRAC_BITS,
    I64,
    INT32_MAX,
    as_i64,
    bitlen,
    exp2_neg_q30,
    isqrt,
    quant16,
    quant8_row,
    round_div,
    round_shift,
    sat32,
    shift_round_sat32,
    softcap,
)

NORM_TOP_BIT = 24  # RMSNorm pre-shifts each row so max|x| has exactly 24 bits
NORM_OUT_FRAC = 14  # T in the RMSNorm docstring
ROPE_FRAC = 14  # cos/sin tables are Q14 int16
PROB_FRAC = 16  # softmax probabilities are Q16
EPS_FRAC = 60  # rms eps term stored as round(n * eps * 2^60)
S_CAP = 1 << 62


def rms_norm(x, g, eps_q60, in_frac):
    """RMSNorm (Zhang & Sennrich 2019) with gamma, integer only.

    x: int64 [..., n], values in Q``in_frac``. g: int64 [n], gamma as
    round(gamma * 2^G) (G is folded into the next layer's constants).
    eps_q60: round(n * eps * 2^60).
    Steps: pre-shift each row by a = 24 - bitlen(max|x|) (rounding when a < 0)
    so x' has a 24-bit maximum; S = sum x'^2 + eps term (int64, < 2^62 for
    n <= 2^13); r = isqrt(S); y = round_div(x' * g * 2^14, r).
    Returns int64 [..., n] with y ~= (x / rms(x)) * gamma * 2^(14+G) / sqrt(n),
    |y| <= 2^30.
    """
    x = as_i64(x)
    m = np.abs(x).max(axis=-1, keepdims=True)
    a = NORM_TOP_BIT - bitlen(m)
    xs = np.where(a >= 0, x << np.maximum(a, 0), round_shift(x, np.maximum(-a, 0)))
    s = (xs * xs).sum(axis=-1, keepdims=True)
    # eps * n in the units of xs^2: 2^(2*(in_frac + a)) per unit of x^2.
    e_shift = EPS_FRAC - 2 * (in_frac + a)
    t = np.clip(-e_shift, 0, 62)
    left = np.where((-e_shift >= 62) | (I64(eps_q60) > (I64(S_CAP) >> t)), I64(S_CAP), I64(eps_q60) << t)
    eps_term = np.where(e_shift >= 0, round_shift(I64(eps_q60), np.maximum(e_shift, 0)), left)
    s = np.minimum(s + np.minimum(eps_term, S_CAP), S_CAP)
    r = np.maximum(isqrt(s), 1)
    y = round_div(xs * g * (1 << NORM_OUT_FRAC), r)
    return np.where(m == 0, I64(0), y)


def linear(q, e, w, mant, shift, bias=None):
    """W8A16 linear layer with a per-channel dyadic output scale.

    q: int64 [T, K] int16 activations, e: int64 [T] their power-of-two
    exponents (value = q * 2^e * c_in). w: int8 [N, K] per-output-channel
    symmetric weights. mant, shift: int [N], the dyadic scale
    c_in * s_w[n] * 2^F_out ~= mant * 2^-shift (mant < 2^15).
    Int4 layers pass w = dequant_int4(...) (|w| <= 2047, |acc| < 2^26 * K).
    acc = q @ w.T exactly (|acc| < 2^22 * K); out = sat32(round_shift(acc *
    mant, shift - e)) [+ bias in Q F_out, saturating].
    Returns int64 [T, N] holding int32 values in Q F_out.
    """
    acc = as_i64(q) @ as_i64(w).T
    out = shift_round_sat32(acc * as_i64(mant)[None, :], as_i64(shift)[None, :] - as_i64(e)[:, None])
    if bias is not None:
        out = sat32(out + as_i64(bias)[None, :])
    return out


def dequant_int4(w4, gd, gm):
    """Effective integer weights of an int4 linear layer (docs/format.md).

    w4: uint8 [N, K/2], codes u in 0..15 (input 2i in the low nibble of byte
    i, 2i+1 in the high one); gd, gm: int16 [N, K/32] per-group step and
    offset. Returns int64 [N, K]: w = gd * u + gm, |w| <= 2047. ``linear``
    on these weights is the int4 layer's exact definition.
    """
    w4 = np.asarray(w4, dtype=np.uint8)
    N = w4.shape[0]
    u = np.empty((N, 2 * w4.shape[1]), dtype=I64)
    u[:, 0::2] = w4 & 15
    u[:, 1::2] = w4 >> 4
    G = as_i64(gd).shape[1]
    u = u.reshape(N, G, -1)
    return (u * as_i64(gd)[..., None] + as_i64(gm)[..., None]).reshape(N, -1)


def rope(x, cos, sin):
    """Rotary position embedding (Su et al. 2021, RoFormer eq. 34), split-half
    pairing (Hugging Face ``rotate_half``): element i pairs with i + D/2.

    x: int64 [T, nh, D] (|x| < 2^31). cos, sin: int [T, D/2] Q14 tables for
    each token's absolute position. out = sat32(round_shift(x1*cos - x2*sin, 14)),
    sat32(round_shift(x2*cos + x1*sin, 14)).
    """
    x = as_i64(x)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c = as_i64(cos)[:, None, :]
    s = as_i64(sin)[:, None, :]
    o1 = sat32(round_shift(x1 * c - x2 * s, ROPE_FRAC))
    o2 = sat32(round_shift(x2 * c + x1 * s, ROPE_FRAC))
    return np.concatenate([o1, o2], axis=-1)


def softmax_q16(z):
    """Integer softmax over the last axis of log2-domain scores.

    z: int64 [..., P] in Q16 log2 units (score * log2(e) * 2^16). With
    u = max(z) - z >= 0: e = exp2_neg_q30(u) (Q30, <= 2^30), sum = sum(e),
    R = floor(2^62 / sum), p = round_shift(e * R, 46). Returns Q16
    probabilities (int64, each <= 2^16, summing to 2^16 within P units).
    """
    z = as_i64(z)
    u = z.max(axis=-1, keepdims=True) - z
    e = exp2_neg_q30(u)
    tot = e.sum(axis=-1, keepdims=True)
    r = (I64(1) << 62) // tot
    return round_shift(e * r, 62 - PROB_FRAC)


def attention(q, e_q, kc, ka, vc, va, pos, score_mant, score_shift, window=0, score_softcap=None):
    """Causal GQA attention of T new queries over the int8 KV cache.

    q: int64 [T, nh, D] int16 queries with per-(token, head) exponents
    e_q [T, nh]. kc, vc: int64 [P, nkv, D] int8 cache; ka, va: int64 [P, nkv]
    absmax scales. pos: int64 [T] absolute positions (query t sees cache rows
    0..pos[t], or with window W > 0 only max(0, pos[t] - W + 1)..pos[t]:
    sliding-window attention, the key at distance >= W masked as in
    transformers' sliding_window_overlay and llama.cpp's LLAMA_SWA_TYPE_STANDARD).
    score_mant/score_shift: the dyadic constant
    c_q * c_k * log2(e) * 2^16 / (127 * sqrt(D)).
    raw = q . k (exact), ka split as mk * 2^ek (mk <= 2^15);
    z = sat32(round_shift(raw * mk * score_mant, score_shift - e_q - ek)) is Q16
    log2 units; with score_softcap = (cap, inv_mant, inv_shift) (Gemma 2)
    z = softcap(z, ...) (intmath.softcap) first; p = softmax_q16(z). The value weights w = p * va (< 2^47) are
    quantized like an activation row, (w16, s) = quant16(w), so that
    sum_p w16 * vc runs on int16 x int8 products with int32 partial sums;
    out = (sum_p w16 * vc) << s.
    Returns int64 [T, nh, D] with value out / (127 * 2^16) in V's units.
    """
    from .intmath import normalize_scale15

    T, nh, D = q.shape
    nkv = kc.shape[1]
    grp = nh // nkv
    mk, ek = normalize_scale15(ka)  # [P, nkv]
    out = np.zeros((T, nh, D), dtype=I64)
    for t in range(T):
        n = int(pos[t]) + 1
        lo = max(0, n - int(window)) if window else 0
        for h in range(nh):
            kvh = h // grp
            raw = kc[lo:n, kvh, :] @ as_i64(q[t, h])  # [n - lo]
            prod = raw * mk[lo:n, kvh] * I64(score_mant)
            z = shift_round_sat32(prod, I64(score_shift) - e_q[t, h] - ek[lo:n, kvh])
            if score_softcap is not None:
                z = softcap(z, *score_softcap)
            p = softmax_q16(z)
            w16, s = quant16(p * va[lo:n, kvh])
            out[t, h] = (w16 @ vc[lo:n, kvh, :]) << s
    return out


def swiglu(g, u):
    """SiLU(gate) * up (Shazeer 2020), integer only.

    g, u: int64 [T, F] in Q16 (int32 range). sigmoid via exp(-|g|) so that
    neither branch overflows: with w = round_shift(|g| * log2(e)_Q30, 30) (Q16)
    and d = exp2_neg_q30(w) (Q30), sigmoid(g) = round_div(2^60, 2^30 + d) for
    g >= 0 and round_div(d * 2^30, 2^30 + d) otherwise (Q30).
    h = round_shift(g * sigmoid, 30) (Q16); returns h * u (int64, Q32).
    """
    from .intmath import LOG2E_Q30

    g = as_i64(g)
    u = as_i64(u)
    w = round_shift(np.abs(g) * I64(LOG2E_Q30), 30)
    d = exp2_neg_q30(w)
    den = (I64(1) << 30) + d
    sig = np.where(g >= 0, round_div(I64(1) << 60, den), round_div(d << 30, den))
    h = round_shift(g * sig, 30)
    return h * u


# GeGLU's tanh-approximated GELU (Hendrycks & Gimpel 2016, sec. 2) as a
# sigmoid: 0.5 (1 + tanh(z)) = sigmoid(2z), so gelu_tanh(x) = x sigmoid(y) with
# y = 2 sqrt(2/pi) (x + 0.044715 x^3). The exp2 input |y| log2(e) in Q16 is
# round_shift(a * C1 + a^3 * C3, 30) with these Q30 constants (computed in
# 50-digit decimal arithmetic), a = min(|x|, 16) in Q16.
GELU_C1_Q30 = 2471977230  # round(2 sqrt(2/pi) log2(e) 2^30)
GELU_C3_Q30 = 110534462  # round(2 sqrt(2/pi) 0.044715 log2(e) 2^30)
GELU_CLAMP_Q16 = 1 << 20  # |x| >= 16: |y| > 318, e^-|y| is 0 in Q30, so clamping is exact


def geglu(g, u):
    """GELU(gate) * up with GELU's tanh approximation (GeGLU, Shazeer 2020;
    Gemma's ``gelu_pytorch_tanh``), integer only.

    g, u: int64 [T, F] in Q16 (int32 range). With a = min(|g|, 2^20) (Q16),
    a2 = round_shift(a * a, 16), a3 = round_shift(a2 * a, 16) (Q16, < 2^28),
    w = round_shift(a * GELU_C1_Q30 + a3 * GELU_C3_Q30, 30) = |y| log2(e)
    in Q16 (< 2^26) and d = exp2_neg_q30(w) = exp(-|y|) (Q30), the sigmoid
    of y is swiglu's: round_div(2^60, 2^30 + d) for g >= 0, else
    round_div(d * 2^30, 2^30 + d) (Q30). h = round_shift(g * sigmoid, 30)
    (Q16); returns h * u (int64, Q32; |h * u| < 2^62).
    Error of h against float64 gelu_tanh(g / 2^16) * 2^16, measured on every
    g with |g| <= 2^20 and 200,001 points spread over the int32 range
    (tests/engine/test_intmath.py test_geglu_error): at most 0.548 units of Q16
    (8.4e-6 absolute), of which 0.5 is h's own rounding; the rest comes
    from the Q16 rounding of w and of a^3 (exp2's error is < 5e-9).
    """
    g = as_i64(g)
    u = as_i64(u)
    a = np.minimum(np.abs(g), I64(GELU_CLAMP_Q16))
    a2 = round_shift(a * a, 16)
    a3 = round_shift(a2 * a, 16)
    w = round_shift(a * I64(GELU_C1_Q30) + a3 * I64(GELU_C3_Q30), 30)
    d = exp2_neg_q30(w)
    den = (I64(1) << 30) + d
    sig = np.where(g >= 0, round_div(I64(1) << 60, den), round_div(d << 30, den))
    h = round_shift(g * sig, 30)
    return h * u


def argmax_lowest(logits):
    """Greedy pick: index of the maximum, lowest index on ties (np.argmax's
    contract). logits: int [..., V]."""
    return np.argmax(as_i64(logits), axis=-1)


__all__ = [
    "rms_norm",
    "linear",
    "rope",
    "quant8_row",
    "softmax_q16",
    "attention",
    "swiglu",
    "geglu",
    "quant16",
    "argmax_lowest",
    "EXP2_FRAC_BITS",
    "INT32_MAX",
]
