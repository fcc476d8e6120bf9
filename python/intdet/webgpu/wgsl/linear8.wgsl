// ops.linear with int8 weights [N, Kw words]: one invocation per output
// channel n and row t, each a whole dot product (no barriers: lavapipe runs
// a workgroup's barriers as coroutine switches); mode 1 adds into out (the residual,
// saturating). MoE experts: W and chan from word offsets w_off / chan_off
// (expert e of [E, N, Kw] / [E, 4, N]), and with mask_col >= 0 only the
// rows t whose mask[t * mask_stride + mask_col] != 0 (the rows routed to it).
@group(0) @binding(1) var<storage, read_write> act: array<u32>;
@group(0) @binding(2) var<storage, read_write> ex: array<i32>;
@group(0) @binding(3) var<storage, read_write> W: array<u32>;
@group(0) @binding(4) var<storage, read_write> chan: array<i32>;  // [4, N]: sum of w, mant, shift, bias
@group(0) @binding(5) var<storage, read_write> out: array<i32>;
@group(0) @binding(6) var<storage, read_write> mask: array<i32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let mode = P(3); let has_bias = P(4);
    let in0 = u32(P(5)); let out0 = u32(P(6)); let w_off = u32(P(7)); let c_off = u32(P(8));
    let mask_col = P(9); let mask_stride = u32(P(10));
    let n = gid.x; let t = gid.y;  // one invocation per (output channel, row)
    if (n >= N || t >= rows) { return; }
    if (mask_col >= 0 && mask[t * mask_stride + u32(mask_col)] == 0) { return; }
    let wsum = chan[c_off + n]; let mant = chan[c_off + N + n]; let shift = chan[c_off + 2u * N + n];
    let bias = chan[c_off + 3u * N + n];
    let wb = w_off + n * Kw;
    {
        let ab = (in0 + t) * 2u * Kw;
        var acc = I64P(0u, 0u);
        var part = 0;  // < 64 words of |256 hi.w + lo.w| < 2^24 each
        var cnt = 0u;
        for (var w = 0u; w < Kw; w++) {
            let wv = W[wb + w];
            part += 256 * dot4_i8(act[ab + w], wv) + dot4_i8(act[ab + Kw + w], wv);
            cnt++;
            if (cnt == 64u) { acc = i64_add(acc, i64_from_i32(part)); part = 0; cnt = 0u; }
        }
        acc = i64_add(acc, i64_from_i32(part));
        acc = i64_add(acc, i32_mul_wide(128, wsum));  // the +128 of every low byte
        var y = i64_shift_round_sat32(i64_mul_i32(acc, mant), shift - ex[in0 + t]);
        if (has_bias != 0) { y = sat_add(y, bias); }
        let o = (out0 + t) * N + n;
        if (mode == 1) { y = sat_add(out[o], y); }
        out[o] = y;
    }
}
