"""The AVX-512 set's row kernels (exp2, softmax, quant16, RMSNorm, the residual add, SwiGLU, GeGLU)
against the scalar set, bit for bit, through intdet._core_simde everywhere
and natively where the CPU runs it (the `avx512` fixture of
tests/engine/test_avx512.py): 8-lane bodies and their tails, the exp2 cut-off at
2^-31, values that round to +-2^15, every gate of the sigmoid's division.
Its attention (the AVX2 tiles and its own softmax row passes) is tested
with every set's in tests/engine/test_attention_tiles.py."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import using_isa
from intdet import _core
from test_avx512 import avx512  # noqa: F401  (the fixture)
from test_intmath import RMS_NORM_KINDS, quant8_inputs, rms_norm_inputs, rope_inputs

I64 = np.int64
FIXTURE = [HealthCheck.function_scoped_fixture]


def scalar(op, *args):
    with using_isa("scalar"):
        return getattr(_core.ops, op)(*args)


def same(got, want):
    if isinstance(want, tuple):
        return all(same(g, w) for g, w in zip(got, want))
    return got.dtype == want.dtype and np.array_equal(got, want)


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), top=st.integers(0, 45))
def test_exp2_matches_scalar(avx512, n, seed, top):
    """u from 0 past 31 << 16 (where 2^-u/65536 drops below 2^-31 and the result is 0)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, (top + 1) << 16, size=n, dtype=I64)
    u[::4] = rng.choice(np.array([0, 1, 65535, 65536, 30 << 16, (31 << 16) - 1, 31 << 16, 2**62], I64),
                        size=len(u[::4]))
    assert same(avx512.ops.exp2_neg_q30(u), scalar("exp2_neg_q30", u))


@pytest.mark.parametrize("case", ["every_fraction", "every_exponent", "int32_extremes", "short_rows"])
def test_softmax_matches_scalar(avx512, case):
    rng = np.random.default_rng(11)
    if case == "every_fraction":
        z = (2**20 - np.arange(2**16 + 3, dtype=I64)).reshape(1, -1)
    elif case == "every_exponent":
        u = (np.arange(0, 40, dtype=I64)[:, None] << 16) + rng.integers(0, 2**16, size=(40, 37))
        z = np.concatenate([np.zeros((40, 1), I64), -u], axis=1)
    elif case == "int32_extremes":
        z = rng.choice(np.array([2**31 - 1, -(2**31) + 1, 0, 2**31 - 2, 2**31 - 65536 * 31], I64), size=(5, 101))
    else:
        z = rng.integers(-(2**22), 2**22, size=(64, 7), dtype=I64)
    for n in sorted({1, 2, 7, 8, 9, 15, 16, 17, z.shape[1]}):
        zz = np.ascontiguousarray(z[:, :n])
        assert same(avx512.ops.softmax_q16(zz), scalar("softmax_q16", zz)), n


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 62),
       kind=st.sampled_from(["random", "rounds_to_limit", "negative_limit", "zeros"]))
def test_quant16_matches_scalar(avx512, n, seed, bits, kind):
    """Including maxima with `bits` bits, which round to +-2^15 and saturate to +-32767."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=(2, n), dtype=I64)
    if kind == "rounds_to_limit" and bits >= 16:
        x[:, ::3] = 2**bits - 1
    elif kind == "negative_limit" and bits >= 16:
        x[:, 1::2] = -(2**bits - 1)
    elif kind == "zeros":
        x[0] = 0
    assert same(avx512.ops.quant16(x), scalar("quant16", x))


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 31))
def test_swiglu_matches_scalar(avx512, n, seed, bits):
    """Gates from 0 to +-(2^31 - 1): exp(-|g|) from 1 down past the 2^-31 cut-off."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-(2**bits) + 1, 2**bits, size=n, dtype=I64)
    g[::5] = rng.choice(np.array([0, 1, -1, 2**31 - 1, -(2**31 - 1), 65536 * 22, -65536 * 22], I64),
                        size=len(g[::5]))
    u = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64)
    assert same(avx512.ops.swiglu(g, u), scalar("swiglu", g, u))


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_sigmoid_division_at_every_gate(avx512, op):
    """The vector sigmoid divides 2^60 by den = 2^30 + exp(-|y|) (Q30) with
    Newton's iteration and corrections (recip60 in avx512.cpp): every gate
    from -23 to 23 in Q16 steps of 1, so den takes every value the exp2
    produces from 2^31 (g = 0) down to 2^30 (exp below 2^-31), both signs,
    with u at its extremes."""
    g = np.arange(-(23 << 16), (23 << 16) + 1, dtype=I64)
    u = np.where(np.arange(g.size) % 3 == 0, 2**31 - 1, -(2**31 - 1)).astype(I64)
    u[2::3] = 12345
    assert same(getattr(avx512.ops, op)(g, u), scalar(op, g, u))


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_rows_beyond_int32_take_the_scalar_path(avx512, op):
    """Gates or ups outside +-(2^31 - 1) (no linear layer makes them; the
    vector products assume int32 operands) still give the scalar bits."""
    # (within the scalar row's own int64 domain: |g| log2(e) 2^30 < 2^63)
    g = np.array([3, -(2**32 - 5), 70000, -5, 1 << 20, 2**32 - 7, 0, 9, -12, 100], I64)
    u = np.array([2**40, 7, -3, 2**31 - 1, 5, -6, 1, 1, 2, -2**35], I64)
    assert same(getattr(avx512.ops, op)(g, u), scalar(op, g, u))
    assert same(getattr(avx512.ops, op)(g[::-1].copy(), u[:: -1].copy()), scalar(op, g[::-1].copy(), u[::-1].copy()))


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 70), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 31))
def test_geglu_matches_scalar(avx512, n, seed, bits):
    """Gemma's tanh-GELU gate on the set's exp2 lanes, gates from 0 to +-(2^31 - 1)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-(2**bits) + 1, 2**bits, size=n, dtype=I64)
    g[::5] = rng.choice(np.array([0, 1, -1, 2**31 - 1, -(2**31 - 1), 65536 * 6, -65536 * 6], I64),
                        size=len(g[::5]))
    u = rng.integers(-(2**31) + 1, 2**31, size=n, dtype=I64)
    assert same(avx512.ops.geglu(g, u), scalar("geglu", g, u))


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 61),
       in_frac=st.integers(0, 40), eps=st.sampled_from([0, 1, 1000, 2**40, 2**60, 2**62 - 1]),
       kind=st.sampled_from(RMS_NORM_KINDS))
def test_rms_norm_matches_scalar(avx512, n, seed, bits, in_frac, eps, kind):
    """RMSNorm on 8 lanes (max, pre-shift, sum of squares, the division by the
    row's r through a reciprocal and two corrections) against the scalar row:
    magnitudes from 1 to 2^61 (pre-shifts left and right), gammas at
    -32768 and 32767, one large element among small ones (the smallest r),
    eps from 0 to its cap, rows of every length across the 8-lane tail."""
    x, g = rms_norm_inputs(seed, n, bits, kind)
    assert same(avx512.ops.rms_norm(x, g, eps, in_frac), scalar("rms_norm", x, g, eps, in_frac))


def test_rms_norm_rows_at_2_62_take_the_scalar_path(avx512):
    """|x| >= 2^62 (outside the lanes' bounds; no layer makes it) gives the scalar bits."""
    x = np.array([[2**62, 5, -7, 1, 2, 3, 4, 5, 6, -(2**61)], [1, 2, 3, 4, 5, 6, 7, 8, 9, -(2**62)]], I64)
    g = np.arange(1, 11, dtype=np.int16) * 1000
    assert same(avx512.ops.rms_norm(x, g, 10, 16), scalar("rms_norm", x, g, 10, 16))


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), bits=st.integers(0, 61))
def test_add_sat32_matches_scalar(avx512, n, seed, bits):
    """The residual add's 8 lanes and tail, sums clamped at +-(2^31 - 1)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**bits), 2**bits + 1, size=n, dtype=I64)
    d = rng.integers(-(2**bits), 2**bits + 1, size=n, dtype=I64)
    d[::3] = rng.choice(np.array([2**31 - 1, -(2**31 - 1), 2**31, -(2**31), 0], I64), size=len(d[::3]))
    assert same(avx512.ops.add_sat32(x, d), scalar("add_sat32", x, d))


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(seed=st.integers(0, 2**32 - 1), nh=st.integers(1, 4), half=st.integers(1, 40),
       bits=st.sampled_from([4, 20, 31, 32, 47]))
def test_rope_matches_scalar(avx512, seed, nh, half, bits):
    """RoPE's 8 lanes, its tail and its scalar fallback (heads beyond int32)."""
    x, cos, sin = rope_inputs(seed, 2, nh, 2 * half, bits)
    assert same(avx512.ops.rope(x, cos, sin), scalar("rope", x, cos, sin))


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), bits=st.sampled_from([0, 1, 7, 20, 31]))
def test_quant8_matches_scalar(avx512, seed, n, bits):
    """The KV rows' int8 quantization: 8 lanes, tails, ties, int32 extremes."""
    x = quant8_inputs(seed, n, bits)
    q, a = avx512.ops.quant8_row(x)
    q0, a0 = scalar("quant8_row", x)
    assert same(q, q0) and same(a, a0)
