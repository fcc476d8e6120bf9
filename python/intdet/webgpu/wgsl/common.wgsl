// Shared by the forward's kernels: the dispatch's parameters (a 64-byte
// slot of one uniform buffer, bound at a dynamic offset) and workgroup
// reductions over 64 invocations (exact integer max / sum: any order gives
// the same bits).

struct Params { v: array<vec4<i32>, 4> }
@group(0) @binding(0) var<uniform> prm: Params;
fn P(i: u32) -> i32 { return prm.v[i / 4u][i % 4u]; }

const WG: u32 = 64u;
const GRID_X: u32 = 16384u;  // dispatches wider than this fold into y (65535 groups per dimension at most)
const ONES: u32 = 0x01010101u;

var<workgroup> wg_u: array<u32, 64>;
var<workgroup> wg_v: array<I64P, 64>;

fn wg_max_u32(lid: u32, v: u32) -> u32 {
    wg_u[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) { wg_u[lid] = max(wg_u[lid], wg_u[lid + s]); }
        workgroupBarrier();
    }
    let r = wg_u[0];
    workgroupBarrier();
    return r;
}
fn wg_max_i32(lid: u32, v: i32) -> i32 {
    // order-preserving map of i32 onto u32
    return bitcast<i32>(wg_max_u32(lid, bitcast<u32>(v) ^ 0x80000000u) ^ 0x80000000u);
}
fn wg_sum_i64(lid: u32, v: I64P) -> I64P {
    wg_v[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) { wg_v[lid] = i64_add(wg_v[lid], wg_v[lid + s]); }
        workgroupBarrier();
    }
    let r = wg_v[0];
    workgroupBarrier();
    return r;
}
// Maximum of values read as unsigned (magnitudes below 2^63).
fn wg_max_u64(lid: u32, v: I64P) -> I64P {
    wg_v[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s && u64_lt(wg_v[lid], wg_v[lid + s])) { wg_v[lid] = wg_v[lid + s]; }
        workgroupBarrier();
    }
    let r = wg_v[0];
    workgroupBarrier();
    return r;
}
fn iabs_u(x: i32) -> u32 { return select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0); }
fn sat_add(a: i32, b: i32) -> i32 { return i64_sat32(i64_add(i64_from_i32(a), i64_from_i32(b))); }
fn clamp16(x: I64P) -> i32 {
    return i64_lo(i64_max(i64_min(x, i64_from_i32(32767)), i64_from_i32(-32767)));
}
// An int16 q as the two signed bytes dot4_i8 multiplies: q = 256 hi + lo + 128
// with hi = floor(q / 256) and lo = (q mod 256) - 128, both in [-128, 127].
fn q16_hi(q: i32) -> u32 { return bitcast<u32>(q >> 8u) & 255u; }
fn q16_lo(q: i32) -> u32 { return bitcast<u32>((q & 255) - 128) & 255u; }
