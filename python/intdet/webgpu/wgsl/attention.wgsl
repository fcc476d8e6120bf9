// ops.attention: one workgroup per (token, head) over its window of the
// layer's int8 cache (kv [2, P, nkv, Dw], sc [2, P, nkv]). The scores, then
// exponentials, probabilities and int16 value weights go through scratch
// (one row of S entries per workgroup); out is int64 pairs [T, nh, D].
@group(0) @binding(1) var<storage, read_write> qa: array<u32>;  // quant16 rows of D: [T * nh, 2 Dw]
@group(0) @binding(2) var<storage, read_write> qe: array<i32>;  // [T * nh]
@group(0) @binding(3) var<storage, read_write> kv: array<u32>;
@group(0) @binding(4) var<storage, read_write> sc: array<i32>;
@group(0) @binding(5) var<storage, read_write> scr: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<I64P>;

fn sync() { storageBarrier(); workgroupBarrier(); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nh = u32(P(0)); let nkv = u32(P(1)); let D = u32(P(2)); let Dw = u32(P(3)); let Pn = u32(P(4));
    let pos0 = u32(P(5)); let window = u32(P(6)); let smant = P(7); let sshift = P(8);
    let capped = P(9); let cap = P(10); let cmant = P(11); let cshift = P(12); let rows = u32(P(13));
    let S = u32(P(14)); let row0 = u32(P(15));  // this sequence's first (token, head) row
    let r = wid.x + wid.y * GRID_X;
    if (r >= rows) { return; }
    let t = r / nh; let h = r % nh;
    let kvh = h / (nh / nkv);
    let n = pos0 + t + 1u;
    var lo = 0u;
    if (window > 0u && n > window) { lo = n - window; }
    let base = r * S;
    let qb = (row0 + r) * 2u * Dw;
    let eq = qe[row0 + r];
    // z = sat32(round_shift(raw * mk * mant, shift - e_q - ek)) in Q16 log2 units
    var zmax = -INT32_MAX;
    for (var j = lo + lid; j < n; j += WG) {
        let kb = (j * nkv + kvh) * Dw;
        var raw = 0;  // |q . k| < 2^31: wrapping int32 partial sums end exact
        for (var w = 0u; w < Dw; w++) {
            let kw = kv[kb + w];
            raw += 256 * dot4_i8(qa[qb + w], kw) + dot4_i8(qa[qb + Dw + w], kw) + 128 * dot4_i8(kw, ONES);
        }
        let ka = sc[j * nkv + kvh];
        let ek = max(i32_bitlen(ka) - 15, 0);  // normalize_scale15
        let mk = i64_lo(i64_round_shift(i64_from_i32(ka), ek));
        var z = i64_shift_round_sat32(i64_mul_i32(i32_mul_wide(raw, mk), smant), sshift - eq - ek);
        if (capped != 0) { z = softcap(z, cap, cmant, cshift); }
        scr[base + j - lo] = z;
        zmax = max(zmax, z);
    }
    zmax = wg_max_i32(lid, zmax);
    sync();
    // softmax_q16: e = exp2_neg_q30(max - z), R = floor(2^62 / sum e), p = round_shift(e R, 46)
    var tot = I64P(0u, 0u);
    for (var j = lo + lid; j < n; j += WG) {
        let e = exp2_neg_q30(i64_sub(i64_from_i32(zmax), i64_from_i32(scr[base + j - lo])));
        scr[base + j - lo] = e;
        tot = i64_add(tot, i64_from_i32(e));
    }
    tot = wg_sum_i64(lid, tot);
    let R = u64_div(I64P(0u, 0x40000000u), tot);
    // value weights w = p * a_v, quantized like an activation row
    var wmax = I64P(0u, 0u);
    for (var j = lo + lid; j < n; j += WG) {
        let p = i64_lo(i64_round_shift(i64_mul(i64_from_i32(scr[base + j - lo]), R), 46));
        scr[base + j - lo] = p;
        let wv = i32_mul_wide(p, sc[(Pn + j) * nkv + kvh]);
        if (u64_lt(wmax, wv)) { wmax = wv; }
    }
    wmax = wg_max_u64(lid, wmax);
    let s = max(i64_bitlen(wmax) - 15, 0);
    for (var j = lo + lid; j < n; j += WG) {
        let wv = i32_mul_wide(scr[base + j - lo], sc[(Pn + j) * nkv + kvh]);
        scr[base + j - lo] = clamp16(i64_round_shift(wv, s));
    }
    sync();
    // out = (sum_j w16_j v_j) << s, int32 blocks of 512 positions added in int64
    for (var w = lid; w < Dw; w += WG) {
        var acc = array<I64P, 4>(I64P(0u, 0u), I64P(0u, 0u), I64P(0u, 0u), I64P(0u, 0u));
        var part = vec4<i32>(0, 0, 0, 0);
        var cnt = 0u;
        for (var j = lo; j < n; j++) {
            let vw = kv[((Pn + j) * nkv + kvh) * Dw + w];
            let vb = vec4<i32>(bitcast<i32>(vw << 24u) >> 24u, bitcast<i32>(vw << 16u) >> 24u,
                               bitcast<i32>(vw << 8u) >> 24u, bitcast<i32>(vw) >> 24u);
            part += scr[base + j - lo] * vb;
            cnt++;
            if (cnt == 512u) {
                for (var b = 0u; b < 4u; b++) { acc[b] = i64_add(acc[b], i64_from_i32(part[b])); }
                part = vec4<i32>(0, 0, 0, 0);
                cnt = 0u;
            }
        }
        for (var b = 0u; b < 4u; b++) {
            let d = 4u * w + b;
            if (d < D) { out[(row0 + r) * D + d] = i64_shl(i64_add(acc[b], i64_from_i32(part[b])), u32(s)); }
        }
    }
}
