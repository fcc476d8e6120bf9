"""The WGSL 64-bit library (intdet/webgpu/wgsl/i64.wgsl) against Python
ints and the numpy spec (intmath): exhaustive on small ranges and word
boundaries, and hypothesis over the whole int64 range."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intdet.ref import intmath
from intdet.webgpu.device import run_kernel

M64 = (1 << 64) - 1
OPS = ["add", "sub", "neg", "lt", "ult", "shl", "sar", "shr", "mul", "umulw", "imulw", "round_shift", "sat32",
       "shift_round_sat32", "bitlen", "floor_div", "round_div", "isqrt", "exp2", "max", "min", "abs", "eq", "sigmoid"]
NOPS = len(OPS)

KERNEL = f"""
@group(0) @binding(0) var<storage, read_write> A: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> B: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> S: array<i32>;
@group(0) @binding(3) var<storage, read_write> O: array<vec2<u32>>;
fn b2(c: bool) -> I64P {{ return I64P(select(0u, 1u, c), 0u); }}
fn w(i: u32, k: u32, v: I64P) {{ O[i * {NOPS}u + k] = v; }}
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x;
    if (i >= arrayLength(&S)) {{ return; }}
    let a = A[i]; let b = B[i]; let s = S[i];
    let us = u32(s) & 63u;
    w(i, 0u, i64_add(a, b)); w(i, 1u, i64_sub(a, b)); w(i, 2u, i64_neg(a));
    w(i, 3u, b2(i64_lt(a, b))); w(i, 4u, b2(u64_lt(a, b)));
    w(i, 5u, i64_shl(a, us)); w(i, 6u, i64_sar(a, us)); w(i, 7u, u64_shr(a, us));
    w(i, 8u, i64_mul(a, b)); w(i, 9u, u32_mul_wide(a.x, b.x)); w(i, 10u, i32_mul_wide(i64_lo(a), i64_lo(b)));
    w(i, 11u, i64_round_shift(a, s)); w(i, 12u, i64_from_i32(i64_sat32(a)));
    w(i, 13u, i64_from_i32(i64_shift_round_sat32(a, s)));
    let aa = i64_abs(a);
    w(i, 14u, i64_from_i32(i64_bitlen(aa)));
    let bp = select(b, I64P(1u, 0u), i64_is_neg(b) || i64_eq(b, I64P(0u, 0u)));
    w(i, 15u, i64_floor_div(a, bp)); w(i, 16u, i64_round_div(a, bp));
    w(i, 17u, i64_isqrt(aa)); w(i, 18u, i64_from_i32(exp2_neg_q30(aa)));
    w(i, 19u, i64_max(a, b)); w(i, 20u, i64_min(a, b)); w(i, 21u, aa); w(i, 22u, b2(i64_eq(a, b)));
    let d = i64_lo(a) & 0x7fffffff;
    w(i, 23u, i64_from_i32(sigmoid_q30(min(d, 1 << 30u), s >= 0)));
}}
"""


def to_pairs(v):
    u = np.array([x & M64 for x in v], dtype=np.uint64)
    return np.stack([(u & 0xFFFFFFFF).astype(np.uint32), (u >> np.uint64(32)).astype(np.uint32)], axis=1)


def s64(x):
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def run(a, b, s):
    n = len(a)
    out = np.zeros((n, NOPS, 2), np.uint32)
    got = run_kernel(KERNEL, [to_pairs(a), to_pairs(b), np.array(s, np.int32), out], ((n + 63) // 64, 1, 1))[3]
    v = got[..., 0].astype(np.uint64) | (got[..., 1].astype(np.uint64) << np.uint64(32))
    return {op: [s64(int(x)) for x in v[:, k]] for k, op in enumerate(OPS)}


def spec(op, a, b, s):
    """Python-int / numpy-spec value of op, or None where the WGSL function's precondition does not hold."""
    lo = lambda x: s64(x & 0xFFFFFFFF if x & 0x80000000 == 0 else (x & 0xFFFFFFFF) - (1 << 32))  # noqa: E731
    bp = b if b > 0 else 1
    us = s & 63
    if op == "add": return s64(a + b)  # noqa: E701
    if op == "sub": return s64(a - b)  # noqa: E701
    if op == "neg": return s64(-a)  # noqa: E701
    if op == "lt": return int(a < b)  # noqa: E701
    if op == "ult": return int(a & M64 < b & M64)  # noqa: E701
    if op == "shl": return s64(a << us)  # noqa: E701
    if op == "sar": return a >> us  # noqa: E701
    if op == "shr": return s64((a & M64) >> us)  # noqa: E701
    if op == "mul": return s64(a * b)  # noqa: E701
    if op == "umulw": return s64((a & 0xFFFFFFFF) * (b & 0xFFFFFFFF))  # noqa: E701
    if op == "imulw": return lo(a) * lo(b)  # noqa: E701
    if op == "round_shift":
        if abs(a) >= 1 << 62 or (s < 0 and abs(a) << min(-s, 62) >= 1 << 63):
            return None
        return int(intmath.round_shift(a, s))
    if op == "sat32": return int(intmath.sat32(a))  # noqa: E701
    if op == "shift_round_sat32": return None if abs(a) >= 1 << 62 else int(intmath.shift_round_sat32(a, s))  # noqa: E701
    if op == "bitlen": return None if a == -(1 << 63) else int(intmath.bitlen(abs(a)))  # noqa: E701
    if op == "floor_div": return None if a == -(1 << 63) else int(intmath.floor_div(a, bp))  # noqa: E701
    if op == "round_div": return None if abs(a) + bp >= 1 << 63 else int(intmath.round_div(a, bp))  # noqa: E701
    if op == "isqrt": return None if a == -(1 << 63) else int(intmath.isqrt(abs(a)))  # noqa: E701
    if op == "exp2": return None if a == -(1 << 63) else int(intmath.exp2_neg_q30(abs(a)))  # noqa: E701
    if op == "max": return max(a, b)  # noqa: E701
    if op == "min": return min(a, b)  # noqa: E701
    if op == "abs": return s64(abs(a))  # noqa: E701
    if op == "eq": return int(a == b)  # noqa: E701
    if op == "sigmoid":
        d = min(lo(a) & 0x7FFFFFFF, 1 << 30)
        den = (1 << 30) + d
        return int(intmath.round_div(1 << 60 if s >= 0 else d << 30, den))
    raise AssertionError(op)


def check(a, b, s):
    got = run(a, b, s)
    for op in OPS:
        for i in range(len(a)):
            want = spec(op, a[i], b[i], s[i])
            if want is not None:
                assert got[op][i] == want, (op, a[i], b[i], s[i], got[op][i], want)


EDGES = [0, 1, -1, 2, 0x7FFFFFFF, -0x7FFFFFFF, 0x80000000, -0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 32) + 1,
         -(1 << 32), (1 << 62) - 1, -(1 << 62) + 1, (1 << 63) - 1, -(1 << 63), 3 << 45, -(5 << 40)]


def test_small_ranges_and_word_edges():
    """Every pair of a small range, and the values around the 32-bit carry and the int64 ends."""
    vals = list(range(-12, 13)) + EDGES + [e + d for e in (1 << 32, 1 << 31, 1 << 62) for d in (-2, -1, 1)]
    a, b, s = [], [], []
    for i, x in enumerate(vals):
        for j, y in enumerate(vals):
            a.append(x)
            b.append(y)
            s.append((i * 7 + j * 3) % 140 - 70)  # shifts over [-70, 69]
    check(a, b, s)


def test_exp2_every_fraction_and_integer_part():
    """exp2_neg_q30 on every u in [0, 32 * 2^16): all fractions at every integer part."""
    u = np.arange(0, 32 << 16, dtype=np.int64)
    src = """
@group(0) @binding(0) var<storage, read_write> U: array<u32>;
@group(0) @binding(1) var<storage, read_write> O: array<i32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x + g.y * 65535u * 64u;
    if (i < arrayLength(&U)) { O[i] = exp2_neg_q30(I64P(U[i], 0u)); }
}"""
    groups = (u.size + 63) // 64
    got = run_kernel(src, [u.astype(np.uint32), np.zeros(u.size, np.int32)], (min(groups, 65535), -(-groups // 65535), 1))[1]
    assert np.array_equal(got, intmath.exp2_neg_q30(u))


def test_isqrt_and_division_small_exhaustive():
    """isqrt of every n < 2^16 and of 2^16 values past 2^32; floor/round division of them by 1..97."""
    n = np.concatenate([np.arange(0, 1 << 16), np.arange(0, 1 << 16) * 65537 + (1 << 32)]).astype(np.int64)
    d = np.arange(n.size, dtype=np.int64) % 97 + 1
    a = np.where(np.arange(n.size) % 2 == 0, n, -n)
    got = run([int(x) for x in a], [int(x) for x in d], [0] * n.size)
    assert got["isqrt"] == [int(x) for x in intmath.isqrt(n)]
    assert got["floor_div"] == [int(x) for x in intmath.floor_div(a, d)]
    assert got["round_div"] == [int(x) for x in intmath.round_div(a, d)]


ints = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 33), 1 << 33), st.sampled_from(EDGES))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ints, ints, st.integers(-70, 70)), min_size=1, max_size=64))
def test_hypothesis_int64_range(rows):
    a, b, s = zip(*rows)
    check(list(a), list(b), list(s))


@pytest.mark.parametrize("pair", [(0x01020304, 0xFF010101), (0x80808080, 0x80808080), (0x7F7F7F7F, 0x81818181)])
def test_dot4_fixed(dot4, pair):
    a, b = pair
    got = _dot4([a], [b], dot4)
    sb = lambda x: [((x >> (8 * k)) & 255) - 256 * (((x >> (8 * k)) & 255) > 127) for k in range(4)]  # noqa: E731
    assert got[0] == sum(p * q for p, q in zip(sb(a), sb(b)))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=256))
def test_dot4_builtin_and_shifts_agree(rows):
    from intdet.webgpu.device import has_dot4

    a, b = zip(*rows)
    shifts = _dot4(a, b, False)
    sb = lambda x: [((x >> (8 * k)) & 255) - 256 * (((x >> (8 * k)) & 255) > 127) for k in range(4)]  # noqa: E731
    assert list(shifts) == [sum(p * q for p, q in zip(sb(x), sb(y))) for x, y in zip(a, b)]
    if has_dot4():
        assert np.array_equal(_dot4(a, b, True), shifts)


def _dot4(a, b, dot4):
    src = """
@group(0) @binding(0) var<storage, read_write> A: array<u32>;
@group(0) @binding(1) var<storage, read_write> B: array<u32>;
@group(0) @binding(2) var<storage, read_write> O: array<i32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&A)) { O[g.x] = dot4_i8(A[g.x], B[g.x]); }
}"""
    n = len(a)
    return run_kernel(src, [np.array(a, np.uint32), np.array(b, np.uint32), np.zeros(n, np.int32)],
                      ((n + 63) // 64, 1, 1), dot4=dot4)[2]
