// ops.swiglu (kind 0) and ops.geglu (kind 1): int32 Q16 gate and up to int64 Q32.
@group(0) @binding(1) var<storage, read_write> gate: array<i32>;
@group(0) @binding(2) var<storage, read_write> up: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<I64P>;

const GELU_C1_Q30: u32 = 2471977230u;
const GELU_C3_Q30: u32 = 110534462u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = u32(P(0)); let kind = P(1);
    let i = gid.x + gid.y * GRID_X * WG;
    if (i >= count) { return; }
    let g = gate[i];
    let ag = iabs_u(g);
    var w: I64P;
    if (kind == 0) {
        w = i64_round_shift(u32_mul_wide(ag, u32(LOG2E_Q30)), 30);
    } else {
        let a = min(ag, 1u << 20u);
        let a2 = i64_round_shift(u32_mul_wide(a, a), 16).x;
        let a3 = i64_round_shift(u32_mul_wide(a2, a), 16).x;
        w = i64_round_shift(i64_add(u32_mul_wide(a, GELU_C1_Q30), u32_mul_wide(a3, GELU_C3_Q30)), 30);
    }
    let sig = sigmoid_q30(exp2_neg_q30(w), g >= 0);
    let hh = i64_lo(i64_round_shift(i32_mul_wide(g, sig), 30));
    out[i] = i32_mul_wide(hh, up[i]);
}
