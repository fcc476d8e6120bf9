"""intdet compress: the integer probability table, numpy spec against the
C++ twin bit for bit, and its invariants (sum exactly 2^P, every entry >= 1,
the remainder on the argmax)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intdet import _core
from intdet.compress.table import DIFF_CAP, PRECISION, freq_table

I32_MAX = 2**31 - 1


def both(z, p=PRECISION):
    z = np.ascontiguousarray(np.atleast_2d(z), dtype=np.int32)
    ref = freq_table(z, p)
    got = _core.compress.freq_table(z, p).astype(np.int64)
    np.testing.assert_array_equal(got, ref)
    assert (ref.sum(axis=-1) == 1 << p).all()
    assert (ref >= 1).all()
    return ref


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 700), st.integers(0, 2**32 - 1), st.sampled_from([24, 28, 30]),
       st.sampled_from([1 << 10, 1 << 16, 1 << 22, 1 << 31]))
def test_cpp_matches_spec(V, seed, p, spread):
    rng = np.random.default_rng(seed)
    z = rng.integers(-min(spread, I32_MAX), min(spread, I32_MAX), size=(3, V), dtype=np.int64)
    both(z, p)


def test_edges():
    # one token: all the mass
    assert both(np.array([[123]]))[0, 0] == 1 << PRECISION
    # ties: equal weights, remainder to the lowest id
    f = both(np.zeros((1, 7), dtype=np.int64))[0]
    assert f[0] >= f[1] and len(set(f[1:])) == 1
    z = np.zeros(5, dtype=np.int64)
    z[[2, 4]] = 1000
    f = both(z)[0]
    assert f[2] > f[4] and f[2] - f[4] < 5
    # the extremes of int32: capped gaps, floor 1 for the far tokens
    f = both(np.array([[I32_MAX, -I32_MAX, 0, I32_MAX - DIFF_CAP]]))[0]
    assert list(f[1:]) == [1, 1, 1] and f[0] == (1 << PRECISION) - 3
    # a large vocabulary (262,144, Gemma's) at every precision
    z = np.random.default_rng(1).integers(-20 << 16, 5 << 16, size=(1, 262144))
    for p in (24, 28, 30):
        both(z, p)


def test_exp2_fraction_table_identity():
    """The core looks exp2_neg_q30 up by fraction: exp2_neg_q30(u) ==
    round_shift(exp2_neg_q30(u mod 2^16), u >> 16) for u < 31 * 2^16, 0
    beyond; checked here for every fraction at several shifts."""
    from intdet.ref.intmath import exp2_neg_q30, round_shift

    frac = np.arange(1 << 16)
    base = exp2_neg_q30(frac)
    for k in (0, 1, 7, 15, 16, 29, 30):
        np.testing.assert_array_equal(exp2_neg_q30((k << 16) + frac), round_shift(base, k))
    np.testing.assert_array_equal(exp2_neg_q30((31 << 16) + frac[::97]), 0)
    # and through the core: gaps spread over every shift, weights that matter
    rng = np.random.default_rng(4)
    both(-rng.integers(0, 12 << 16, size=(4, 3000)))


def test_softmax_shape():
    """The frequencies follow exp(logit): two tokens 1 nat apart have a
    frequency ratio e within 2e-5 (u is rounded to 2^-16 of a bit: 1e-5 relative)."""
    z = np.array([[0, -(1 << 16), -(2 << 16)]])
    f = both(z)[0]
    assert abs(f[0] / f[1] - np.e) < 2e-5 * np.e and abs(f[1] / f[2] - np.e) < 2e-5 * np.e


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision"):
        _core.compress.freq_table(np.zeros((1, 4), np.int32), 31)
    with pytest.raises(ValueError, match="precision"):
        freq_table(np.zeros((1, 4)), 23)
    with pytest.raises(ValueError, match="int32"):
        _core.compress.freq_table(np.zeros((1, 4), np.int64), 28)
