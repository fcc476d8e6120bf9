// ops.rope in place on rows row0..row0+T-1 of x [rows, nh * D] (split-half pairs i, i + D/2), Q14 tables [ctx, D/2].
@group(0) @binding(1) var<storage, read_write> x: array<i32>;
@group(0) @binding(2) var<storage, read_write> cs: array<i32>;
@group(0) @binding(3) var<storage, read_write> sn: array<i32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let T = u32(P(0)); let nh = u32(P(1)); let D = u32(P(2)); let pos0 = u32(P(3)); let row0 = u32(P(4));
    let half = D / 2u;
    let i = g.x; let t = g.y;
    if (i >= nh * half || t >= T) { return; }
    let h = i / half; let j = i % half;
    let b = (row0 + t) * nh * D + h * D + j;
    let x1 = x[b]; let x2 = x[b + half];
    let c = cs[(pos0 + t) * half + j]; let s = sn[(pos0 + t) * half + j];
    x[b] = i64_sat32(i64_round_shift(i64_sub(i32_mul_wide(x1, c), i32_mul_wide(x2, s)), 14));
    x[b + half] = i64_sat32(i64_round_shift(i64_add(i32_mul_wide(x2, c), i32_mul_wide(x1, s)), 14));
}
