// ops.linear with int8 weights [N, Kw words]. Two shapes of the same sums:
// ``main`` / ``segments``, one invocation per output channel n and row t,
// each a whole dot product (no barriers: lavapipe runs a workgroup's
// barriers as coroutine switches, so CPU adapters get this one);
// ``coop`` / ``segments_coop``, TPC invocations per (channel, row), each
// over every TPC-th word (adjacent invocations read adjacent words of the
// row), their int64 parts added in workgroup memory: a GPU's decode has
// thousands of channels, not the ~10^5 loads in flight its bandwidth needs,
// so each channel's row is split. Integer sums: the same bits either way.
// Mode 1 adds into out (the residual, saturating). MoE experts: W and chan from word offsets w_off / chan_off
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

const TPC: u32 = 16u;  // invocations per (channel, row) in the coop entries

// The dot product of row t's activations (act from word ab) with weight row
// wb over words w0, w0 + step, ..: int32 parts of at most 64 words (each
// |256 hi.w + lo.w| < 2^24), added in int64.
fn dot_part(wb: u32, ab: u32, Kw: u32, w0: u32, step: u32) -> I64P {
    var acc = I64P(0u, 0u);
    var part = 0;
    var cnt = 0u;
    for (var w = w0; w < Kw; w += step) {
        let wv = W[wb + w];
        part += 256 * dot4_i8(act[ab + w], wv) + dot4_i8(act[ab + Kw + w], wv);
        cnt++;
        if (cnt == 64u) { acc = i64_add(acc, i64_from_i32(part)); part = 0; cnt = 0u; }
    }
    return i64_add(acc, i64_from_i32(part));
}

// Channel n of row t from its whole dot product: the +128 of every low
// byte, the dyadic rescale to sat32, plus the bias.
fn finish(dot: I64P, n: u32, t: u32, N: u32, in0: u32, c_off: u32, has_bias: i32) -> i32 {
    let wsum = chan[c_off + n]; let mant = chan[c_off + N + n]; let shift = chan[c_off + 2u * N + n];
    let acc = i64_add(dot, i32_mul_wide(128, wsum));
    var y = i64_shift_round_sat32(i64_mul_i32(acc, mant), shift - ex[in0 + t]);
    if (has_bias != 0) { y = sat_add(y, chan[c_off + 3u * N + n]); }
    return y;
}

// The TPC parts of each channel of the workgroup (lanes lid - lid % TPC ..)
// added; lane 0 of each group holds the sum. Called by every invocation.
fn coop_sum(lid: u32, part: I64P) -> I64P {
    wg_v[lid] = part;
    workgroupBarrier();
    for (var s = TPC / 2u; s > 0u; s >>= 1u) {
        if (lid % TPC < s) { wg_v[lid] = i64_add(wg_v[lid], wg_v[lid + s]); }
        workgroupBarrier();
    }
    return wg_v[lid];
}

// Row t's channel n at out[(out0 + t) * stride + n0 + n]; stride P(11) (0:
// N) and n0 P(12): the lm_head in buffers of whole rows writes its channels
// n0.. of logits rows V long.
fn store(n: u32, t: u32, N: u32, out0: u32, mode: i32, y0: i32) {
    let o = (out0 + t) * select(N, u32(P(11)), P(11) > 0) + u32(P(12)) + n;
    var y = y0;
    if (mode == 1) { y = sat_add(out[o], y); }
    out[o] = y;
}

// Segment outputs: channel n < N1 to out, then N2 to out2, the rest to out3.
fn store_segment(n: u32, t: u32, N: u32, N1: u32, N2: u32, y: i32) {
    if (n < N1) {
        out[t * N1 + n] = y;
    } else if (n < N1 + N2) {
        out2[t * N2 + n - N1] = y;
    } else {
        out3[t * (N - N1 - N2) + n - N1 - N2] = y;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let mode = P(3); let has_bias = P(4);
    let in0 = u32(P(5)); let out0 = u32(P(6)); let w_off = u32(P(7)); let c_off = u32(P(8));
    let mask_col = P(9); let mask_stride = u32(P(10));
    let n = gid.x; let t = gid.y;  // one invocation per (output channel, row)
    if (n >= N || t >= rows) { return; }
    if (mask_col >= 0 && mask[t * mask_stride + u32(mask_col)] == 0) { return; }
    let dot = dot_part(w_off + n * Kw, (in0 + t) * 2u * Kw, Kw, 0u, 1u);
    store(n, t, N, out0, mode, finish(dot, n, t, N, in0, c_off, has_bias));
}

// Workgroups (channel blocks folded over x and y past GRID_X, rows on z) of
// WG / TPC channels each.
@compute @workgroup_size(64)
fn coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let mode = P(3); let has_bias = P(4);
    let in0 = u32(P(5)); let out0 = u32(P(6)); let w_off = u32(P(7)); let c_off = u32(P(8));
    let mask_col = P(9); let mask_stride = u32(P(10));
    let n = (wid.x + wid.y * GRID_X) * (WG / TPC) + lid / TPC; let t = wid.z;
    let live = n < N && t < rows && (mask_col < 0 || mask[t * mask_stride + u32(mask_col)] != 0);
    var part = I64P(0u, 0u);
    if (live) { part = dot_part(w_off + n * Kw, (in0 + t) * 2u * Kw, Kw, lid % TPC, TPC); }
    let dot = coop_sum(lid, part);
    if (live && lid % TPC == 0u) { store(n, t, N, out0, mode, finish(dot, n, t, N, in0, c_off, has_bias)); }
}

@compute @workgroup_size(64)
fn segments(@builtin(global_invocation_id) gid: vec3<u32>) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let has_bias = P(4);
    let n = gid.x; let t = gid.y;
    if (n >= N || t >= rows) { return; }
    let dot = dot_part(n * Kw, t * 2u * Kw, Kw, 0u, 1u);
    store_segment(n, t, N, u32(P(11)), u32(P(12)), finish(dot, n, t, N, 0u, 0u, has_bias));
}

@compute @workgroup_size(64)
fn segments_coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let N = u32(P(0)); let Kw = u32(P(1)); let rows = u32(P(2)); let has_bias = P(4);
    let n = (wid.x + wid.y * GRID_X) * (WG / TPC) + lid / TPC; let t = wid.z;
    let live = n < N && t < rows;
    var part = I64P(0u, 0u);
    if (live) { part = dot_part(n * Kw, t * 2u * Kw, Kw, lid % TPC, TPC); }
    let dot = coop_sum(lid, part);
    if (live && lid % TPC == 0u) { store_segment(n, t, N, u32(P(11)), u32(P(12)), finish(dot, n, t, N, 0u, 0u, has_bias)); }
}
