// Mixture of experts (ref model.py _moe). Entry route: per row of router
// scores z [T, E] (Q16 log2 units), the k largest (ties: lowest id) and
// their weights, softmax_q16 over those k (norm_topk) or the full
// softmax's entries, into wexp [T, E] (0 for the experts not chosen).
// Entry accumulate: acc [T, H] (int64) = (first ? 0 : acc) + wexp[t, e] * d[t].
// Entry finish: x = sat32(x + round_shift(acc, 16)).
@group(0) @binding(1) var<storage, read_write> z: array<i32>;
@group(0) @binding(2) var<storage, read_write> wexp: array<i32>;
@group(0) @binding(3) var<storage, read_write> acc: array<I64P>;
@group(0) @binding(4) var<storage, read_write> x: array<i32>;

const MAX_K: u32 = 64u;

fn softmax_entry(zi: i32, zmax: i32, R: I64P) -> i32 {
    let e = exp2_neg_q30(i64_sub(i64_from_i32(zmax), i64_from_i32(zi)));
    return i64_lo(i64_round_shift(i64_mul(i64_from_i32(e), R), 46));
}

@compute @workgroup_size(64)
fn route(@builtin(global_invocation_id) gid: vec3<u32>) {
    let T = u32(P(0)); let E = u32(P(1)); let k = u32(P(2)); let norm_topk = P(3);
    let t = gid.x;
    if (t >= T) { return; }
    let zb = t * E;
    var sel: array<u32, 64>;
    for (var j = 0u; j < E; j++) { wexp[zb + j] = 0; }
    for (var s = 0u; s < k; s++) {  // selection: the largest not chosen yet, the lowest id first
        var best = 0u;
        var found = false;
        for (var j = 0u; j < E; j++) {
            var taken = false;
            for (var q = 0u; q < s; q++) { taken = taken || sel[q] == j; }
            if (!taken && (!found || z[zb + j] > z[zb + best])) { best = j; found = true; }
        }
        sel[s] = best;
    }
    // softmax_q16 over the chosen k (norm_topk) or all E; zmax is the top choice either way
    let zmax = z[zb + sel[0]];
    var tot = I64P(0u, 0u);
    if (norm_topk != 0) {
        for (var s = 0u; s < k; s++) {
            tot = i64_add(tot, i64_from_i32(exp2_neg_q30(i64_sub(i64_from_i32(zmax), i64_from_i32(z[zb + sel[s]])))));
        }
    } else {
        for (var j = 0u; j < E; j++) {
            tot = i64_add(tot, i64_from_i32(exp2_neg_q30(i64_sub(i64_from_i32(zmax), i64_from_i32(z[zb + j])))));
        }
    }
    let R = u64_div(I64P(0u, 0x40000000u), tot);
    for (var s = 0u; s < k; s++) { wexp[zb + sel[s]] = softmax_entry(z[zb + sel[s]], zmax, R); }
}

@compute @workgroup_size(64)
fn accumulate(@builtin(global_invocation_id) gid: vec3<u32>) {
    let T = u32(P(0)); let H = u32(P(1)); let E = u32(P(2)); let e = u32(P(3)); let first = P(4);
    let i = gid.x + gid.y * GRID_X * WG;
    if (i >= T * H) { return; }
    let t = i / H;
    let w = wexp[t * E + e];
    var v = I64P(0u, 0u);
    if (w != 0) { v = i32_mul_wide(w, x[i]); }  // x: this expert's down output here
    if (first == 0) { v = i64_add(acc[i], v); }
    acc[i] = v;
}

@compute @workgroup_size(64)
fn finish(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = u32(P(0));
    let i = gid.x + gid.y * GRID_X * WG;
    if (i >= count) { return; }
    x[i] = i64_sat32(i64_add(i64_from_i32(x[i]), i64_round_shift(acc[i], 16)));
}
