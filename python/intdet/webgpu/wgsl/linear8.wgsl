// ops.linear with int8 weights [N, Kw words]: one invocation per output
// channel n and row t, each a whole dot product (no barriers: lavapipe runs
// a workgroup's barriers as coroutine switches); mode 1 adds into out (the residual,
// saturating). MoE experts: W and chan from word offsets w_off / chan_off
// (expert e of [E, N, Kw] / [E, 4, N]), and with mask_col >= 0 only the
// rows t whose mask[t * mask_stride + mask_col] != 0 (the rows routed to it).
// ``segments``: q, k and v (or gate and up) as one matrix of N1 + N2 + N3
// rows, each segment's channels into its own output (one dispatch, not three).
@group(0) @binding(1) var<storage, read_write> act: array<u32>;
@group(0) @binding(2) var<storage, read_write> ex: array<i32>;
@group(0) @binding(3) var<storage, read_write> W: array<u32>;
@group(0) @binding(4) var<storage, read_write> chan: array<i32>;  // [4, N]: sum of w, mant, shift, bias
@group(0) @binding(5) var<storage, read_write> out: array<i32>;
@group(0) @binding(6) var<storage, read_write> mask: array<i32>;
@group(0) @binding(7) var<storage, read_write> out2: array<i32>;  // segments only
@group(0) @binding(8) var<storage, read_write> out3: array<i32>;  // segments only

// Channel n of row t before the residual: sat32 of the dot product's dyadic
// rescale, plus the bias.
fn channel(n: u32, t: u32, N: u32, Kw: u32, in0: u32, w_off: u32, c_off: u32, has_bias: i32) -> i32 {
    let wsum = chan[c_off + n]; let mant = chan[c_off + N + n]; let shift = chan[c_off + 2u * N + n];
    let wb = w_off + n * Kw;
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
    if (has_bias != 0) { y = sat_add(y, chan[c_off + 3u * N + n]); }
    return y;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let mode = P(3); let has_bias = P(4);
    let in0 = u32(P(5)); let out0 = u32(P(6)); let w_off = u32(P(7)); let c_off = u32(P(8));
    let mask_col = P(9); let mask_stride = u32(P(10));
    let n = gid.x; let t = gid.y;  // one invocation per (output channel, row)
    if (n >= N || t >= rows) { return; }
    if (mask_col >= 0 && mask[t * mask_stride + u32(mask_col)] == 0) { return; }
    var y = channel(n, t, N, Kw, in0, w_off, c_off, has_bias);
    let o = (out0 + t) * N + n;
    if (mode == 1) { y = sat_add(out[o], y); }
    out[o] = y;
}

@compute @workgroup_size(64)
fn segments(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let has_bias = P(4);
    let N1 = u32(P(11)); let N2 = u32(P(12));
    let n = gid.x; let t = gid.y;
    if (n >= N || t >= rows) { return; }
    let y = channel(n, t, N, Kw, 0u, 0u, 0u, has_bias);
    if (n < N1) {
        out[t * N1 + n] = y;
    } else if (n < N1 + N2) {
        out2[t * N2 + n - N1] = y;
    } else {
        out3[t * (N - N1 - N2) + n - N1 - N2] = y;
    }
}
