// The AVX-512 kernel set's attention and row kernels (same bits as the
// scalar ones; dots are exact in any order) and its entry (AVX512F/BW/VL +
// VNNI). Its CPU check is in
// avx512_cpu.cpp (baseline code, no ISA flags), the linear layers (on the
// AVX2 set's g8 packing) in avx512_gemm.cpp and avx512_w4.cpp.
// Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni only, or against SIMDe in the test build (INTDET_AVX512_SIMDE,
// where the set is emulated on an AVX2 CPU). docs/kernel-sets.md.
#include <cstdint>
#include <vector>

#include "avx2.h"
#include "avx512.h"
#include "avx512_intrin.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {

// exp2_neg_q30 on eight int64 lanes (same bits; the AVX2 kernel's steps).
// Horner steps keep p in the low 32 bits of each lane: every intermediate
// fits int32 and vpmuldq reads exactly those bits; a logical right shift
// gives the same low 32 bits as the arithmetic one. u >= 0; in place allowed.
namespace {

// exp2_neg_q30 of eight int64 lanes u >= 0 (see exp2_neg_q30_row_avx512).
inline __m512i exp2_lanes(__m512i uu) {
  const __m512i fmask = _mm512_set1_epi64((1 << kExpFrac) - 1);
  const __m512i half = _mm512_set1_epi64((int64_t)1 << (kExpFrac - 1)), lo32 = _mm512_set1_epi64(0xffffffffLL);
  const __m512i one = _mm512_set1_epi64(1), i30 = _mm512_set1_epi64(30);
  const __m512i ip = _mm512_srli_epi64(uu, kExpFrac), f = _mm512_and_si512(uu, fmask);
  __m512i q = _mm512_set1_epi64(kExp2Poly[6]);
  for (int k = 5; k >= 0; --k) {
    const __m512i prod = _mm512_add_epi64(_mm512_mul_epi32(q, f), half);
    q = _mm512_add_epi32(_mm512_srli_epi64(prod, kExpFrac), _mm512_set1_epi64(kExp2Poly[k]));
  }
  q = _mm512_and_si512(q, lo32);                           // 2^-f in Q30 is positive: zero-extend
  const __mmask8 past = _mm512_cmpgt_epi64_mask(ip, i30);  // 2^-31 and below: 0
  const __m512i ish = _mm512_mask_blend_epi64(past, ip, i30);
  const __m512i bias = _mm512_srli_epi64(_mm512_sllv_epi64(one, ish), 1);
  const __m512i r = _mm512_srlv_epi64(_mm512_add_epi64(q, bias), ish);
  return _mm512_maskz_mov_epi64((__mmask8)~past, r);
}

// The sum of 8 int64 lanes (SIMDe 0.8.2 has no _mm512_reduce_add_epi64).
inline int64_t lane_sum(__m512i v) {
  alignas(64) int64_t a[8];
  _mm512_store_si512((void*)a, v);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// The attention softmax's p = round_shift(u * rr, 62 - kProbFrac) * va on 8
// lanes: the AVX2 set's ProbLanes (avx2.cpp, where the bounds are stated).
struct ProbLanes8 {
  __m512i rl, rh, half;
  explicit ProbLanes8(int64_t rr)
      : rl(_mm512_set1_epi64(rr & 0xffffffffLL)),
        rh(_mm512_set1_epi64(rr >> 32 ? -1 : 0)),
        half(_mm512_set1_epi64((int64_t)1 << (61 - kProbFrac))) {}
  __m512i operator()(const int64_t* u, const int32_t* va) const {
    const __m512i uu = _mm512_loadu_si512((const void*)u);
    const __m512i x = _mm512_add_epi64(_mm512_mul_epu32(uu, rl), _mm512_and_si512(_mm512_slli_epi64(uu, 32), rh));
    const __m512i p0 = _mm512_srli_epi64(_mm512_add_epi64(x, half), 62 - kProbFrac);
    // va >= 0 (absmax scales): its sign extension is its zero extension
    return _mm512_mul_epu32(p0, _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)va)));
  }
};

}  // namespace

// exp2_neg_q30 on eight int64 lanes (same bits; the AVX2 kernel's steps).
// Horner steps keep p in the low 32 bits of each lane: every intermediate
// fits int32 and vpmuldq reads exactly those bits; a logical right shift
// gives the same low 32 bits as the arithmetic one. u >= 0; in place allowed.
void exp2_neg_q30_row_avx512(const int64_t* u, int64_t n, int64_t* p) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm512_storeu_si512((void*)(p + i), exp2_lanes(_mm512_loadu_si512((const void*)(u + i))));
  for (; i < n; ++i) p[i] = exp2_neg_q30(u[i]);
}

// The attention softmax's row passes (AttnRowFns, same bits as the
// *_generic ones) on 8 int64 lanes.
int64_t attn_row_max_avx512(const int64_t* z, int64_t n) {
  int64_t i = 0, mx = z[0];
  if (n >= 16) {
    __m512i a = _mm512_loadu_si512((const void*)z), b = _mm512_loadu_si512((const void*)(z + 8));
    for (i = 16; i + 16 <= n; i += 16) {
      a = _mm512_max_epi64(a, _mm512_loadu_si512((const void*)(z + i)));
      b = _mm512_max_epi64(b, _mm512_loadu_si512((const void*)(z + i + 8)));
    }
    mx = _mm512_reduce_max_epi64(_mm512_max_epi64(a, b));
  }
  for (; i < n; ++i) mx = imax(mx, z[i]);
  return mx;
}

// zmax - z < 2^32 (scores are int32), so the exp2 lanes' input is exact.
int64_t attn_exp_sum_avx512(int64_t* z, int64_t n, int64_t zmax) {
  const __m512i m = _mm512_set1_epi64(zmax);
  __m512i s = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i u = exp2_lanes(_mm512_sub_epi64(m, _mm512_loadu_si512((const void*)(z + i))));
    _mm512_storeu_si512((void*)(z + i), u);
    s = _mm512_add_epi64(s, u);
  }
  int64_t sum = lane_sum(s);
  for (; i < n; ++i) sum += z[i] = exp2_neg_q30(zmax - z[i]);
  return sum;
}

int64_t attn_prob_max_avx512(const int64_t* u, int64_t n, int64_t rr, const int32_t* va) {
  if (!attn_prob_lanes_ok(rr)) return attn_prob_max_generic(u, n, rr, va);
  const ProbLanes8 pl(rr);
  __m512i a = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) a = _mm512_max_epi64(a, pl(u + i, va + i));
  const int64_t mx = _mm512_reduce_max_epi64(a);
  return i < n ? imax(mx, attn_prob_max_generic(u + i, n - i, rr, va + i)) : mx;
}

// w16 = min(round_shift(p, e), 32767) (p >= 0, so the lower clamp never
// applies; p < 2^48, so p + 2^(e-1) cannot overflow); vpmovsqw narrows the
// lanes, all in [0, 32767].
void attn_prob_w16_avx512(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16) {
  if (!attn_prob_lanes_ok(rr) || e > 62) return attn_prob_w16_generic(u, n, rr, va, e, w16);
  const ProbLanes8 pl(rr);
  const __m512i half = _mm512_set1_epi64(e ? (int64_t)1 << (e - 1) : 0), top = _mm512_set1_epi64(kInt16QMax);
  const __m128i sh = _mm_cvtsi32_si128(e);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i y = _mm512_min_epi64(_mm512_srl_epi64(_mm512_add_epi64(pl(u + i, va + i), half), sh), top);
    _mm_storeu_si128((__m128i*)(w16 + i), _mm512_cvtsepi64_epi16(y));
  }
  if (i < n) attn_prob_w16_generic(u + i, n - i, rr, va + i, e, w16 + i);
}

void softmax_q16_row_avx512(const int64_t* z, int64_t n, int64_t* p) {
  softmax_q16_row_with(z, n, p, exp2_neg_q30_row_avx512);
}

// quant16_row on eight int64 lanes (same bits). |x| <= m < 2^(e+15), so
// every rounded value fits in 17 bits; the arithmetic right shift is built
// from the logical one by the sign-flip identity (x >> e) = ~(~x >>> e);
// vpmovsqw saturates +32768 to 32767, the max before it lifts -32768 to -32767.
int quant16_row_avx512(const int64_t* x, int64_t n, int16_t* q) {
  const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi64(-1);
  __m512i vm = zero;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)  // |x| (inputs exceed -2^63)
    vm = _mm512_max_epi64(vm, _mm512_abs_epi64(_mm512_loadu_si512((const void*)(x + i))));
  int64_t m = _mm512_reduce_max_epi64(vm);
  for (int64_t j = i; j < n; ++j) m = imax(m, iabs(x[j]));
  const int e = (int)imax(bitlen(m) - 15, 0);
  const __m512i half = _mm512_set1_epi64(e ? (int64_t)1 << (e - 1) : 0);
  const __m128i sh = _mm_cvtsi32_si128(e);
  const __m512i lo = _mm512_set1_epi64(-kInt16QMax);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m512i y = _mm512_add_epi64(_mm512_loadu_si512((const void*)(x + i)), half);
    const __m512i sg = _mm512_maskz_mov_epi64(_mm512_cmpgt_epi64_mask(zero, y), ones);
    const __m512i r = _mm512_xor_si512(_mm512_srl_epi64(_mm512_xor_si512(y, sg), sh), sg);
    _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtsepi64_epi16(_mm512_max_epi64(r, lo)));
  }
  for (; i < n; ++i) q[i] = (int16_t)clamp(round_shift(x[i], e), -kInt16QMax, kInt16QMax);
  return e;
}

// swiglu_row with its exp(-|g|) on the exp2 lanes (same bits).
namespace {

// floor(x / 2^30) for int64 lanes (SIMDe 0.8.2 has no 64-bit arithmetic
// shift): ~(~x >>> 30) where x < 0.
inline __m512i floor_shift30(__m512i x) {
  const __m512i neg = _mm512_mask_blend_epi64(_mm512_cmpgt_epi64_mask(_mm512_setzero_si512(), x),
                                              _mm512_setzero_si512(), _mm512_set1_epi64(-1));
  return _mm512_xor_si512(_mm512_srli_epi64(_mm512_xor_si512(x, neg), 30), neg);
}

// q = floor(2^60 / den) and r = 2^60 - q * den for den in [2^30, 2^31], exact,
// without a division: Newton's iteration X <- X (2 - D X) for 1/D, D =
// den / 2^31 in [1/2, 1], in Q30 from X0 = 48/17 - 32/17 D (relative error
// <= 1/17; Newton squares it: three steps leave about 2^-30, the fixed-point
// truncation): X / 2 is within 1 of q for every den in [2^30, 2^31] (all
// 2^30 + 1 checked against 64-bit division); then q is corrected until
// 0 <= r < den, and a lane that still misses takes the scalar path, so the
// result is exact whatever the estimate's error.
// Every product is unsigned 32 x 32 -> 64 bits (vpmuludq). False if a lane
// still misses after the corrections (the caller takes the scalar path).
inline bool recip60(__m512i den, __m512i* q_out, __m512i* r_out) {
  const __m512i x0 = _mm512_sub_epi64(_mm512_set1_epi64(3031741620),  // 48/17 in Q30
                                      _mm512_srli_epi64(_mm512_mul_epu32(den, _mm512_set1_epi64(1010580540)), 30));
  __m512i x = x0;  // 16/17 in Q30 times den = 32/17 D in Q30
  for (int k = 0; k < 3; ++k) {
    const __m512i dx = _mm512_srli_epi64(_mm512_mul_epu32(den, x), 31);  // D X in Q30
    const __m512i t = _mm512_sub_epi64(_mm512_set1_epi64((int64_t)1 << 31), dx);
    x = _mm512_srli_epi64(_mm512_mul_epu32(x, t), 30);
  }
  __m512i q = _mm512_srli_epi64(x, 1);
  __m512i r = _mm512_sub_epi64(_mm512_set1_epi64((int64_t)1 << 60), _mm512_mul_epu32(q, den));
  const __m512i one = _mm512_set1_epi64(1), zero = _mm512_setzero_si512();
  for (int k = 0; k < 2; ++k) {  // the estimate is within 1 of q for every den in range (checked exhaustively)
    const __mmask8 lo = _mm512_cmpgt_epi64_mask(zero, r);   // r < 0: q too large
    const __mmask8 hi = _mm512_cmpge_epi64_mask(r, den);    // r >= den: q too small
    q = _mm512_mask_sub_epi64(q, lo, q, one);
    r = _mm512_mask_add_epi64(r, lo, r, den);
    q = _mm512_mask_add_epi64(q, hi, q, one);
    r = _mm512_mask_sub_epi64(r, hi, r, den);
  }
  *q_out = q;
  *r_out = r;
  return (_mm512_cmpgt_epi64_mask(zero, r) | _mm512_cmpge_epi64_mask(r, den)) == 0;
}

// a[i] = glu_gate(g[i], u[i], d[i]) for 8 elements: sigmoid from recip60,
// round_div's two forms (2^60 + h and d 2^30 + h = den 2^30 - 2^60 + h, h =
// den / 2) read off q and r. |g|, |u| <= 2^31 - 1 (the caller checks), so
// g * sig and the rounded gate times u are signed 32 x 32 -> 64 products.
inline bool glu_gate8(const int64_t* g, const int64_t* u, const int64_t* d, int64_t* a) {
  const __m512i gg = _mm512_loadu_si512((const void*)g), dd = _mm512_loadu_si512((const void*)d);
  const __m512i den = _mm512_add_epi64(_mm512_set1_epi64((int64_t)1 << 30), dd);
  __m512i q, r;
  if (!recip60(den, &q, &r)) return false;
  const __m512i h = _mm512_srli_epi64(den, 1), one = _mm512_set1_epi64(1);
  // g >= 0: floor((2^60 + h) / den) = q + [r + h >= den]
  const __m512i pos = _mm512_mask_add_epi64(q, _mm512_cmpge_epi64_mask(_mm512_add_epi64(r, h), den), q, one);
  // g < 0: floor((d 2^30 + h) / den) = 2^30 - q - [h < r]
  __m512i neg = _mm512_sub_epi64(_mm512_set1_epi64((int64_t)1 << 30), q);
  neg = _mm512_mask_sub_epi64(neg, _mm512_cmpgt_epi64_mask(r, h), neg, one);
  const __m512i sig = _mm512_mask_blend_epi64(_mm512_cmpgt_epi64_mask(_mm512_setzero_si512(), gg), pos, neg);
  const __m512i gs = floor_shift30(_mm512_add_epi64(_mm512_mul_epi32(gg, sig), _mm512_set1_epi64((int64_t)1 << 29)));
  _mm512_storeu_si512((void*)a, _mm512_mul_epi32(gs, _mm512_loadu_si512((const void*)u)));
  return true;
}

// Whether every |x[i]| and |y[i]| <= 2^31 - 1 (glu_gate8's operand bound).
inline bool fits_int32(const int64_t* x, const int64_t* y, int64_t n) {
  // min and max, not |x|: vpabsq leaves INT64_MIN negative
  const __m512i top = _mm512_set1_epi64(kInt32Max), bot = _mm512_set1_epi64(-kInt32Max);
  __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i a = _mm512_loadu_si512((const void*)(x + i)), b = _mm512_loadu_si512((const void*)(y + i));
    hi = _mm512_max_epi64(hi, _mm512_max_epi64(a, b));
    lo = _mm512_min_epi64(lo, _mm512_min_epi64(a, b));
  }
  if (_mm512_cmpgt_epi64_mask(hi, top) | _mm512_cmpgt_epi64_mask(bot, lo)) return false;
  for (; i < n; ++i)
    if (x[i] > kInt32Max || x[i] < -kInt32Max || y[i] > kInt32Max || y[i] < -kInt32Max) return false;
  return true;
}

// The rows' last step, a[i] = glu_gate(g[i], u[i], d[i]), 8 at a time.
void glu_rows(const int64_t* g, const int64_t* u, const int64_t* d, int64_t n, int64_t* a) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    if (!glu_gate8(g + i, u + i, d + i, a + i))
      for (int64_t k = i; k < i + 8; ++k) a[k] = glu_gate(g[k], u[k], d[k]);
  for (; i < n; ++i) a[i] = glu_gate(g[i], u[i], d[i]);
}

}  // namespace

// swiglu_row on eight int64 lanes (same bits): the exp2 argument and the
// sigmoid's division (recip60) in vectors; rows whose g or u leave the int32
// range (not produced by a linear layer, whose outputs saturate) take the
// scalar row.
void swiglu_row_avx512(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  if (!fits_int32(g, u, n)) return swiglu_row_with(g, u, n, a, exp2_neg_q30_row_avx512);
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  int64_t i = 0;
  const __m512i l2e = _mm512_set1_epi64(kLog2eQ30), half = _mm512_set1_epi64((int64_t)1 << 29);
  for (; i + 8 <= n; i += 8) {  // round_shift(|g| log2(e), 30), |g| < 2^31: unsigned 32 x 32 -> 64
    const __m512i ag = _mm512_abs_epi64(_mm512_loadu_si512((const void*)(g + i)));
    _mm512_storeu_si512((void*)(d.data() + i), _mm512_srli_epi64(_mm512_add_epi64(_mm512_mul_epu32(ag, l2e), half), 30));
  }
  for (; i < n; ++i) d[i] = round_shift(iabs(g[i]) * kLog2eQ30, 30);
  exp2_neg_q30_row_avx512(d.data(), n, d.data());  // exp(-|g|), Q30
  glu_rows(g, u, d.data(), n, a);
}

// geglu_row (Gemma's tanh-GELU gate) with its exp2 and sigmoid on the same lanes (same bits).
void geglu_row_avx512(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  if (!fits_int32(g, u, n)) return geglu_row_with(g, u, n, a, exp2_neg_q30_row_avx512);
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  for (int64_t i = 0; i < n; ++i) d[i] = gelu_exp2_arg(g[i]);  // |y| log2(e), Q16
  exp2_neg_q30_row_avx512(d.data(), n, d.data());               // exp(-|y|), Q30
  glu_rows(g, u, d.data(), n, a);
}


// add_sat32_row on eight int64 lanes (same bits).
void add_sat32_row_avx512(int64_t* x, const int64_t* d, int64_t n) {
  const __m512i hi = _mm512_set1_epi64(kInt32Max), lo = _mm512_set1_epi64(-kInt32Max);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i v = _mm512_add_epi64(_mm512_loadu_si512((const void*)(x + i)), _mm512_loadu_si512((const void*)(d + i)));
    _mm512_storeu_si512((void*)(x + i), _mm512_max_epi64(_mm512_min_epi64(v, hi), lo));
  }
  for (; i < n; ++i) x[i] = sat32(x[i] + d[i]);
}

// quant8_row on eight int64 lanes (same bits): q = clamp(round_div(127 x,
// d), +-127) with d = max(max |x|, 1). Since |x| <= d the quotient
// floor((127 x + d / 2) / d) lies in [-127, 127], so n = 127 x + d / 2 +
// 128 d is in [0, 256 d) and floor(n / d) - 128 is the same integer: eight
// compare-and-subtract steps of d << k (k = 7..0) find it exactly.
// Domain, as quant8_row's: |x| <= 2^31 - 1 (the forward's K and V are
// int32 linear outputs; ops.quant8_row refuses anything else), so vpmuldq's
// 127 x is exact and the absmax fits the int32 result.
int32_t quant8_row_avx512(const int64_t* x, int64_t n, int8_t* q) {
  __m512i m = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm512_max_epi64(m, _mm512_abs_epi64(_mm512_loadu_si512((const void*)(x + i))));
  int64_t a = _mm512_reduce_max_epi64(m);
  for (int64_t j = i; j < n; ++j) a = imax(a, iabs(x[j]));
  const int64_t d = imax(a, 1);
  const __m512i c127 = _mm512_set1_epi64(127), bias = _mm512_set1_epi64((d >> 1) + 128 * d);
  for (i = 0; i + 8 <= n; i += 8) {
    __m512i r = _mm512_add_epi64(_mm512_mul_epi32(_mm512_loadu_si512((const void*)(x + i)), c127), bias);
    __m512i qv = _mm512_setzero_si512();
    for (int k = 7; k >= 0; --k) {  // restoring division: bit k of the quotient
      const __m512i t = _mm512_set1_epi64(d << k);
      const __mmask8 ge = _mm512_cmpge_epi64_mask(r, t);
      r = _mm512_mask_sub_epi64(r, ge, r, t);
      qv = _mm512_mask_add_epi64(qv, ge, qv, _mm512_set1_epi64((int64_t)1 << k));
    }
    alignas(64) int64_t o[8];
    _mm512_store_si512((void*)o, _mm512_sub_epi64(qv, _mm512_set1_epi64(128)));
    for (int j = 0; j < 8; ++j) q[i + j] = (int8_t)clamp(o[j], -kInt8QMax, kInt8QMax);
  }
  for (; i < n; ++i) q[i] = quant8_value(x[i], d);
  return (int32_t)a;
}

// rope_row on eight int64 lanes (same bits), head by head. A head whose
// elements all fit int32 (the forward's always do: the linear epilogue
// saturates to int32) takes the lanes: vpmuldq forms x * cos and x * sin
// exactly from the low 32 bits, |x1 cos - x2 sin| < 2 * 2^31 * 2^15 = 2^47,
// and round_shift by kRopeFrac is an add and an arithmetic shift. Any other
// head (|x| up to the scalar row's 2^47) takes rope_row.
void rope_row_avx512(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin) {
  const int64_t h = D / 2;
  const __m512i hi = _mm512_set1_epi64(kInt32Max), lo = _mm512_set1_epi64(-kInt32Max);
  const __m512i half = _mm512_set1_epi64((int64_t)1 << (kRopeFrac - 1)), sh = _mm512_set1_epi64(kRopeFrac);
  // (vpsravq with a constant count and the int16 -> int32 -> int64 widening:
  // the forms the SIMDe test build has, avx512_intrin.h)
  const auto wide = [](const int16_t* p) {
    return _mm512_cvtepi32_epi64(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)p)));
  };
  for (int64_t hd = 0; hd < nh; ++hd) {
    int64_t* v = x + hd * D;
    if (!fits_int32(v, v + h, h)) {
      rope_row(v, 1, D, cos, sin);
      continue;
    }
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
      const __m512i x1 = _mm512_loadu_si512((const void*)(v + i)), x2 = _mm512_loadu_si512((const void*)(v + h + i));
      const __m512i c = wide(cos + i), s = wide(sin + i);
      const __m512i a = _mm512_sub_epi64(_mm512_mul_epi32(x1, c), _mm512_mul_epi32(x2, s));
      const __m512i b = _mm512_add_epi64(_mm512_mul_epi32(x2, c), _mm512_mul_epi32(x1, s));
      const __m512i ra = _mm512_srav_epi64(_mm512_add_epi64(a, half), sh);
      const __m512i rb = _mm512_srav_epi64(_mm512_add_epi64(b, half), sh);
      _mm512_storeu_si512((void*)(v + i), _mm512_max_epi64(_mm512_min_epi64(ra, hi), lo));
      _mm512_storeu_si512((void*)(v + h + i), _mm512_max_epi64(_mm512_min_epi64(rb, hi), lo));
    }
    for (; i < h; ++i) rope_pair(v, h, i, cos, sin);  // the tail
  }
}

// rms_norm_row on eight int64 lanes (same bits): the max, the pre-shift and
// the sum of squares in lanes, the per-row steps shared with the scalar
// row (rms_norm_pre_shift, rms_norm_divisor), then floor_div by the row's r
// in lanes. Bounds: |x| < 2^62 (else the scalar row); |xs| <= 2^24 and
// |g| <= 2^15, so xs * g * 2^14 + r / 2 is below 2^54 and xs fits int32
// (vpmuldq squares it exactly); r >= 2^23 because max |xs| >= 2^23.
// floor_div(v, r) for v >= 0: q = floor(v * inv / 2^62), inv =
// floor(2^62 / r) < 2^39, is floor(v / r) or one below it (v * (2^62 / r -
// inv) < 2^54 / 2^62 < 1) and never above; the 64-bit product's high part
// comes from four 32 x 32 -> 64 products (the low one's low half dropped
// cannot lift the floor of / 2^30 by more than one either); then two
// remainder corrections (q < 2^32, r < 2^32:
// q * r is one vpmuludq). v < 0: floor_div(v) = ~udiv(~v), as the scalar.
void rms_norm_row_avx512(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y) {
  int64_t i = 0;
  __m512i vm = _mm512_setzero_si512();
  const __m512i big = _mm512_set1_epi64((int64_t)1 << 62);
  __mmask8 wide = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i a = _mm512_abs_epi64(_mm512_loadu_si512((const void*)(x + i)));
    wide |= _mm512_cmpge_epu64_mask(a, big);  // |x| >= 2^62, or x = INT64_MIN
    vm = _mm512_max_epi64(vm, a);
  }
  if (wide) return rms_norm_row(x, g, n, eps_q60, in_frac, y);
  alignas(64) int64_t lanes[8];
  _mm512_store_si512((void*)lanes, vm);
  int64_t m = 0;
  for (int k = 0; k < 8; ++k) m = imax(m, lanes[k]);
  for (; i < n; ++i) {
    if (x[i] >= ((int64_t)1 << 62) || x[i] <= -((int64_t)1 << 62)) return rms_norm_row(x, g, n, eps_q60, in_frac, y);
    m = imax(m, iabs(x[i]));
  }
  if (m == 0) {
    for (i = 0; i < n; ++i) y[i] = 0;
    return;
  }
  const int a = rms_norm_pre_shift(m);
  auto xs = [&](int64_t k) { return rms_norm_xs(x[k], a); };
  // xs on 8 lanes: x << a, or (x + 2^(-a-1)) >> -a (arithmetic)
  const __m512i vl = _mm512_set1_epi64(a >= 0 ? a : 0), vr = _mm512_set1_epi64(a < 0 ? -a : 0);
  const __m512i vh = _mm512_set1_epi64(a < 0 ? (int64_t)1 << (-a - 1) : 0);
  auto xs8 = [&](int64_t k) {
    const __m512i v = _mm512_loadu_si512((const void*)(x + k));
    return a >= 0 ? _mm512_sllv_epi64(v, vl) : _mm512_srav_epi64(_mm512_add_epi64(v, vh), vr);
  };
  __m512i vs = _mm512_setzero_si512();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m512i v = xs8(i);
    vs = _mm512_add_epi64(vs, _mm512_mul_epi32(v, v));
  }
  _mm512_store_si512((void*)lanes, vs);
  int64_t s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) s += xs(i) * xs(i);
  const int64_t r = rms_norm_divisor(s, eps_q60, in_frac, a);
  if (r < ((int64_t)1 << 23) || r >= ((int64_t)1 << 32)) return rms_norm_row(x, g, n, eps_q60, in_frac, y);
  const int64_t inv = ((int64_t)1 << 62) / r;
  const __m512i vr_ = _mm512_set1_epi64(r), vhalf = _mm512_set1_epi64(r >> 1), one = _mm512_set1_epi64(1);
  const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi64(-1);
  const __m512i i0 = _mm512_set1_epi64(inv & 0xffffffffLL), i1 = _mm512_set1_epi64(inv >> 32);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m512i gg = _mm512_cvtepi32_epi64(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)(g + i))));
    const __m512i v = _mm512_add_epi64(_mm512_slli_epi64(_mm512_mul_epi32(xs8(i), gg), kNormOutFrac), vhalf);
    const __m512i neg = _mm512_mask_blend_epi64(_mm512_cmpgt_epi64_mask(zero, v), zero, ones);  // v < 0: all ones
    const __m512i u = _mm512_xor_si512(v, neg);  // >= 0, < 2^54
    const __m512i u1 = _mm512_srli_epi64(u, 32);
    const __m512i mid = _mm512_add_epi64(_mm512_add_epi64(_mm512_srli_epi64(_mm512_mul_epu32(u, i0), 32),
                                                          _mm512_mul_epu32(u, i1)),
                                         _mm512_mul_epu32(u1, i0));
    const __m512i hi = _mm512_add_epi64(_mm512_slli_epi64(_mm512_mul_epu32(u1, i1), 32), mid);  // floor(u inv / 2^32)
    __m512i q = _mm512_srli_epi64(hi, 30);
    __m512i rem = _mm512_sub_epi64(u, _mm512_mul_epu32(q, vr_));
    for (int c = 0; c < 2; ++c) {
      const __mmask8 ge = _mm512_cmpge_epu64_mask(rem, vr_);
      q = _mm512_mask_add_epi64(q, ge, q, one);
      rem = _mm512_mask_sub_epi64(rem, ge, rem, vr_);
    }
    _mm256_storeu_si256((__m256i*)(y + i), _mm512_cvtepi64_epi32(_mm512_xor_si512(q, neg)));
  }
  for (; i < n; ++i) y[i] = rms_norm_out(xs(i), g[i], r);
}

// Constant-initialized (no code runs at load on a CPU without AVX-512).
extern const Kernels kAvx512Kernels;
constinit const Kernels kAvx512Kernels{
    .name = "avx512",
    .cpu_runs = cpu_has_avx512_vnni,
    .packing = &kPackG8,  // the AVX2 set's layout: one packed copy for both
    .linear = nullptr,
    .linear_packed = linear_avx512_packed,
    .linear_w4 = nullptr,
    .linear_w4_packed = linear_w4_avx512_packed,
    // The tiles on 512-bit VNNI (avx512_attn.cpp): scores with vpdpbusd on the
    // int8 keys, P.V with vpdpwssd (about 2x the AVX2 tiles at SmolLM2's shape).
    .qk_tile = qk_tile_avx512,
    .pv_tile = pv_tile_avx512,
    .attn_row = {attn_row_max_avx512, attn_exp_sum_avx512, attn_prob_max_avx512, attn_prob_w16_avx512},
    .softmax = softmax_q16_row_avx512,
    .exp2_row = exp2_neg_q30_row_avx512,
    .quant16 = quant16_row_avx512,
    .rms_norm = rms_norm_row_avx512,
    .add_sat32 = add_sat32_row_avx512,
    .rope = rope_row_avx512,
    .quant8_row = quant8_row_avx512,
    .swiglu = swiglu_row_avx512,
    .geglu = geglu_row_avx512,
    .planes = {},
};

}  // namespace intdet
