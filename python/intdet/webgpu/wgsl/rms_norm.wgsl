// ops.rms_norm over rows of n int32 values, one workgroup per row; mode 1 is
// the post-norm: out = sat32(out + shift_round_sat32(y, shift)) (the residual).
// norm_quant16 (mode 0) also quantizes each normed row as quant16.wgsl does,
// for the linear that reads it: one dispatch instead of two.
@group(0) @binding(1) var<storage, read_write> xin: array<i32>;
@group(0) @binding(2) var<storage, read_write> gam: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;
@group(0) @binding(4) var<storage, read_write> act: array<u32>;  // norm_quant16 only
@group(0) @binding(5) var<storage, read_write> ex: array<i32>;   // norm_quant16 only

fn pre(x: i32, a: i32) -> i32 {
    if (a >= 0) { return bitcast<i32>(bitcast<u32>(x) << u32(a)); }  // on u32: a negative's << is undefined in MSL
    return i64_lo(i64_round_shift(i64_from_i32(x), -a));
}

// Row r (of rows in0.., written to rows out0..) of the dispatch.
fn norm_row(r: u32, lid: u32) {
    let n = u32(P(0)); let in_frac = P(2); let eps = I64P(bitcast<u32>(P(3)), bitcast<u32>(P(4)));
    let mode = P(5); let shift = P(6); let in0 = u32(P(7)); let out0 = u32(P(8));
    let xb = (in0 + r) * n;
    var m = 0u;
    for (var i = lid; i < n; i += WG) { m = max(m, iabs_u(xin[xb + i])); }
    m = wg_max_u32(lid, m);
    let a = 24 - (32 - i32(countLeadingZeros(m)));
    var s = I64P(0u, 0u);
    for (var i = lid; i < n; i += WG) {
        let v = pre(xin[xb + i], a);
        s = i64_add(s, i32_mul_wide(v, v));
    }
    s = wg_sum_i64(lid, s);
    let cap = I64P(0u, 0x40000000u);  // S_CAP = 2^62
    let e_shift = 60 - 2 * (in_frac + a);
    var et: I64P;
    if (e_shift >= 0) {
        et = i64_round_shift(eps, e_shift);
    } else {
        let t = u32(min(-e_shift, 62));
        if (-e_shift >= 62 || i64_lt(u64_shr(cap, t), eps)) { et = cap; } else { et = i64_shl(eps, t); }
    }
    s = i64_min(i64_add(s, i64_min(et, cap)), cap);
    let rt = i64_max(i64_isqrt(s), I64P(1u, 0u));
    for (var i = lid; i < n; i += WG) {
        var y = 0;
        if (m != 0u) { y = i64_lo(i64_round_div(i64_shl(i32_mul_wide(pre(xin[xb + i], a), gam[i]), 14u), rt)); }
        let o = (out0 + r) * n + i;
        if (mode == 1) { out[o] = sat_add(out[o], i64_shift_round_sat32(i64_from_i32(y), shift)); } else { out[o] = y; }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x + wid.y * GRID_X;
    if (r >= u32(P(1))) { return; }
    norm_row(r, lid);
}

// The normed row read back from out (a storage barrier makes the workgroup's
// writes visible to it), then quant16: act row out0 + r (Kw = P(9) words of
// high bytes, then of low bytes), ex[out0 + r].
@compute @workgroup_size(64)
fn norm_quant16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x + wid.y * GRID_X;
    if (r >= u32(P(1))) { return; }
    norm_row(r, lid);
    storageBarrier();
    let n = u32(P(0)); let o = u32(P(8)) + r; let Kw = u32(P(9));
    let xb = o * n;
    var m = 0u;
    for (var i = lid; i < n; i += WG) { m = max(m, iabs_u(out[xb + i])); }
    m = wg_max_u32(lid, m);
    let e = max(32 - i32(countLeadingZeros(m)) - 15, 0);
    for (var w = lid; w < Kw; w += WG) {
        var hi = 0u;
        var lo = 0u;
        for (var b = 0u; b < 4u; b++) {
            let i = 4u * w + b;
            var q = 0;
            if (i < n) { q = clamp16(i64_round_shift(i64_from_i32(out[xb + i]), e)); }
            hi |= q16_hi(q) << (8u * b);
            lo |= q16_lo(q) << (8u * b);
        }
        act[o * 2u * Kw + w] = hi;
        act[o * 2u * Kw + Kw + w] = lo;
    }
    if (lid == 0u) { ex[o] = e; }
}
