// intmath.softcap in place on int32 values (Gemma 2's final logits).
@group(0) @binding(1) var<storage, read_write> x: array<i32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = u32(P(0));
    let i = gid.x + gid.y * GRID_X * WG;
    if (i >= count) { return; }
    x[i] = softcap(x[i], P(1), P(2), P(3));
}
