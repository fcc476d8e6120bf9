// The op list of the integer decoder, one line each. Formats and the exact
// definition of each op are in python/intdet/ref/ops.py (the spec); the
// scalar implementations are in csrc/cpu/ops_generic.cpp.
#pragma once

#include <cstdint>

#include "intdet/intmath.h"
#include "intdet/kernels.h"

namespace intdet {

constexpr int kNormTopBit = 24;  // RMSNorm pre-shift target
constexpr int kNormOutFrac = 14;
constexpr int kRopeFrac = 14;
constexpr int kProbFrac = 16;
constexpr int kEpsFrac = 60;
constexpr int64_t kSCap = (int64_t)1 << 62;

// x [n] (Q in_frac) -> y [n] int32 norm units; g [n] int16 gamma.
void rms_norm_row(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y);
// rms_norm_row's per-row steps, shared by its SIMD twins: the pre-shift a
// for m = max |x| > 0 (xs = x * 2^a, or round_shift(x, -a) for a < 0, has
// kNormTopBit bits at most), and the divisor r >= 1 from s = sum xs^2:
// y = floor_div(xs * g * 2^kNormOutFrac + r / 2, r).
int rms_norm_pre_shift(int64_t m);
int64_t rms_norm_divisor(int64_t s, int64_t eps_q60, int in_frac, int a);
// One element's pre-shifted value xs and its output (the SIMD rows' tails).
inline int64_t rms_norm_xs(int64_t x, int a) { return a >= 0 ? shl(x, a) : round_shift(x, -a); }
inline int32_t rms_norm_out(int64_t xs, int16_t g, int64_t r) {
  return (int32_t)floor_div(xs * g * ((int64_t)1 << kNormOutFrac) + (r >> 1), r);
}
// x[i] = sat32(x[i] + d[i]) for i < n: the residual add (|x|, |d| < 2^62).
void add_sat32_row(int64_t* x, const int64_t* d, int64_t n);
// x [n] -> q [n] int16, returns exponent e (x ~= q * 2^e).
int quant16_row(const int64_t* x, int64_t n, int16_t* q);
// x [n] -> q [n] int8, returns absmax a (x ~= q * a / 127).
int32_t quant8_row(const int64_t* x, int64_t n, int8_t* q);  // |x| <= 2^31 - 1
// out[t * ldo + j] = sat32(round_shift(sum_k q[t,k] w[j,k] * mant[j], shift[j] - e[t])) + bias[j].
// Generic scalar version; SIMD versions with the same signature live in
// csrc/cpu/x86/ and are chosen by kernels() (csrc/include/intdet/kernels.h).
void linear_generic(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                    const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);
// The int4 twin (LinearW4Fn in kernels.h): row-major codes and group scales.
void linear_w4_generic(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
                       const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                       int64_t* out, int64_t ldo);
// In place on x [nh, D] for one position: split-half RoPE with Q14 tables [D/2].
void rope_row(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin);
// p[i] = exp2_neg_q30(u[i]) (u >= 0; in place allowed).
void exp2_neg_q30_row(const int64_t* u, int64_t n, int64_t* p);
// The exp2 row used by softmax and SwiGLU: exp2_neg_q30_row or a SIMD twin.
using ExpRowFn = void (*)(const int64_t* u, int64_t n, int64_t* p);
// z [n] Q16 log2 units -> p [n] Q16 probabilities.
void softmax_q16_row(const int64_t* z, int64_t n, int64_t* p);
void softmax_q16_row_with(const int64_t* z, int64_t n, int64_t* p, ExpRowFn exp_row);
// The gated product of swiglu_row / geglu_row for one element, given
// d = exp(-|y|) in Q30 (y = g for SiLU): g * sigmoid(y) * u, sigmoid(y) in
// Q30 = 2^60 / (2^30 + d) for y >= 0, d 2^30 / (2^30 + d) below, rounded.
INTDET_HD int64_t glu_gate(int64_t g, int64_t u, int64_t d) {
  const int64_t den = ((int64_t)1 << 30) + d;
  const int64_t sig = g >= 0 ? round_div((int64_t)1 << 60, den) : round_div(d << 30, den);
  return round_shift(g * sig, 30) * u;
}
// a[i] = silu(g[i]) * u[i] in Q32 (g, u Q16).
void swiglu_row(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);  // a may alias g
void swiglu_row_with(const int64_t* g, const int64_t* u, int64_t n, int64_t* a, ExpRowFn exp_row);
// a[i] = gelu_tanh(g[i]) * u[i] in Q32 (g, u Q16): GeGLU, gelu_tanh(x) = x sigmoid(y),
// y = 2 sqrt(2/pi) (x + 0.044715 x^3); constants and error bound: ref/ops.py geglu.
constexpr int64_t kGeluC1Q30 = 2471977230;  // round(2 sqrt(2/pi) log2(e) 2^30)
constexpr int64_t kGeluC3Q30 = 110534462;   // round(2 sqrt(2/pi) 0.044715 log2(e) 2^30)
constexpr int64_t kGeluClampQ16 = (int64_t)1 << 20;  // |x| >= 16: exp(-|y|) is 0 in Q30
void geglu_row(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);  // a may alias g
void geglu_row_with(const int64_t* g, const int64_t* u, int64_t n, int64_t* a, ExpRowFn exp_row);
// |y| log2(e) in Q16 for g in Q16 (the exp2 input of geglu), shared with CUDA.
INTDET_HD int64_t gelu_exp2_arg(int64_t g) {
  const int64_t a = imin(iabs(g), kGeluClampQ16);
  const int64_t a3 = round_shift(round_shift(a * a, 16) * a, 16);
  return round_shift(a * kGeluC1Q30 + a3 * kGeluC3Q30, 30);
}
// One query head over n cached positions: out [D] int64. z, p: scratch [n]
// int64; w16: scratch [n] int16.
constexpr int64_t kPvBlock = 512;
void attend_head(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                 const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                 int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out);
// The scalar attention tiles (QkTileFn, PvTileFn in kernels.h): the reference
// every kernel set's tiles match; D <= 256.
void qk_tile_generic(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                     int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz);
void pv_tile_generic(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride,
                     int64_t D, int64_t* out);
// The softmax's row passes (AttnRowFns in kernels.h), scalar reference, over
// n keys of one row (docs/long-context.md, attend_head's steps):
// the scores' maximum (n >= 1);
int64_t attn_row_max_generic(const int64_t* z, int64_t n);
// in place u[i] = exp2_neg_q30(zmax - z[i]) (Q30, zmax >= every z[i], scores
// in int32 range), returns sum u[i];
int64_t attn_exp_sum_generic(int64_t* z, int64_t n, int64_t zmax);
// the weights p[i] = round_shift(u[i] * rr, 62 - kProbFrac) * va[i] (rr =
// 2^62 / tot with tot >= 2^30 the row's exp sum, so rr <= 2^32; u[i] <= 2^30;
// va[i] >= 0 the value scales, contiguous), returns max(0, max p[i]) (< 2^47);
int64_t attn_prob_max_generic(const int64_t* u, int64_t n, int64_t rr, const int32_t* va);
// and w16[i] = clamp(round_shift(p[i], e), -32767, 32767) with p as above.
void attn_prob_w16_generic(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16);
// The scalar set's row passes.
constexpr AttnRowFns kAttnRowGeneric{attn_row_max_generic, attn_exp_sum_generic, attn_prob_max_generic,
                                     attn_prob_w16_generic};

// The output transform shared by every linear kernel (CPU and CUDA): exact dot -> int32 Q F_out.
// One KV row element's int8 value: clamp(round_div(127 x, d), +-127), d =
// max(absmax, 1) (quant8_row and its vector rows' tails).
INTDET_HD int8_t quant8_value(int64_t x, int64_t d) {
  return (int8_t)clamp(round_div(127 * x, d), -kInt8QMax, kInt8QMax);
}

// RoPE of the pair (v[i], v[i + h]) in place with the Q14 tables' entry i
// (rope_row and its vector rows' tails).
INTDET_HD void rope_pair(int64_t* v, int64_t h, int64_t i, const int16_t* cos, const int16_t* sin) {
  const int64_t x1 = v[i], x2 = v[i + h];
  v[i] = sat32(round_shift(x1 * cos[i] - x2 * sin[i], kRopeFrac));
  v[i + h] = sat32(round_shift(x2 * cos[i] + x1 * sin[i], kRopeFrac));
}

INTDET_HD int64_t linear_epilogue(int64_t acc, int32_t mant, int32_t shift, int32_t e, const int32_t* bias, int64_t j) {
  int64_t v = shift_round_sat32(acc * mant, (int64_t)shift - e);
  return bias ? sat32(v + bias[j]) : v;
}

// Score of one position in Q16 log2 units: raw = q . k (exact), the key's
// absmax a split as mk * 2^ek (mk <= 2^15) so the product stays in int64.
INTDET_HD int64_t attn_score(int32_t raw, int32_t a, int e_q, int64_t score_mant, int64_t score_shift) {
  int64_t mk, ek;
  normalize_scale15(a, &mk, &ek);
  return shift_round_sat32((int64_t)raw * mk * score_mant, score_shift - e_q - ek);
}

}  // namespace intdet
