// intmath.quant16 of rows of n values (int32, or int64 pairs with IN64),
// one workgroup per row, written as dot4_i8's packed bytes: per row Kw words
// of high bytes then Kw words of low bytes (q16_hi / q16_lo; padding q = 0).
@group(0) @binding(1) var<storage, read_write> xin: array<XTYPE>;
@group(0) @binding(2) var<storage, read_write> act: array<u32>;
@group(0) @binding(3) var<storage, read_write> ex: array<i32>;

fn ld(i: u32) -> I64P { return LOAD(xin[i]); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = u32(P(0)); let rows = u32(P(1)); let Kw = u32(P(2)); let in0 = u32(P(3)); let out0 = u32(P(4));
    let r = wid.x + wid.y * GRID_X;
    if (r >= rows) { return; }
    let xb = (in0 + r) * n;
    var m = I64P(0u, 0u);
    for (var i = lid; i < n; i += WG) {
        let v = i64_abs(ld(xb + i));
        if (u64_lt(m, v)) { m = v; }
    }
    m = wg_max_u64(lid, m);
    let e = max(i64_bitlen(m) - 15, 0);
    let ob = (out0 + r) * 2u * Kw;
    for (var w = lid; w < Kw; w += WG) {
        var hi = 0u;
        var lo = 0u;
        for (var b = 0u; b < 4u; b++) {
            let i = 4u * w + b;
            var q = 0;
            if (i < n) { q = clamp16(i64_round_shift(ld(xb + i), e)); }
            hi |= q16_hi(q) << (8u * b);
            lo |= q16_lo(q) << (8u * b);
        }
        act[ob + w] = hi;
        act[ob + Kw + w] = lo;
    }
    if (lid == 0u) { ex[out0 + r] = e; }
}
