// intmath.softcap in place on count int32 values from off (Gemma 2's final logits).
@group(0) @binding(1) var<storage, read_write> x: array<i32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = u32(P(0)); let off = u32(P(4));
    let i = gid.x + gid.y * GRID_X * WG;
    if (i >= count) { return; }
    x[off + i] = softcap(x[off + i], P(1), P(2), P(3));
}
