// Embedding: x[t, i] = shift_round_sat32(emb[tok, i] * mant[tok], shift[tok]) (ref model.py).
@group(0) @binding(1) var<storage, read_write> tok: array<i32>;
@group(0) @binding(2) var<storage, read_write> emb: array<u32>;   // int8 [v1 - v0, Hw] packed
@group(0) @binding(3) var<storage, read_write> sc: array<i32>;    // [2, V]: mant, shift
@group(0) @binding(4) var<storage, read_write> x: array<i32>;     // [T, H]
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let H = u32(P(0)); let Hw = u32(P(1)); let T = u32(P(2)); let tok0 = u32(P(3)); let V = u32(P(4));
    let i = g.x; let t = g.y;
    if (i >= H || t >= T) { return; }
    let v = u32(tok[tok0 + t]);
    // emb holds rows v0..v1-1 (P(5), P(6); v1 = 0: all V): the vocabulary in
    // buffers within the binding limit, one dispatch each.
    let v0 = u32(P(5)); let v1 = select(V, u32(P(6)), P(6) > 0);
    if (v < v0 || v >= v1) { return; }
    let b = bitcast<i32>(emb[(v - v0) * Hw + i / 4u] << (24u - 8u * (i % 4u))) >> 24u;
    x[t * H + i] = i64_shift_round_sat32(i32_mul_wide(b, sc[v]), sc[V + v]);
}
