"""The reciprocal division (intmath.h recip_u64 / DivBy, the CUDA device's
floor_div and round_div) bit for bit against exact integer division and the
existing round_div: edge divisors and numerators, each call site's largest
numerator, and hypothesis over the whole int64 range. tests/engine/test_cuda.py
runs the same edge cases through the device kernel (emulator and GPU)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from intdet import _core

C = _core.ops
I64 = np.int64
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


def edge_divisors():
    """d = 1, 2, 3, every power of two and its neighbours, 2^31 - 1, 2^32 - 1, ..., 2^63 - 1."""
    ds = {1, 2, 3, 5, 7, 10, 127, 255, 2**31 - 1, 2**32 - 1, 2**32 + 1, 2**62, I64_MAX}
    for k in range(63):
        ds |= {2**k - 1, 2**k, 2**k + 1}
    return sorted(d for d in ds if 1 <= d <= I64_MAX)


def edge_pairs():
    """(a, b) lists: for every edge divisor, a = 0, d - 1, d, d k, d k +- 1
    (k up to the largest multiple in int64), the int64 extremes and their
    negatives, as floor_div defines them."""
    a_s, b_s = [], []
    for d in edge_divisors():
        kmax = I64_MAX // d
        for k in {1, 2, 3, 1000, kmax // 2, kmax - 1, kmax}:
            for n in (d * k - 1, d * k, d * k + 1):
                for a in (n, -n):
                    if I64_MIN <= a <= I64_MAX:
                        a_s.append(a)
                        b_s.append(d)
        for a in (0, 1, -1, d - 1, -(d - 1), I64_MAX, I64_MIN, I64_MIN + 1, I64_MAX - 1):
            a_s.append(a)
            b_s.append(d)
    return a_s, b_s


def round_edge_pairs():
    """edge_pairs where round_div's a + floor(d / 2) fits int64 (its contract)."""
    a_s, b_s = edge_pairs()
    keep = [i for i, (a, d) in enumerate(zip(a_s, b_s)) if a + d // 2 <= I64_MAX]
    return [a_s[i] for i in keep], [b_s[i] for i in keep]


def test_recip_u64_edges():
    ds = edge_divisors() + [2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1]
    got = C.recip_u64(np.array(ds, np.uint64))
    assert got.dtype == np.uint64
    assert [int(g) for g in got] == [(2**64 - 1) // d for d in ds]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 64).flatmap(lambda b: st.integers(2 ** (b - 1), 2**b - 1)), min_size=1, max_size=60))
def test_recip_u64_every_bit_length(ds):
    got = C.recip_u64(np.array(ds, np.uint64))
    assert [int(g) for g in got] == [(2**64 - 1) // d for d in ds]


def test_floor_div_recip_edges():
    a_s, b_s = edge_pairs()
    got = C.floor_div_recip(np.array(a_s, I64), np.array(b_s, I64))
    assert got.tolist() == [a // b for a, b in zip(a_s, b_s)]


def test_round_div_recip_edges():
    a_s, b_s = round_edge_pairs()
    a, b = np.array(a_s, I64), np.array(b_s, I64)
    got = C.round_div_recip(a, b)
    assert got.tolist() == [(ai + bi // 2) // bi for ai, bi in zip(a_s, b_s)]  # floor(a/b + 1/2)
    assert np.array_equal(got, C.round_div(a, b))  # the CPU's division ('/')


def by_bits(lo_bits, hi_bits):
    """Integers of a drawn bit length, so small and large values are equally likely."""
    return st.integers(lo_bits, hi_bits).flatmap(lambda b: st.integers(2 ** (b - 1) if b else 0, 2**b - 1))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(by_bits(0, 63), st.booleans(), by_bits(1, 63)), min_size=1, max_size=60))
def test_floor_and_round_div_recip_random(cases):
    a_s = [-n - 1 if neg else n for n, neg, _ in cases]  # -n - 1 reaches INT64_MIN
    b_s = [d for _, _, d in cases]
    a, b = np.array(a_s, I64), np.array(b_s, I64)
    assert C.floor_div_recip(a, b).tolist() == [x // y for x, y in zip(a_s, b_s)]
    ok = [i for i, (x, y) in enumerate(zip(a_s, b_s)) if x + y // 2 <= I64_MAX]
    ar, br = a[ok], b[ok]
    assert np.array_equal(C.round_div_recip(ar, br), C.round_div(ar, br))


# Each device call site's divisor range and largest |numerator| (kernels_shared.cuh,
# kernels_attention.cu, kernels_moe.cu): RMSNorm r = isqrt(s) in [1, 2^31) against
# |xs g 2^14| <= 2^24 2^15 2^14; quant8's absmax d in [1, 2^31] against 127 |x|;
# the GLU's den in [2^30, 2^31] against 2^60 and d 2^30 <= 2^60; the softmax's
# total in [2^30 - 4, 2^30 2^20] against 2^62.
SITES = {
    "rms_norm": (1, 2**31 - 1, 2**53),
    "quant8": (1, 2**31, 127 * 2**31),
    "glu": (2**30, 2**31, 2**60),
    "softmax": (2**30 - 4, 2**50, 2**62),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SITES)), st.data())
def test_call_site_ranges(site, data):
    dlo, dhi, nmax = SITES[site]
    d = data.draw(st.integers(dlo, dhi))
    ns = data.draw(st.lists(st.integers(-nmax, nmax), min_size=1, max_size=40))
    ns += [nmax, -nmax, 0, d - 1, -(d - 1), d * (nmax // d), d * (nmax // d) - 1]
    a, b = np.array(ns, I64), np.full(len(ns), d, I64)
    assert C.round_div_recip(a, b).tolist() == [(n + d // 2) // d for n in ns]
    assert C.floor_div_recip(a, b).tolist() == [n // d for n in ns]
