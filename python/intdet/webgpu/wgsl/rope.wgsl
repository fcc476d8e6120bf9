// ops.rope in place on rows row0..row0+T-1 of q [rows, nh * D] and k [rows, nkv * D] in one
// dispatch (split-half pairs i, i + D/2), Q14 tables [ctx, D/2]: invocations below nh * D/2
// rotate q's pairs, the rest k's.
@group(0) @binding(1) var<storage, read_write> xq: array<i32>;
@group(0) @binding(2) var<storage, read_write> cs: array<i32>;
@group(0) @binding(3) var<storage, read_write> sn: array<i32>;
@group(0) @binding(4) var<storage, read_write> xk: array<i32>;

// (x1 c - x2 s, x2 c + x1 s) rounded by 14 bits and saturated (ops.rope).
fn rot(x1: i32, x2: i32, c: i32, s: i32) -> vec2<i32> {
    return vec2<i32>(i64_sat32(i64_round_shift(i64_sub(i32_mul_wide(x1, c), i32_mul_wide(x2, s)), 14)),
                     i64_sat32(i64_round_shift(i64_add(i32_mul_wide(x2, c), i32_mul_wide(x1, s)), 14)));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let T = u32(P(0)); let nh = u32(P(1)); let D = u32(P(2)); let pos0 = u32(P(3)); let row0 = u32(P(4));
    let nkv = u32(P(5));
    let half = D / 2u;
    let i = g.x; let t = g.y;
    if (i >= (nh + nkv) * half || t >= T) { return; }
    let j = i % half;
    let c = cs[(pos0 + t) * half + j]; let s = sn[(pos0 + t) * half + j];
    if (i < nh * half) {
        let b = (row0 + t) * nh * D + (i / half) * D + j;
        let r = rot(xq[b], xq[b + half], c, s);
        xq[b] = r.x; xq[b + half] = r.y;
    } else {
        let b = (row0 + t) * nkv * D + (i / half - nh) * D + j;
        let r = rot(xk[b], xk[b + half], c, s);
        xk[b] = r.x; xk[b + half] = r.y;
    }
}
