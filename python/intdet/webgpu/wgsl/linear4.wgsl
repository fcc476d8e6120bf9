// ops.linear on int4 weights w = gd * u + gm (ops.dequant_int4), one
// invocation per output channel and row (as linear8, with its expert offsets and
// row mask; grp_off for the groups): W4 [N, K/8] words, each 8 inputs (low
// nibbles: inputs 0..3, high nibbles: 4..7; the backend reorders the
// file's nibbles at load). gd * S1 + gm * S2 (S1 = sum q u, S2 = sum q) is
// formed in 64 bits: no int32 overflow, which MSL would leave undefined.
@group(0) @binding(1) var<storage, read_write> act: array<u32>;
@group(0) @binding(2) var<storage, read_write> ex: array<i32>;
@group(0) @binding(3) var<storage, read_write> W4: array<u32>;
@group(0) @binding(4) var<storage, read_write> grp: array<i32>;   // [N, G, 2]: gd, gm
@group(0) @binding(5) var<storage, read_write> chan: array<i32>;  // [3, N]: mant, shift, bias
@group(0) @binding(6) var<storage, read_write> out: array<i32>;
@group(0) @binding(7) var<storage, read_write> mask: array<i32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let G = u32(P(1)); let rows = u32(P(2)); let mode = P(3); let has_bias = P(4);
    let in0 = u32(P(5)); let out0 = u32(P(6)); let w_off = u32(P(7)); let c_off = u32(P(8));
    let mask_col = P(9); let mask_stride = u32(P(10)); let g_off = u32(P(11));
    let n = gid.x; let t = gid.y;  // one invocation per (output channel, row)
    if (n >= N || t >= rows) { return; }
    if (mask_col >= 0 && mask[t * mask_stride + u32(mask_col)] == 0) { return; }
    let Kw = 8u * G;
    let mant = chan[c_off + n]; let shift = chan[c_off + N + n]; let bias = chan[c_off + 2u * N + n];
    {
        let ab = (in0 + t) * 2u * Kw;
        var acc = I64P(0u, 0u);
        for (var g = 0u; g < G; g++) {
            var s1 = 0;  // sum q u
            var s2 = 0;  // sum q
            for (var k = 0u; k < 4u; k++) {
                let w4 = W4[w_off + (n * G + g) * 4u + k];
                let a = g * 8u + 2u * k;
                let ulo = w4 & 0x0f0f0f0fu;
                let uhi = (w4 >> 4u) & 0x0f0f0f0fu;
                s1 += 256 * dot4_i8(act[ab + a], ulo) + dot4_i8(act[ab + Kw + a], ulo) + 128 * dot4_i8(ulo, ONES);
                s1 += 256 * dot4_i8(act[ab + a + 1u], uhi) + dot4_i8(act[ab + Kw + a + 1u], uhi) + 128 * dot4_i8(uhi, ONES);
                s2 += 256 * dot4_i8(act[ab + a], ONES) + dot4_i8(act[ab + Kw + a], ONES)
                    + 256 * dot4_i8(act[ab + a + 1u], ONES) + dot4_i8(act[ab + Kw + a + 1u], ONES) + 1024;
            }
            let gi = g_off + 2u * (n * G + g);
            acc = i64_add(acc, i64_add(i32_mul_wide(grp[gi], s1), i32_mul_wide(grp[gi + 1u], s2)));
        }
        var y = i64_shift_round_sat32(i64_mul_i32(acc, mant), shift - ex[in0 + t]);
        if (has_bias != 0) { y = sat_add(y, bias); }
        let o = (out0 + t) * N + n;
        if (mode == 1) { y = sat_add(out[o], y); }
        out[o] = y;
    }
}
