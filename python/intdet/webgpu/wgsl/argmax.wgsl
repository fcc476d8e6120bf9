// ops.argmax_lowest per row of V int32 logits: the maximum, lowest index on ties.
@group(0) @binding(1) var<storage, read_write> z: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;
var<workgroup> best_v: array<i32, 64>;
var<workgroup> best_i: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let V = u32(P(0)); let rows = u32(P(1));
    let r = wid.x + wid.y * GRID_X;
    if (r >= rows) { return; }
    var bv = -2147483647 - 1;
    var bi = 0xffffffffu;
    for (var i = lid; i < V; i += WG) {
        let v = z[r * V + i];
        if (v > bv) { bv = v; bi = i; }  // i rises: the first of equal values stays
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = best_v[lid + s]; let i = best_i[lid + s];
            if (v > best_v[lid] || (v == best_v[lid] && i < best_i[lid])) { best_v[lid] = v; best_i[lid] = i; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { out[r] = i32(best_i[0]); }
}
