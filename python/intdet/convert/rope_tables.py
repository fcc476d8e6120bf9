"""RoPE cos/sin tables, computed reproducibly on any IEEE-754 machine.

libm's exp/pow/sin/cos are not correctly rounded and differ between C
libraries, so they are not used: inverse frequencies come from Python's
``decimal`` (``ln`` and ``exp`` are correctly rounded there), and sin/cos from
Cody-Waite range reduction plus Taylor polynomials evaluated with numpy's
float64 add/multiply only (each correctly rounded, fixed order). The tables
are stored in the model file, so the runtime never evaluates a
transcendental function.
"""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np

# pi/2 split in three parts (fdlibm's pio2_1, pio2_2, pio2_2t): the first two
# have 33 significant bits, so k * part is exact for k < 2^20.
PIO2_1 = 1.57079632673412561417e00
PIO2_2 = 6.07710050630396597660e-11
PIO2_2T = 2.02226624879595063154e-21
TWO_OVER_PI = 6.36619772367581382433e-01
MAX_ANGLE = 2.0**19  # keeps k < 2^20 for the exact products above


def inv_freq(theta: float, head_dim: int) -> np.ndarray:
    """theta^(-2i/D) for i in [0, D/2), float64, each correctly rounded."""
    out = []
    with localcontext() as ctx:
        ctx.prec = 40
        ln_t = Decimal(theta).ln()
        for i in range(head_dim // 2):
            out.append(float((-(Decimal(2 * i) / Decimal(head_dim)) * ln_t).exp()))
    return np.array(out, dtype=np.float64)


def _sin_cos_reduced(r):
    """Taylor series of sin and cos on |r| <= pi/4 (terms to r^19: error < 1e-19)."""
    r2 = r * r
    s = np.zeros_like(r)
    c = np.zeros_like(r)
    # Horner from the highest term down; coefficients 1/k! as exact decimals -> float.
    for k in range(19, 0, -2):
        s = s * r2 + 1.0 / float(_fact(k)) * (1 if (k // 2) % 2 == 0 else -1)
    s = s * r
    for k in range(18, -1, -2):
        c = c * r2 + 1.0 / float(_fact(k)) * (1 if (k // 2) % 2 == 0 else -1)
    return s, c


def _fact(k):
    f = 1
    for i in range(2, k + 1):
        f *= i
    return f


def sin_cos(a: np.ndarray):
    """sin and cos of float64 angles 0 <= a < 2^19, reproducible bit for bit."""
    a = np.asarray(a, dtype=np.float64)
    if a.size and (a.min() < 0 or a.max() >= MAX_ANGLE):
        raise ValueError("RoPE angle out of the supported range [0, 2^19)")
    k = np.rint(a * TWO_OVER_PI)
    r = ((a - k * PIO2_1) - k * PIO2_2) - k * PIO2_2T
    s, c = _sin_cos_reduced(r)
    q = k.astype(np.int64) & 3
    sin = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    cos = np.select([q == 0, q == 1, q == 2], [c, -s, -c], s)
    return sin, cos


def rope_tables(theta: float, head_dim: int, n_pos: int, frac_bits: int = 14, scaling: dict | None = None):
    """Q``frac_bits`` int16 tables cos[p, i], sin[p, i] of p * f_i, shape
    [n_pos, D/2] (half-to-even rounding of the float64 values); f_i =
    theta^(-2i/D), changed by ``scaling`` (models/rope_scaling.py) when
    given."""
    from ..models.rope_scaling import scaled_inv_freq

    f = scaled_inv_freq(inv_freq(theta, head_dim), theta, head_dim, scaling)
    pos = np.arange(n_pos, dtype=np.float64)
    ang = pos[:, None] * f[None, :]
    s, c = sin_cos(ang)
    scale = float(1 << frac_bits)
    return np.rint(c * scale).astype(np.int16), np.rint(s * scale).astype(np.int16)
