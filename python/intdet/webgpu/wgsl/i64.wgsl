// Portable 64-bit integer arithmetic on 32-bit pairs (browser WGSL has no
// i64; shader-int64 is a native-only extension). An I64P is the two's
// complement value lo + 2^32 hi as vec2<u32>(lo, hi). Every function is the
// exact twin of an int64 numpy expression of python/intdet/ref/intmath.py
// (wrapping like numpy where the spec could wrap); tests/webgpu/test_i64.py
// compares them against Python ints.

alias I64P = vec2<u32>;

const INT32_MAX: i32 = 2147483647;

fn i64_from_i32(a: i32) -> I64P { return I64P(bitcast<u32>(a), select(0u, 0xffffffffu, a < 0)); }
fn i64_from_u32(a: u32) -> I64P { return I64P(a, 0u); }
// The low word as i32: the value itself whenever it fits int32.
fn i64_lo(a: I64P) -> i32 { return bitcast<i32>(a.x); }

fn i64_add(a: I64P, b: I64P) -> I64P {
    let lo = a.x + b.x;
    return I64P(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn i64_sub(a: I64P, b: I64P) -> I64P {
    return I64P(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn i64_neg(a: I64P) -> I64P { return i64_sub(I64P(0u, 0u), a); }
fn i64_is_neg(a: I64P) -> bool { return (a.y & 0x80000000u) != 0u; }
fn i64_abs(a: I64P) -> I64P { return select(a, i64_neg(a), i64_is_neg(a)); }
fn i64_eq(a: I64P, b: I64P) -> bool { return a.x == b.x && a.y == b.y; }
fn i64_lt(a: I64P, b: I64P) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}
fn u64_lt(a: I64P, b: I64P) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn i64_max(a: I64P, b: I64P) -> I64P { return select(a, b, i64_lt(a, b)); }
fn i64_min(a: I64P, b: I64P) -> I64P { return select(a, b, i64_lt(b, a)); }

// a << s (wrapping), 0 <= s <= 63.
fn i64_shl(a: I64P, s: u32) -> I64P {
    if (s == 0u) { return a; }
    if (s >= 32u) { return I64P(0u, a.x << (s - 32u)); }
    return I64P(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}
// Arithmetic a >> s, 0 <= s <= 63 (floor division by 2^s).
fn i64_sar(a: I64P, s: u32) -> I64P {
    if (s == 0u) { return a; }
    let h = bitcast<i32>(a.y);
    if (s >= 32u) { return I64P(bitcast<u32>(h >> (s - 32u)), bitcast<u32>(h >> 31u)); }
    return I64P((a.x >> s) | (a.y << (32u - s)), bitcast<u32>(h >> s));
}
// Logical a >> s for a read as unsigned, 0 <= s <= 63.
fn u64_shr(a: I64P, s: u32) -> I64P {
    if (s == 0u) { return a; }
    if (s >= 32u) { return I64P(a.y >> (s - 32u), 0u); }
    return I64P((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// Full 32x32 -> 64-bit products from 16-bit halves.
fn u32_mul_wide(a: u32, b: u32) -> I64P {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return I64P((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn i32_mul_wide(a: i32, b: i32) -> I64P {
    // |a| as u32 is right for a = -2^31 too (0 - 2^31 wraps to 2^31).
    let ua = select(bitcast<u32>(a), 0u - bitcast<u32>(a), a < 0);
    let ub = select(bitcast<u32>(b), 0u - bitcast<u32>(b), b < 0);
    let p = u32_mul_wide(ua, ub);
    return select(p, i64_neg(p), (a < 0) != (b < 0));
}
// a * b modulo 2^64 (numpy's int64 product).
fn i64_mul(a: I64P, b: I64P) -> I64P {
    let p = u32_mul_wide(a.x, b.x);
    return I64P(p.x, p.y + a.x * b.y + a.y * b.x);
}
fn i64_mul_i32(a: I64P, b: i32) -> I64P { return i64_mul(a, i64_from_i32(b)); }

// intmath.round_shift: floor(x / 2^s + 1/2) for s >= 1 (0 for s >= 63), x
// for s == 0, x << min(-s, 62) for s < 0.
fn i64_round_shift(x: I64P, s: i32) -> I64P {
    if (s >= 63) { return I64P(0u, 0u); }
    if (s > 0) { return i64_sar(i64_add(x, i64_shl(I64P(1u, 0u), u32(s - 1))), u32(s)); }
    if (s == 0) { return x; }
    return i64_shl(x, u32(min(-s, 62)));
}
// intmath.sat32: clamp to [-(2^31 - 1), 2^31 - 1].
fn i64_sat32(x: I64P) -> i32 {
    if (i64_lt(x, i64_from_i32(-INT32_MAX))) { return -INT32_MAX; }
    if (i64_lt(i64_from_i32(INT32_MAX), x)) { return INT32_MAX; }
    return i64_lo(x);
}
// intmath.shift_round_sat32: round_shift saturated to int32, where a left
// shift (s < 0) saturates instead of overflowing.
fn i64_shift_round_sat32(x: I64P, s: i32) -> i32 {
    if (s >= 0) { return i64_sat32(i64_round_shift(x, s)); }
    let r = i64_sat32(x);  // x itself when within int32: otherwise saturated either way
    let t = u32(min(-s, 40));
    let lim = select(INT32_MAX >> t, 0, t >= 31u);
    if (i64_lt(i64_from_i32(lim), i64_abs(x))) { return select(INT32_MAX, -INT32_MAX, i64_is_neg(x)); }
    return bitcast<i32>(bitcast<u32>(r) << t);  // on u32: MSL leaves a negative's << undefined
}
// intmath.bitlen for x >= 0.
fn i64_bitlen(x: I64P) -> i32 {
    if (x.y != 0u) { return 64 - i32(countLeadingZeros(x.y)); }
    return 32 - i32(countLeadingZeros(x.x));
}
fn i32_bitlen(x: i32) -> i32 { return 32 - i32(countLeadingZeros(bitcast<u32>(x))); }

// floor(n / d) for unsigned n and 0 < d < 2^63: restoring division over
// n's significant bits (one 32-bit division when both fit a word).
fn u64_div(n: I64P, d: I64P) -> I64P {
    if (n.y == 0u && d.y == 0u) { return I64P(n.x / d.x, 0u); }
    var q = I64P(0u, 0u);
    var r = I64P(0u, 0u);
    var i = i64_bitlen(n) - 1;
    loop {
        if (i < 0) { break; }
        let bit = select((n.x >> u32(i)) & 1u, (n.y >> u32(i - 32)) & 1u, i >= 32);
        r = I64P((r.x << 1u) | bit, (r.y << 1u) | (r.x >> 31u));
        if (!u64_lt(r, d)) {
            r = i64_sub(r, d);
            q = select(I64P(q.x | (1u << u32(i)), q.y), I64P(q.x, q.y | (1u << u32(i - 32))), i >= 32);
        }
        i = i - 1;
    }
    return q;
}
// intmath.floor_div: floor(a / b), b > 0.
fn i64_floor_div(a: I64P, b: I64P) -> I64P {
    if (!i64_is_neg(a)) { return u64_div(a, b); }
    // floor(a / b) = -ceil(|a| / b) = -floor((|a| + b - 1) / b)
    return i64_neg(u64_div(i64_sub(i64_add(i64_neg(a), b), I64P(1u, 0u)), b));
}
// intmath.round_div: floor((a + floor(b / 2)) / b), b > 0.
fn i64_round_div(a: I64P, b: I64P) -> I64P { return i64_floor_div(i64_add(a, i64_sar(b, 1u)), b); }

// intmath.isqrt: floor(sqrt(n)), 0 <= n < 2^63, the same digit recurrence.
fn i64_isqrt(n0: I64P) -> I64P {
    var n = n0;
    var res = I64P(0u, 0u);
    var bit = I64P(0u, 0x40000000u);  // 1 << 62
    for (var k = 0; k < 32; k++) {
        let rb = i64_add(res, bit);
        let take = !u64_lt(n, rb);
        if (take) { n = i64_sub(n, rb); }
        res = u64_shr(res, 1u);
        if (take) { res = i64_add(res, bit); }
        bit = u64_shr(bit, 2u);
    }
    return res;
}

const EXP2_POLY_Q30 = array<i32, 7>(1073741824, -744260975, 257938938, -59583045, 10286509, -1369790, 117454);
const LOG2E_Q30: i32 = 1549082005;
const LN2_Q24: i32 = 11629080;

// intmath.exp2_neg_q30: 2^(-u / 2^16) in Q30 for u >= 0 (Q16). The Horner
// partial sums stay within int32 (|p| < 2^31 for every f < 2^16, which the
// exhaustive test over f checks); p * f is formed in 64 bits.
fn exp2_neg_q30(u: I64P) -> i32 {
    if (u.y != 0u || (u.x >> 16u) >= 31u) { return 0; }
    let i = u.x >> 16u;
    let f = i32(u.x & 0xffffu);
    var p = EXP2_POLY_Q30[6];
    for (var k = 5; k >= 0; k--) {
        p = EXP2_POLY_Q30[k] + i64_lo(i64_round_shift(i32_mul_wide(p, f), 16));
    }
    return i64_lo(i64_round_shift(i64_from_i32(p), i32(i)));
}

// intmath.softcap: c tanh(X / c) in integers; x in int32 range, 0 < cap <
// 2^31, 0 <= mant < 2^31, shift >= 5.
fn softcap(x: i32, cap: i32, mant: i32, shift: i32) -> i32 {
    let ux = select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0);
    let u = i64_round_shift(u32_mul_wide(ux, bitcast<u32>(mant)), shift - 4);
    let d0 = exp2_neg_q30(i64_sar(u, 4u));
    let step = i64_mul_i32(i32_mul_wide(d0, i32(u.x & 15u)), LN2_Q24);
    let d = i64_lo(i64_sub(i64_from_i32(d0), i64_round_shift(step, 44)));
    let one = 1 << 30u;
    let t = i64_round_div(i64_shl(i64_from_i32(one - d), 30u), i64_add(i64_from_i32(one), i64_from_i32(d)));  // 2^31 when d = 2^30
    let y = i64_lo(i64_round_shift(i32_mul_wide(cap, i64_lo(t)), 30));
    return select(y, -y, x < 0);
}

// The Q30 sigmoid of SwiGLU / GeGLU from d = exp(-|y|) (Q30):
// round_div(2^60, 2^30 + d) for y >= 0, else round_div(d 2^30, 2^30 + d).
fn sigmoid_q30(d: i32, nonneg: bool) -> i32 {
    let den = i64_from_u32((1u << 30u) + u32(d));  // up to 2^31: past int32
    let num = select(i64_shl(i64_from_i32(d), 30u), I64P(0u, 0x10000000u), nonneg);
    return i64_lo(i64_round_div(num, den));
}
