// Portable scalar implementations of every op: the C++ reference that SIMD
// and CUDA backends must match bit for bit. Definitions: ref/ops.py.
#include "intdet/ops.h"

#include <cstddef>
#include <vector>

#include "intdet/intmath.h"
#include "intdet/kernels.h"

namespace intdet {

int rms_norm_pre_shift(int64_t m) { return kNormTopBit - bitlen(m); }  // pre-shift so max|x'| has 24 bits

int64_t rms_norm_divisor(int64_t s, int64_t eps_q60, int in_frac, int a) {
  const int64_t e_shift = kEpsFrac - 2 * (in_frac + a);
  int64_t eps;
  if (e_shift >= 0) {
    eps = round_shift(eps_q60, e_shift);
  } else {
    int t = (int)imin(-e_shift, 62);
    eps = (-e_shift >= 62 || eps_q60 > (kSCap >> t)) ? kSCap : shl(eps_q60, t);
  }
  s = imin(s + imin(eps, kSCap), kSCap);
  return imax(isqrt(s), 1);
}

void rms_norm_row(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = imax(m, iabs(x[i]));
  if (m == 0) {
    for (int64_t i = 0; i < n; ++i) y[i] = 0;
    return;
  }
  const int a = rms_norm_pre_shift(m);
  auto xs = [&](int64_t i) { return rms_norm_xs(x[i], a); };
  int64_t s = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = xs(i);
    s += v * v;  // < n * 2^50 <= 2^63 for n <= 2^13 (checked at load)
  }
  const int64_t r = rms_norm_divisor(s, eps_q60, in_frac, a);
  // The row's divisor by its reciprocal (intmath.h DivBy), not a DIV per
  // element: rows of 576 took 1.04 ms per 512 rows with DIV, 0.80 ms so
  // (Sapphire Rapids-class Xeon, with two remainder steps; now one; branch-free:
  // with branches the estimate's misses were mispredicted, 1.8 ms).
  const DivBy div = div_by(r);  // round_div(v, r) = floor_div(v + r / 2, r)
  for (int64_t i = 0; i < n; ++i) y[i] = (int32_t)floor_div(xs(i) * g[i] * ((int64_t)1 << kNormOutFrac) + (r >> 1), div);
}

void add_sat32_row(int64_t* x, const int64_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = sat32(x[i] + d[i]);
}

int quant16_row(const int64_t* x, int64_t n, int16_t* q) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = imax(m, iabs(x[i]));
  const int e = (int)imax(bitlen(m) - 15, 0);
  for (int64_t i = 0; i < n; ++i) q[i] = (int16_t)clamp(round_shift(x[i], e), -kInt16QMax, kInt16QMax);
  return e;
}

int32_t quant8_row(const int64_t* x, int64_t n, int8_t* q) {
  int64_t a = 0;
  for (int64_t i = 0; i < n; ++i) a = imax(a, iabs(x[i]));
  const int64_t d = imax(a, 1);
  for (int64_t i = 0; i < n; ++i) q[i] = quant8_value(x[i], d);
  return (int32_t)a;
}

// Exact dot product of int16 activations and int8 weights. Partial sums of
// 256 products fit int32 (|p| < 2^22), so the inner loop vectorizes; the
// blocks are added in int64. The result is the exact sum whatever the order.
static inline int64_t dot_i16_i8(const int16_t* a, const int8_t* w, int64_t K) {
  int64_t acc = 0;
  for (int64_t k0 = 0; k0 < K; k0 += 256) {
    const int64_t k1 = k0 + 256 < K ? k0 + 256 : K;
    int32_t part = 0;
    for (int64_t k = k0; k < k1; ++k) part += (int32_t)a[k] * (int32_t)w[k];
    acc += part;
  }
  return acc;
}

void linear_generic(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                    const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  for (int64_t j = 0; j < N; ++j) {
    const int8_t* wj = w + j * K;
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot_i16_i8(q + t * K, wj, K), mant[j], shift[j], e[t], bias, j);
  }
}

// Exact dot product with int4 weights w = gd * u + gm per group of 32:
// sum_k a_k (gd u_k + gm) = gd * S + gm * Q with S = sum a_k u_k,
// Q = sum a_k over the group (|S| < 2^24, |Q| <= 2^20), all in int64.
static inline int64_t dot_i16_w4(const int16_t* a, const uint8_t* w4, const int16_t* gd, const int16_t* gm,
                                 int64_t K) {
  int64_t acc = 0;
  for (int64_t g = 0; g < K / 32; ++g) {
    int64_t s = 0, sq = 0;
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t a0 = a[32 * g + 2 * i], a1 = a[32 * g + 2 * i + 1];
      const uint8_t b = w4[16 * g + i];
      s += a0 * (b & 15) + a1 * (b >> 4);
      sq += a0 + a1;
    }
    acc += gd[g] * s + gm[g] * sq;
  }
  return acc;
}

void linear_w4_generic(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
                       const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                       int64_t* out, int64_t ldo) {
  const int64_t G = K / 32;
  for (int64_t j = 0; j < N; ++j)
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot_i16_w4(q + t * K, w4 + j * (K / 2), gd + j * G, gm + j * G, K), mant[j],
                                         shift[j], e[t], bias, j);
}

void rope_row(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin) {
  const int64_t h = D / 2;
  for (int64_t hd = 0; hd < nh; ++hd) {
    int64_t* v = x + hd * D;
    for (int64_t i = 0; i < h; ++i) rope_pair(v, h, i, cos, sin);
  }
}

void exp2_neg_q30_row(const int64_t* u, int64_t n, int64_t* p) {
  for (int64_t i = 0; i < n; ++i) p[i] = exp2_neg_q30(u[i]);
}

void softmax_q16_row_with(const int64_t* z, int64_t n, int64_t* p, ExpRowFn exp_row) {
  int64_t zmax = z[0];
  for (int64_t i = 1; i < n; ++i) zmax = imax(zmax, z[i]);
  for (int64_t i = 0; i < n; ++i) p[i] = zmax - z[i];
  exp_row(p, n, p);
  int64_t tot = 0;
  for (int64_t i = 0; i < n; ++i) tot += p[i];
  const int64_t r = ((int64_t)1 << 62) / tot;  // tot >= 2^30 - 4 > 0: the max term
  for (int64_t i = 0; i < n; ++i) p[i] = round_shift(p[i] * r, 62 - kProbFrac);
}

void softmax_q16_row(const int64_t* z, int64_t n, int64_t* p) { softmax_q16_row_with(z, n, p, exp2_neg_q30_row); }

void swiglu_row_with(const int64_t* g, const int64_t* u, int64_t n, int64_t* a, ExpRowFn exp_row) {
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  for (int64_t i = 0; i < n; ++i) d[i] = round_shift(iabs(g[i]) * kLog2eQ30, 30);  // |g| * log2(e), Q16
  exp_row(d.data(), n, d.data());                                                  // exp(-|g|), Q30
  for (int64_t i = 0; i < n; ++i) a[i] = glu_gate(g[i], u[i], d[i]);
}

void swiglu_row(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  swiglu_row_with(g, u, n, a, exp2_neg_q30_row);
}

void geglu_row_with(const int64_t* g, const int64_t* u, int64_t n, int64_t* a, ExpRowFn exp_row) {
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  for (int64_t i = 0; i < n; ++i) d[i] = gelu_exp2_arg(g[i]);  // |y| * log2(e), Q16
  exp_row(d.data(), n, d.data());                               // exp(-|y|), Q30
  for (int64_t i = 0; i < n; ++i) a[i] = glu_gate(g[i], u[i], d[i]);  // sign(y) = sign(g): as in swiglu
}

void geglu_row(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  geglu_row_with(g, u, n, a, exp2_neg_q30_row);
}

void attend_head(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                 const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                 int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out) {
  // Scores in Q16 log2 units; kc/vc rows are `stride` int8 apart, ka/va
  // scales `stride / D` apart (one per kv head per position).
  const int64_t sstride = stride / D;
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* k = kc + t * stride;
    int32_t raw = 0;  // |q . k| <= 2^15 * 127 * 256 < 2^31: exact in int32
    for (int64_t d = 0; d < D; ++d) raw += (int32_t)q[d] * k[d];
    z[t] = attn_score(raw, ka[t * sstride], e_q, score_mant, score_shift);
  }
  softmax_q16_row(z, n, p);
  for (int64_t t = 0; t < n; ++t) p[t] *= va[t * sstride];  // w_t = p_t * a_t < 2^47
  const int s = quant16_row(p, n, w16);
  for (int64_t d = 0; d < D; ++d) out[d] = 0;
  // 512 products of |w16 * v| <= 32767 * 127 sum below 2^31: int32 blocks.
  for (int64_t t0 = 0; t0 < n; t0 += kPvBlock) {
    const int64_t t1 = t0 + kPvBlock < n ? t0 + kPvBlock : n;
    int32_t acc[256] = {0};
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* v = vc + t * stride;
      for (int64_t d = 0; d < D; ++d) acc[d] += (int32_t)w16[t] * v[d];
    }
    for (int64_t d = 0; d < D; ++d) out[d] += acc[d];
  }
  for (int64_t d = 0; d < D; ++d) out[d] = shl(out[d], s);
}

void qk_tile_generic(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                     int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  const int64_t sstride = stride / D;
  for (int64_t t = 0; t < n; ++t) {  // one key, then every row: the key stays in cache
    const int8_t* k = kc + t * stride;
    for (int64_t r = 0; r < R; ++r) {
      const int16_t* qr = q + r * D;
      int32_t raw = 0;  // |q . k| <= 2^15 * 127 * 256 < 2^31: exact in int32
      for (int64_t d = 0; d < D; ++d) raw += (int32_t)qr[d] * k[d];
      z[r * ldz + t] = attn_score(raw, ka[t * sstride], e_q[r], score_mant, score_shift);
    }
  }
}

void pv_tile_generic(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride,
                     int64_t D, int64_t* out) {
  for (int64_t t0 = 0; t0 < n; t0 += kPvBlock) {
    const int64_t t1 = t0 + kPvBlock < n ? t0 + kPvBlock : n;
    for (int64_t r = 0; r < R; ++r) {
      int32_t acc[256] = {0};  // 512 products |w16 * v| <= 32767 * 127 sum below 2^31
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t w = w16[r * ldw + t];
        const int8_t* v = vc + t * stride;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
      }
      for (int64_t d = 0; d < D; ++d) out[r * D + d] += acc[d];
    }
  }
}

int64_t attn_row_max_generic(const int64_t* z, int64_t n) {
  int64_t mx = z[0];
  for (int64_t i = 1; i < n; ++i) mx = imax(mx, z[i]);
  return mx;
}

int64_t attn_exp_sum_generic(int64_t* z, int64_t n, int64_t zmax) {
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += z[i] = exp2_neg_q30(zmax - z[i]);
  return sum;
}

int64_t attn_prob_max_generic(const int64_t* u, int64_t n, int64_t rr, const int32_t* va) {
  int64_t mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = imax(mx, round_shift(u[i] * rr, 62 - kProbFrac) * va[i]);
  return mx;
}

void attn_prob_w16_generic(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16) {
  for (int64_t i = 0; i < n; ++i)
    w16[i] = (int16_t)clamp(round_shift(round_shift(u[i] * rr, 62 - kProbFrac) * va[i], e), -kInt16QMax, kInt16QMax);
}

// The portable kernel set: the functions above on row-major weights.
extern const Kernels kScalarKernels;
constinit const Kernels kScalarKernels{
    .name = "scalar",
    .cpu_runs = [] { return true; },
    .packing = nullptr,
    .linear = linear_generic,
    .linear_packed = nullptr,
    .linear_w4 = linear_w4_generic,
    .linear_w4_packed = nullptr,
    .qk_tile = qk_tile_generic,
    .pv_tile = pv_tile_generic,
    .attn_row = kAttnRowGeneric,
    .softmax = softmax_q16_row,
    .exp2_row = exp2_neg_q30_row,
    .quant16 = quant16_row,
    .rms_norm = rms_norm_row,
    .add_sat32 = add_sat32_row,
    .rope = rope_row,
    .quant8_row = quant8_row,
    .swiglu = swiglu_row,
    .geglu = geglu_row,
    .planes = {},  // no planes path
};

}  // namespace intdet
