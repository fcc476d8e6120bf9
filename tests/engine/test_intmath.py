"""Every integer primitive and op: C++ core against the numpy spec, all bits,
on random and boundary inputs; plus the spec against exact math."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import using_isa
from intdet import _core
from intdet.ref import intmath as im
from intdet.ref import ops

C = _core.ops
I64 = np.int64
BIG = 2**62 - 1

ints62 = st.integers(-BIG, BIG)


def arr(xs):
    return np.asarray(xs, dtype=I64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ints62, st.integers(-70, 70)), min_size=1, max_size=50))
def test_round_shift_and_sat(pairs):
    x = arr([p[0] for p in pairs])
    s = arr([p[1] for p in pairs])
    # Left shifts only where they cannot overflow (the contract of round_shift).
    safe = (s >= 0) | (np.abs(x) < (I64(1) << np.clip(62 + s, 0, 62)))
    x, s = x[safe], s[safe]
    assert np.array_equal(C.round_shift(x, s), im.round_shift(x, s))
    for xi, si in zip(x.tolist(), s.tolist()):
        if si > 0:  # exact definition: floor(x / 2^s + 1/2)
            assert int(im.round_shift(xi, si)) == (2 * xi + (1 << si)) // (2 << si)
    x2 = arr([p[0] for p in pairs])
    s2 = arr([p[1] for p in pairs])
    got = C.shift_round_sat32(x2, s2)
    assert np.array_equal(got, im.shift_round_sat32(x2, s2))
    for xi, si, gi in zip(x2.tolist(), s2.tolist(), got.tolist()):
        exact = (2 * xi + (1 << si)) // (2 << si) if si > 0 else xi * 2 ** (-si)
        assert gi == max(-(2**31 - 1), min(2**31 - 1, exact))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**61), 2**61), st.integers(1, 2**61)), min_size=1, max_size=50))
def test_round_div(pairs):
    a = arr([p[0] for p in pairs])
    b = arr([p[1] for p in pairs])
    got = C.round_div(a, b)
    assert np.array_equal(got, im.round_div(a, b))
    for ai, bi, gi in zip(a.tolist(), b.tolist(), got.tolist()):
        assert gi == (2 * ai + bi) // (2 * bi)  # floor(a/b + 1/2) exactly


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=50))
def test_isqrt_bitlen(xs):
    x = arr(xs)
    assert np.array_equal(C.isqrt(x), im.isqrt(x))
    assert im.isqrt(x).tolist() == [math.isqrt(v) for v in xs]
    assert np.array_equal(C.bitlen(x), im.bitlen(x))
    assert im.bitlen(x).tolist() == [v.bit_length() for v in xs]


def test_exp2_all_fractions_and_shifts(isa):
    u = np.arange(0, 40 << 16, 7, dtype=I64)
    u = np.concatenate([u, arr([0, 1, 65535, 65536, (31 << 16) - 1, 31 << 16, 2**40, 2**47 + 5, 2**62, 2**63 - 1])])
    want = im.exp2_neg_q30(u)
    for n in (1, 2, 3, 5, len(u)):  # the SIMD lanes and tails, every input
        assert np.array_equal(C.exp2_neg_q30(u[-n:]), want[-n:]), (isa, n)
    f = np.arange(65536, dtype=I64)
    err = np.abs(im.exp2_neg_q30(f) - 2.0 ** (30 - f / 65536.0))
    assert err.max() < 5  # the documented bound of EXP2_POLY_Q30
    assert im.exp2_neg_q30(0) == 2**30


boundary = st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31 - 1), 2**24, -(2**24), 12345, -7])


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**32), st.booleans())
def test_row_ops_random(n, seed, extremes):
    rng = np.random.default_rng(seed)
    scale = int(rng.integers(0, 31))
    x = rng.integers(-(2**scale), 2**scale + 1, size=(3, n), dtype=I64)
    if extremes:
        x[0, :] = 2**31 - 1
        x[1, ::2] = -(2**31 - 1)
    g = rng.integers(-(2**14) + 1, 2**14, size=n).astype(np.int16)
    eps = int(rng.integers(0, 2**50))
    assert np.array_equal(C.rms_norm(x, g, eps, 16), ops.rms_norm(x, g.astype(I64), eps, 16))
    q, e = C.quant16(x)
    rq, re = im.quant16(x)
    assert np.array_equal(q, rq) and np.array_equal(e, re)
    q8, a8 = C.quant8_row(x)
    rq8, ra8 = im.quant8_row(x)
    assert np.array_equal(q8, rq8) and np.array_equal(a8, ra8)
    z = rng.integers(-(2**26), 2**26, size=(3, n), dtype=I64)
    p = C.softmax_q16(z)
    assert np.array_equal(p, ops.softmax_q16(z))
    assert np.all(np.abs(p.sum(-1) - 2**16) <= n)
    gg = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64) >> int(rng.integers(0, 31))
    uu = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64) >> int(rng.integers(0, 31))
    assert np.array_equal(C.swiglu(gg, uu), ops.swiglu(gg, uu))
    assert np.array_equal(C.geglu(gg, uu), ops.geglu(gg, uu))


@pytest.mark.parametrize("K", [1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 600, 4095, 4096, 4097, 9000])
def test_linear_and_rope(K, isa):
    rng = np.random.default_rng(K)
    T, N = 5, 37  # channels: a 32-wide decode tile, 16- and 8-wide tiles and a partial group
    q = rng.integers(-32767, 32768, size=(T, K)).astype(np.int16)
    q[0] = 32767
    q[1] = -32767
    e = rng.integers(0, 20, size=T).astype(np.int32)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    w[0] = 127
    w[1] = -127
    mant = rng.integers(1 << 14, (1 << 15) + 1, size=N).astype(np.int32)
    # shift - e from -25 (left shifts, saturating) past 62 (rounds to 0): the
    # vector epilogue's range [1, 62] and the scalar code on both sides of it.
    shift = rng.integers(-5, 80, size=N).astype(np.int32)
    want = ops.linear(q, e, w, mant, shift)
    assert np.array_equal(C.linear(q, e, w, mant, shift), want), isa
    assert np.array_equal(C.linear(q[:1], e[:1], w, mant, shift), want[:1]), isa  # decode (T=1) path
    D = 2 * (K % 24 + 1)
    x = rng.integers(-(2**31) + 1, 2**31, size=(T, 3, D), dtype=I64)
    cos = rng.integers(-(2**14), 2**14 + 1, size=(T, D // 2)).astype(np.int16)
    sin = rng.integers(-(2**14), 2**14 + 1, size=(T, D // 2)).astype(np.int16)
    assert np.array_equal(C.rope(x, cos, sin), ops.rope(x, cos, sin))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(T=st.integers(1, 200), N=st.integers(1, 70), K=st.integers(1, 1100), seed=st.integers(0, 2**32 - 1),
       extreme=st.sampled_from(["random", "max", "alternating"]))
def test_linear_tiles_every_isa(isa, T, N, K, seed, extreme):
    """Every tile shape of the packed SIMD GEMM (tokens not a multiple of the
    register tile or the L2 chunk, channels not a multiple of 8/16/32, odd K)
    and the largest sums the bounds allow, all bits against the spec."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-32767, 32768, size=(T, K)).astype(np.int16)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    if extreme == "max":  # every product +32767 * 127: the int32 blocks at their limit
        q[:] = 32767
        w[:] = 127
    elif extreme == "alternating":
        q[:] = -32767
        w[:] = np.where(np.arange(N)[:, None] % 2 == 0, 127, -127)
    e = rng.integers(0, 20, size=T).astype(np.int32)
    mant = rng.integers(1 << 14, (1 << 15) + 1, size=N).astype(np.int32)
    shift = rng.integers(20, 60, size=N).astype(np.int32)
    want = ops.linear(q, e, w, mant, shift)
    assert np.array_equal(C.linear(q, e, w, mant, shift), want), isa


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 62),
       kind=st.sampled_from(["random", "rounds_to_limit", "negative_limit", "zeros"]))
def test_quant16_every_isa(isa, n, seed, bits, kind):
    """int16 per-token quantization: SIMD lanes and tails against the spec,
    including values that round up to +-2^15 (then saturate to +-32767)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=(2, n), dtype=I64)
    if kind == "rounds_to_limit" and bits >= 16:
        x[:, ::3] = (2**bits) - 1  # max has `bits` bits: e = bits - 15, rounds to 2^15
    elif kind == "negative_limit" and bits >= 16:
        x[:, 1::2] = -(2**bits - 1)
    elif kind == "zeros":
        x[0] = 0
    want_q, want_e = im.quant16(x)
    q, e = C.quant16(x)
    assert np.array_equal(q, want_q) and np.array_equal(e, want_e), isa


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 61))
def test_add_sat32_every_isa(isa, n, seed, bits):
    """The residual add sat32(x + d) on every ISA against Python integers:
    sums inside int32, at +-(2^31 - 1) and beyond it on both sides."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=n, dtype=I64)
    d = rng.integers(-(2**bits), 2**bits + 1, size=n, dtype=I64)
    d[::3] = rng.choice(np.array([2**31 - 1, -(2**31 - 1), 2**31, -(2**31), 0], I64), size=len(d[::3]))
    want = np.array([max(-(2**31 - 1), min(2**31 - 1, int(a) + int(b))) for a, b in zip(x, d)], I64)
    assert np.array_equal(C.add_sat32(x, d), want), isa


def quant8_inputs(seed, n, bits):
    """x [4, n] int64 for the KV rows' int8 quantization (here and
    tests/engine/test_avx512_rows.py): random `bits`-bit rows, a row holding its
    absmax at both signs with the values whose 127 x / d lands on a half
    (round_div's ties), a zero row, and a row reaching int32's extremes
    +-(2^31 - 1) (the domain's edge; ops.quant8_row refuses anything beyond)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=(4, n), dtype=I64)
    d = max(int(np.abs(x[1]).max()), 2)
    x[1, 0] = d
    x[1, -1] = -d
    if n > 2:  # 127 x = d (k + 1/2) for even d: exactly half-way
        x[1, 1:-1:2] = d // 2 if d % 2 == 0 else (d - 1) // 2
    x[2] = 0
    x[3, n // 2] = 2**31 - 1
    x[3, 0] = -(2**31 - 1)
    return x


def test_quant8_python_reference():
    """im.quant8_row against round_div in Python integers on a few exact ties."""
    x = np.array([[254, 127, -127, 1, -1, 0, 2, -2]], I64)
    q, a = im.quant8_row(x)
    want = [max(-127, min(127, (127 * int(v) + 127) // 254)) for v in x[0]]
    assert a.tolist() == [254] and q[0].tolist() == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), bits=st.sampled_from([0, 1, 7, 20, 31]))
def test_quant8_every_isa(isa, seed, n, bits):
    """The KV cache rows' int8 quantization (ks.quant8_row) on every ISA against
    the numpy spec: 8-lane blocks and tails, ties, zero rows, int32 extremes."""
    x = quant8_inputs(seed, n, bits)
    if bits == 31:  # int32's extremes, both signs
        x[0, ::3] = 2**31 - 1
        x[0, 1::3] = -(2**31 - 1)
    q, a = C.quant8_row(x)
    rq, ra = im.quant8_row(x)
    assert np.array_equal(q, rq) and np.array_equal(a, ra), isa
    with using_isa("scalar"):
        q0, a0 = C.quant8_row(x)
    assert np.array_equal(q, q0) and np.array_equal(a, a0), isa


def rope_inputs(seed, T, nh, D, bits):
    """x [T, nh, D] int64 with `bits`-bit magnitudes (up to the binding's
    2^47; the forward's are int32), elements at +-(2^31 - 1) and, in one
    head, at +-2^31 when bits allows (that head leaves the vector lanes), and
    cos/sin [T, D/2] int16 over the whole range with -32768 and 32767 in it
    (here and tests/engine/test_avx512_rows.py)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits) + 1, 2**bits, size=(T, nh, D), dtype=I64)
    x[:, :, ::5] = rng.choice(np.array([2**31 - 1, -(2**31 - 1), 0], I64), size=x[:, :, ::5].shape)
    if bits > 31 and nh > 1:
        x[:, 1, 0] = 2**31
        x[:, 1, -1] = -(2**31)
    cos = rng.integers(-(2**15), 2**15, size=(T, D // 2), dtype=np.int16)
    sin = rng.integers(-(2**15), 2**15, size=(T, D // 2), dtype=np.int16)
    cos[:, 0], sin[:, -1] = -(2**15), 2**15 - 1
    return x, cos, sin


def rope_python(x, cos, sin):
    """RoPE with Python integers (ref/ops.py rope's formula, no int64 wrap)."""
    def sat(v):
        return max(-(2**31 - 1), min(2**31 - 1, v))

    def rs(v):
        return (v + (1 << 13)) >> 14
    out = np.empty_like(x)
    h = x.shape[2] // 2
    for t in range(x.shape[0]):
        for hd in range(x.shape[1]):
            for i in range(h):
                a, b, c, s = int(x[t, hd, i]), int(x[t, hd, h + i]), int(cos[t, i]), int(sin[t, i])
                out[t, hd, i] = sat(rs(a * c - b * s))
                out[t, hd, h + i] = sat(rs(b * c + a * s))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 3), nh=st.integers(1, 4), half=st.integers(1, 40),
       bits=st.sampled_from([4, 20, 31, 32, 40, 47]))
def test_rope_every_isa(isa, seed, T, nh, half, bits):
    """RoPE on every ISA (the forward's ks.rope) against Python integers: head
    sizes 2..80 (8-lane blocks and tails), int32 extremes, int16 cos/sin
    extremes, heads beyond int32 (the AVX-512 row's scalar fallback)."""
    x, cos, sin = rope_inputs(seed, T, nh, 2 * half, bits)
    want = rope_python(x, cos, sin)
    assert np.array_equal(C.rope(x, cos, sin), want), isa
    if bits <= 31:  # the spec's domain
        assert np.array_equal(ops.rope(x, cos, sin), want)


RMS_NORM_KINDS = ["random", "one_large", "gamma_extremes", "zeros", "tiny", "beyond_2_62"]


def rms_norm_inputs(seed, n, bits, kind):
    """x [3, n] int64 with `bits`-bit magnitudes and g [n] int16 for the
    RMSNorm comparisons (here and tests/engine/test_avx512_rows.py): one large
    element among small ones (the smallest r), gammas at -32768 and 32767, a
    zero row, tiny values, an element at +-2^62 (the scalar row's path)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=(3, n), dtype=I64)
    g = rng.integers(-(2**15), 2**15, size=n, dtype=np.int16)
    if kind == "one_large":
        x[:, :] = rng.integers(-1, 2, size=(3, n))
        x[:, n // 2] = rng.choice([2**bits, -(2**bits)])
    elif kind == "gamma_extremes":
        g[::2] = -(2**15)
        g[1::2] = 2**15 - 1
    elif kind == "zeros":
        x[0] = 0
    elif kind == "tiny":
        x = rng.integers(-2, 3, size=(3, n), dtype=I64)
    elif kind == "beyond_2_62":
        x[1, rng.integers(0, n)] = rng.choice([2**62, -(2**62)])
    return x, g


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 61),
       in_frac=st.integers(0, 40), eps=st.sampled_from([0, 1, 1000, 2**40, 2**60, 2**62 - 1]),
       kind=st.sampled_from(RMS_NORM_KINDS))
def test_rms_norm_every_isa(isa, n, seed, bits, in_frac, eps, kind):
    """RMSNorm on every ISA (the AVX2 and AVX-512 rows divide by the row's r
    through a reciprocal and two corrections) against the scalar set, bit
    for bit: magnitudes from 1 to 2^61 (pre-shifts left and right), one
    large element among small ones (the smallest r), gammas at -32768 and
    32767, eps from 0 to its cap, lengths across the lanes' tails, and
    elements at or past 2^62 (the scalar row's path)."""
    x, g = rms_norm_inputs(seed, n, bits, kind)
    with using_isa("scalar"):
        want = C.rms_norm(x, g, eps, in_frac)
    assert np.array_equal(C.rms_norm(x, g, eps, in_frac), want), isa


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 31))
def test_swiglu_every_isa(isa, n, seed, bits):
    """SwiGLU (Q16 in, Q32 out) on every ISA: gates from 0 to +-(2^31 - 1),
    so exp(-|g|) runs from 1 down past the 2^-31 cut-off."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-(2**bits) + 1, 2**bits, size=n, dtype=I64)
    g[::5] = rng.choice(np.array([0, 1, -1, 2**31 - 1, -(2**31 - 1), 65536 * 22, -65536 * 22], I64), size=len(g[::5]))
    u = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64)
    want = ops.swiglu(g, u)
    assert np.array_equal(C.swiglu(g, u), want), isa


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_every_gate_every_isa(isa, op):
    """Every gate from -23 to 23 in Q16 steps of 1 (the vector sets divide
    2^60 by every den = 2^30 + exp(-|y|) the exp2 makes; recip60 in avx2.cpp
    and avx512.cpp), u at +-(2^31 - 1), against the scalar set, and a row
    beyond int32 (the scalar path)."""
    g = np.arange(-(23 << 16), (23 << 16) + 1, dtype=I64)
    u = np.where(np.arange(g.size) % 2 == 0, 2**31 - 1, -(2**31 - 1)).astype(I64)
    got = getattr(C, op)(g, u)
    with using_isa("scalar"):
        want = getattr(C, op)(g, u)
    assert np.array_equal(got, want), isa
    g2, u2 = np.array([3, -(2**32 - 5), 7, 100], I64), np.array([2**40, 7, -3, 5], I64)
    assert np.array_equal(getattr(C, op)(g2, u2), getattr(ops, op)(g2, u2)), isa


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 31))
def test_geglu_every_isa(isa, n, seed, bits):
    """GeGLU (Q16 in, Q32 out) on every ISA: gates from 0 to +-(2^31 - 1),
    across the |g| = 16 clamp (2^20) and exp(-|y|)'s cut-off."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-(2**bits) + 1, 2**bits, size=n, dtype=I64)
    edges = np.array([0, 1, -1, 2**31 - 1, -(2**31 - 1), 2**20, -(2**20), 2**20 - 1, 2**20 + 1, 65536 * 5], I64)
    g[::4] = rng.choice(edges, size=len(g[::4]))
    u = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64)
    assert np.array_equal(C.geglu(g, u), ops.geglu(g, u)), isa


def test_geglu_error():
    """The bound stated in ref/ops.py geglu: against float64 tanh-GELU, every
    Q16 gate with |g| <= 2^20 and 200,001 gates over the int32 range are
    within 0.548 units of Q16 (0.5 of them h's own rounding)."""
    g = np.concatenate([np.arange(-(2**20), 2**20 + 1, dtype=I64),
                        np.linspace(-(2**31 - 1), 2**31 - 1, 200001).astype(I64)])
    h = ops.geglu(g, np.ones_like(g))  # u = one unit: h itself, Q16
    x = g / 65536.0
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))) * 65536.0
    err = np.abs(h - want)
    assert err.max() <= 0.548
    assert err.max() > 0.5  # the bound is tight: it is measured, not assumed
    assert np.array_equal(C.geglu(g[::97], np.ones_like(g[::97])), h[::97])


@pytest.mark.parametrize("case", ["every_fraction", "every_exponent", "int32_extremes", "short_rows"])
def test_softmax_every_isa(case, isa):
    """The SIMD exp2 lanes against the spec: every Q16 fraction below the max,
    exponents across the 2^-31 cut-off, and scores at the int32 limits."""
    rng = np.random.default_rng(7)
    if case == "every_fraction":
        z = (2**20 - np.arange(2**16 + 3, dtype=I64)).reshape(1, -1)
    elif case == "every_exponent":
        u = (np.arange(0, 40, dtype=I64)[:, None] << 16) + rng.integers(0, 2**16, size=(40, 37))
        z = np.concatenate([np.zeros((40, 1), I64), -u], axis=1)
    elif case == "int32_extremes":
        z = rng.choice(np.array([2**31 - 1, -(2**31) + 1, 0, 2**31 - 2, 2**31 - 65536 * 31, 2**31 - 65536 * 30], I64),
                       size=(5, 101))
    else:
        z = rng.integers(-(2**22), 2**22, size=(64, 7), dtype=I64)
    want = ops.softmax_q16(z)
    for n in sorted({1, 2, 3, 4, 5, z.shape[1]}):
        zz = np.ascontiguousarray(z[:, :n])
        assert np.array_equal(C.softmax_q16(zz), ops.softmax_q16(zz)), (isa, n)
    assert np.array_equal(C.softmax_q16(z), want), isa


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 511, 512, 513, 1100])
@pytest.mark.parametrize("D", [16, 48, 64, 72, 128])
def test_attention_reference_matches_spec(n, D):
    """ops.attend, the scalar attend_head that the kernel sets' tiles
    (tests/engine/test_attention_tiles.py) and the CUDA kernels are compared with,
    against the numpy spec."""
    rng = np.random.default_rng(n * 1000 + D)
    q = rng.integers(-32767, 32768, size=D).astype(np.int16)
    kc = rng.integers(-127, 128, size=(n, D)).astype(np.int8)
    vc = rng.integers(-127, 128, size=(n, D)).astype(np.int8)
    ka = rng.integers(0, 2**31, size=n).astype(np.int32)
    va = rng.integers(0, 2**31, size=n).astype(np.int32)
    if n > 2:
        kc[1], vc[2], ka[0], va[1] = 127, -127, 2**31 - 1, 0  # extremes
    e_q, sm, ss = int(rng.integers(0, 16)), int(rng.integers(1 << 14, 1 << 15)), int(rng.integers(20, 60))
    want = ops.attention(
        q.astype(I64)[None, None], np.array([[e_q]], I64), kc.astype(I64)[:, None], ka.astype(I64)[:, None],
        vc.astype(I64)[:, None], va.astype(I64)[:, None], np.array([n - 1]), sm, ss)[0, 0]
    assert np.array_equal(C.attend(q, e_q, kc, ka, vc, va, sm, ss), want)


def _int4_layer(rng, N, K, extreme):
    """Random int4 codes and group scales inside the format's bound
    |gd * u + gm| <= 2047, or the bound's corners."""
    G = K // 32
    w4 = rng.integers(0, 256, size=(N, K // 2)).astype(np.uint8)
    gd = rng.integers(0, 273, size=(N, G))
    gm = rng.integers(-2047, 2048, size=(N, G))
    gm = np.clip(gm, -2047, 2047 - 15 * gd)  # both ends of the grid inside +-2047
    if extreme == "max":  # every weight +2047 or -2047 and every code 15: the int32 group blocks at their limit
        w4[:] = 0xFF
        gd[:] = 272
        gm[:] = np.where(np.arange(N)[:, None] % 2 == 0, 2047 - 15 * 272, -2047)
        gd[1::2] = 0
    return w4, gd.astype(np.int16), gm.astype(np.int16)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(T=st.integers(1, 200), N=st.integers(1, 70), G=st.integers(1, 34), seed=st.integers(0, 2**32 - 1),
       extreme=st.sampled_from(["random", "max", "alternating"]))
def test_linear_w4_every_isa(isa, T, N, G, seed, extreme):
    """The int4 linear layer (W4A16) on every kernel set against the spec
    (dequant_int4 + linear), all bits: token tiles and channel groups not a
    multiple of the SIMD tiles, and the largest group sums the bound allows."""
    K = 32 * G
    rng = np.random.default_rng(seed)
    q = rng.integers(-32767, 32768, size=(T, K)).astype(np.int16)
    w4, gd, gm = _int4_layer(rng, N, K, extreme)
    if extreme == "max":
        q[:] = 32767
    elif extreme == "alternating":
        q[:] = np.where(np.arange(K) % 2 == 0, -32767, 32767)
        w4[:] = 0x0F  # codes 15, 0, 15, 0, ...: products of one sign where q flips
    e = rng.integers(0, 20, size=T).astype(np.int32)
    mant = rng.integers(1 << 14, (1 << 15) + 1, size=N).astype(np.int32)
    shift = rng.integers(20, 60, size=N).astype(np.int32)
    w = ops.dequant_int4(w4, gd, gm)
    assert np.abs(w).max() <= 2047
    want = ops.linear(q, e, w, mant, shift)
    assert np.array_equal(C.linear_w4(q, e, w4, gd, gm, mant, shift), want), isa


def test_dequant_int4_layout():
    """Nibble order and group indexing of the int4 format (docs/format.md),
    checked against a direct per-element definition."""
    rng = np.random.default_rng(7)
    N, K = 3, 96
    w4, gd, gm = _int4_layer(rng, N, K, "random")
    w = ops.dequant_int4(w4, gd, gm)
    for n in range(N):
        for k in range(K):
            u = (int(w4[n, k // 2]) >> (4 * (k % 2))) & 15
            assert w[n, k] == int(gd[n, k // 32]) * u + int(gm[n, k // 32])


@pytest.mark.parametrize("c, k", [(50.0, math.log2(math.e) * 65536), (30.0, 65536.0), (1.5, 65536.0), (1000.0, 65536.0)],
                         ids=["gemma2-scores", "gemma2-logits", "small-cap", "large-cap"])
def test_softcap_error(c, k):
    """ref/intmath.py softcap against float64 c k tanh(x / (c k)): within
    0.5 + cap / 2^22 units (0.5 the output's rounding, the rest the Q30 tanh
    and the exp2 of the Q20 exponent), every x in [-2^22, 2^22) (step 7) and
    200,001 points over the int32 range; the C++ twin (intmath.h, all
    backends) gives the same bits; odd and saturating at +-cap."""
    from intdet.convert.quantize import softcap_constants

    cap, mant, shift = softcap_constants(c, k, "c")
    x = np.concatenate([np.arange(-(2**22), 2**22, 7, dtype=I64),
                        np.linspace(-(2**31 - 1), 2**31 - 1, 200001).astype(I64)])
    y = im.softcap(x, cap, mant, shift)
    err = np.abs(y - c * k * np.tanh(x / (c * k)))
    assert err.max() <= 0.5 + cap / 2**22, err.max()
    assert err.max() > 0.25  # measured, not assumed
    assert np.array_equal(y, -im.softcap(-x, cap, mant, shift)) and np.abs(y).max() == cap
    assert np.array_equal(C.softcap(x[::13], cap, mant, shift), y[::13])


def test_softcap_constants_refuse_bad_caps():
    from intdet.convert.quantize import softcap_constants
    from intdet.errors import IntdetError

    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e6):
        with pytest.raises(IntdetError, match="final_logit_softcapping"):
            softcap_constants(bad, 65536.0, "final_logit_softcapping")
