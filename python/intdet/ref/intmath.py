"""Integer primitives: the one definition every backend must match bit for bit.

All functions take and return numpy int64 arrays (or Python ints) and never
touch floating point. The C++ twins live in ``csrc/include/intdet/intmath.h``
and are compared bit for bit in ``tests/engine/test_intmath.py``.

Rounding convention, used everywhere: **round half up** (toward +inf), i.e.
``floor(x / 2^s + 1/2)``. It is what ``(x + 2^(s-1)) >> s`` computes with an
arithmetic shift, so SIMD and CUDA paths get it in two instructions.

Fixed-point notation: "Qn" means an integer holding ``value * 2^n``.
"""

from __future__ import annotations

import numpy as np

I64 = np.int64
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT16_QMAX = 32767  # int16 activations are symmetric: [-32767, 32767]
INT8_QMAX = 127  # int8 KV cache is symmetric: [-127, 127]

# 2^-f for f in [0, 1), f in Q16, result in Q30: a degree-6 polynomial fitted
# once (least squares on Chebyshev nodes) and frozen as integers. Max error
# against 2^30 * 2^-f is under 5 units of Q30 (5e-9), tested in test_intmath.
EXP2_POLY_Q30 = (1073741824, -744260975, 257938938, -59583045, 10286509, -1369790, 117454)
EXP2_FRAC_BITS = 16  # input format of exp2_neg_q30
LOG2E_Q30 = 1549082005  # round(log2(e) * 2^30)
LN2_Q24 = 11629080  # round(ln(2) * 2^24)


def as_i64(x) -> np.ndarray:
    return np.asarray(x, dtype=I64)


def round_shift(x, s):
    """Round-half-up right shift: floor(x / 2^s + 1/2) for s >= 1; x for s == 0;
    x * 2^-s (exact left shift, caller guarantees no overflow) for s < 0.

    x: int64 array or int, |x| < 2^62. s: int or int64 array broadcastable to x.
    For s >= 63 the result is 0 (|x| < 2^62 guarantees it).
    """
    x = as_i64(x)
    s = as_i64(s)
    pos = np.clip(s, 1, 62)
    right = (x + (I64(1) << (pos - 1))) >> pos
    right = np.where(s >= 63, I64(0), right)
    left = x << np.clip(-s, 0, 62)
    return np.where(s > 0, right, np.where(s == 0, x, left))


def shift_round_sat32(x, s):
    """``round_shift(x, s)`` saturated to int32, where s < 0 (a left shift)
    saturates instead of overflowing. x: int64 with |x| < 2^62."""
    x = as_i64(x)
    s = as_i64(s)
    r = round_shift(x, np.maximum(s, 0))
    t = np.clip(-s, 0, 40)
    # For a left shift by t: saturate when |x| > INT32_MAX >> t.
    lim = I64(INT32_MAX) >> t
    over = np.abs(r) > lim
    shifted = np.where(over, np.sign(r) * I64(INT32_MAX), r << t)
    out = np.where(s < 0, shifted, r)
    return np.clip(out, -INT32_MAX, INT32_MAX)


def floor_div(a, b):
    """Floor division (Python/numpy semantics), b > 0."""
    return as_i64(a) // as_i64(b)


def round_div(a, b):
    """Round-half-up division: floor(a / b + 1/2) computed as
    floor((a + floor(b/2)) / b), b > 0. a: int64, |a| + b < 2^63."""
    a = as_i64(a)
    b = as_i64(b)
    return (a + (b >> 1)) // b


def sat32(x):
    """Saturate to [-(2^31 - 1), 2^31 - 1] (symmetric, so negation is safe)."""
    return np.clip(as_i64(x), -INT32_MAX, INT32_MAX)


def bitlen(x):
    """Number of bits of x >= 0 (bitlen(0) = 0, bitlen(1) = 1, bitlen(255) = 8).
    x: int64 array or int, 0 <= x < 2^63."""
    x = as_i64(x).copy()
    n = np.zeros_like(x)
    for step in (32, 16, 8, 4, 2, 1):
        big = x >= (I64(1) << step)
        n = np.where(big, n + step, n)
        x = np.where(big, x >> step, x)
    return n + (x > 0)


def isqrt(n):
    """floor(sqrt(n)) for 0 <= n < 2^63, exact (bit-by-bit restoring method,
    the same digit recurrence as the C++ ``isqrt_u64``)."""
    n = as_i64(n).copy()
    res = np.zeros_like(n)
    bit = I64(1) << 62
    for _ in range(32):
        take = n >= res + bit
        n = np.where(take, n - (res + bit), n)
        res = np.where(take, (res >> 1) + bit, res >> 1)
        bit >>= 2
    return res


def exp2_neg_q30(u):
    """2^(-u / 2^16) in Q30, for u >= 0 in Q16 (so the result is in [0, 2^30]).

    Integer part i = u >> 16 becomes a rounding right shift; the fraction
    f = u & 0xFFFF goes through ``EXP2_POLY_Q30`` by Horner's rule, each step
    ``c_k + round_shift(p * f, 16)``. This is the shift-plus-polynomial form of
    I-LLM's DI-Exp (arXiv 2405.17849, Sec. 3.3) with a higher-degree fraction
    polynomial so that 15+ bit probabilities stay exact to the last bit.
    """
    u = as_i64(u)
    i = u >> EXP2_FRAC_BITS
    f = u & ((1 << EXP2_FRAC_BITS) - 1)
    p = np.full_like(u, EXP2_POLY_Q30[-1])
    for c in EXP2_POLY_Q30[-2::-1]:
        p = c + round_shift(p * f, EXP2_FRAC_BITS)
    return np.where(i >= 31, I64(0), round_shift(p, np.minimum(i, 31)))


def softcap(x, cap, mant, shift):
    """Soft-capping c * tanh(X / c) (Gemma 2's attention scores and final
    logits; Gemma Team 2024, "Gemma 2", sec. 2.2), integer only.

    x: int64 (int32 range) holding X * k in some fixed-point format (k = 2^16
    for Q16 logits, log2(e) * 2^16 for Q16 log2-domain attention scores).
    cap = round(c * k) (0 < cap < 2^31) and mant / 2^shift ~= 2 log2(e) 2^16 /
    (c * k) (mant < 2^31, shift >= 5), both made at conversion
    (convert/quantize.py softcap_constants). u = round_shift(|x| * mant,
    shift - 4) = 2|X|/c * log2(e) in Q20; its Q16 part gives
    d0 = exp2_neg_q30(u >> 4) and its last 4 bits r a first-order step,
    d = d0 - round_shift(d0 * r * LN2_Q24, 44) = e^(-2|X|/c) (Q30; the step's
    own error is under (16 ln2 / 2^20)^2 / 2 relative). tanh(|X|/c) =
    (1 - d) / (1 + d): t = round_div((2^30 - d) * 2^30, 2^30 + d) in Q30;
    returns sign(x) * round_shift(cap * t, 30), |result| <= cap.
    Error against float64 c*k*tanh(x/(c*k)): tests/engine/test_intmath.py
    test_softcap_error.
    """
    x = as_i64(x)
    u = round_shift(np.abs(x) * I64(mant), I64(shift) - 4)
    d0 = exp2_neg_q30(u >> 4)
    d = d0 - round_shift(d0 * (u & 15) * I64(LN2_Q24), 44)
    one = I64(1) << 30
    t = round_div((one - d) << 30, one + d)
    y = round_shift(I64(cap) * t, 30)
    return np.where(x < 0, -y, y)


def quant16(x, axis=-1):
    """Dynamic power-of-two quantization to int16 along ``axis``.

    x: int64 array. Returns (q, e): q int64 in [-32767, 32767] with
    x ~= q * 2^e, e >= 0 an int64 array with ``axis`` removed. e is the
    smallest shift that makes max|x| >> e fit 15 bits:
    e = max(0, bitlen(max|x|) - 15); q = sat(round_shift(x, e)).
    Power-of-two scales make the dequantization an exact shift, and since
    e depends only on the row, batching and prefill splits cannot change it.
    """
    x = as_i64(x)
    m = np.abs(x).max(axis=axis)
    e = np.maximum(bitlen(m) - 15, 0)
    q = round_shift(x, np.expand_dims(e, axis))
    return np.clip(q, -INT16_QMAX, INT16_QMAX), e


def quant8_row(x, axis=-1):
    """Symmetric absmax int8 quantization along ``axis``: the KV cache's rows
    (the forward passes K and V as int64 [T, nkv, D], one row per token and
    KV head; C++ ``quant8_row`` / ``Kernels::quant8_row``, CUDA's KV append).

    x: int64 array with |x| <= 2^31 - 1. Returns (q, a): q int64 in
    [-127, 127], q = round_div(127 * x, a) with a = max|x| (int64, >= 0;
    a == 0 gives q == 0). The dequantized value is q * a / 127.
    """
    x = as_i64(x)
    a = np.abs(x).max(axis=axis)
    a_safe = np.expand_dims(np.maximum(a, 1), axis)
    q = round_div(127 * x, a_safe)
    return np.clip(q, -INT8_QMAX, INT8_QMAX), a


def normalize_scale15(a):
    """Split a >= 0 (< 2^62) into mantissa and exponent: a ~= m * 2^k with
    k = max(0, bitlen(a) - 15) and m = round_shift(a, k) <= 2^15.
    Keeps score products (raw * m * C) inside int64."""
    a = as_i64(a)
    k = np.maximum(bitlen(a) - 15, 0)
    return round_shift(a, k), k
