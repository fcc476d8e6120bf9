// intmath.quant8_row of each (token, kv head) row of K and of V (from row src0 of srck and
// srcv) into the layer's cache at its position, both in one dispatch: kv [2, P, nkv, Dw] int8
// words, sc [2, P, nkv] absmax. Workgroups 0..rows-1 store K rows, rows..2 rows-1 V rows.
@group(0) @binding(1) var<storage, read_write> srck: array<i32>;
@group(0) @binding(2) var<storage, read_write> kv: array<u32>;
@group(0) @binding(3) var<storage, read_write> sc: array<i32>;
@group(0) @binding(4) var<storage, read_write> srcv: array<i32>;

fn ld(which: u32, i: u32) -> i32 {
    if (which == 0u) { return srck[i]; }
    return srcv[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let D = u32(P(0)); let Dw = u32(P(1)); let nkv = u32(P(2)); let Pn = u32(P(3)); let pos0 = u32(P(4));
    let rows = u32(P(6)); let src0 = u32(P(7));
    let rw = wid.x + wid.y * GRID_X;
    if (rw >= 2u * rows) { return; }
    let which = rw / rows; let r = rw % rows;
    let t = r / nkv; let h = r % nkv;
    let xb = (src0 + r) * D;
    var m = 0u;
    for (var i = lid; i < D; i += WG) { m = max(m, iabs_u(ld(which, xb + i))); }
    m = wg_max_u32(lid, m);
    let den = I64P(max(m, 1u), 0u);
    let row = (which * Pn + pos0 + t) * nkv + h;
    for (var w = lid; w < Dw; w += WG) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let i = 4u * w + b;
            var q = 0;
            if (i < D) {
                q = i64_lo(i64_round_div(i32_mul_wide(127, ld(which, xb + i)), den));
                q = clamp(q, -127, 127);
            }
            word |= (bitcast<u32>(q) & 255u) << (8u * b);
        }
        kv[row * Dw + w] = word;
    }
    if (lid == 0u) { sc[row] = i32(m); }
}
