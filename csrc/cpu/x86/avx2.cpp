// AVX2 attention and row kernels (compiled with -mavx2 only) and the AVX2
// kernel set's entry; the linear layers are in avx2_gemm.cpp and avx2_w4.cpp.
// Same bits as attend_head: dots are exact in any order.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "avx2.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {

// exp2_neg_q30 on four int64 lanes (same bits). Horner steps keep p in the
// low 32 bits of each lane: every intermediate fits int32 and vpmuldq reads
// exactly those bits; a logical right shift gives the same low 32 bits as
// the arithmetic one. u >= 0.
namespace {

inline __m256i exp2_lanes(__m256i uu) {
  const __m256i fmask = _mm256_set1_epi64x((1 << kExpFrac) - 1);
  const __m256i half = _mm256_set1_epi64x((int64_t)1 << (kExpFrac - 1)), lo32 = _mm256_set1_epi64x(0xffffffffLL);
  const __m256i one = _mm256_set1_epi64x(1), i30 = _mm256_set1_epi64x(30);
  const __m256i ip = _mm256_srli_epi64(uu, kExpFrac), f = _mm256_and_si256(uu, fmask);
  __m256i q = _mm256_set1_epi64x(kExp2Poly[6]);
  for (int k = 5; k >= 0; --k) {
    const __m256i prod = _mm256_add_epi64(_mm256_mul_epi32(q, f), half);
    q = _mm256_add_epi32(_mm256_srli_epi64(prod, kExpFrac), _mm256_set1_epi64x(kExp2Poly[k]));
  }
  q = _mm256_and_si256(q, lo32);  // 2^-f in Q30 is positive: zero-extend
  const __m256i past = _mm256_cmpgt_epi64(ip, i30);  // 2^-31 and below: 0
  const __m256i ish = _mm256_blendv_epi8(ip, i30, past);
  const __m256i bias = _mm256_srli_epi64(_mm256_sllv_epi64(one, ish), 1);
  const __m256i r = _mm256_srlv_epi64(_mm256_add_epi64(q, bias), ish);
  return _mm256_andnot_si256(past, r);
}

}  // namespace

// exp2_neg_q30 over a row, four lanes at a time (exp2_lanes above); in place
// (p == u) is allowed.
void exp2_neg_q30_row_avx2(const int64_t* u, int64_t n, int64_t* p) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_si256((__m256i*)(p + i), exp2_lanes(_mm256_loadu_si256((const __m256i*)(u + i))));
  for (; i < n; ++i) p[i] = exp2_neg_q30(u[i]);
}

// The softmax's row passes (AttnRowFns; same bits as attn_*_generic).
int64_t attn_row_max_avx2(const int64_t* z, int64_t n) {
  int64_t i = 0, mx = z[0];
  if (n >= 8) {
    __m256i a = _mm256_loadu_si256((const __m256i*)z), b = _mm256_loadu_si256((const __m256i*)(z + 4));
    for (i = 8; i + 8 <= n; i += 8) {
      const __m256i x = _mm256_loadu_si256((const __m256i*)(z + i)), y = _mm256_loadu_si256((const __m256i*)(z + i + 4));
      a = _mm256_blendv_epi8(a, x, _mm256_cmpgt_epi64(x, a));
      b = _mm256_blendv_epi8(b, y, _mm256_cmpgt_epi64(y, b));
    }
    a = _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
    alignas(32) int64_t m4[4];
    _mm256_store_si256((__m256i*)m4, a);
    mx = imax(imax(m4[0], m4[1]), imax(m4[2], m4[3]));
  }
  for (; i < n; ++i) mx = imax(mx, z[i]);
  return mx;
}

// zmax - z < 2^32 (scores are int32), so the exp2 lanes' input is exact.
int64_t attn_exp_sum_avx2(int64_t* z, int64_t n, int64_t zmax) {
  const __m256i m = _mm256_set1_epi64x(zmax);
  __m256i s = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i u = exp2_lanes(_mm256_sub_epi64(m, _mm256_loadu_si256((const __m256i*)(z + i))));
    _mm256_storeu_si256((__m256i*)(z + i), u);
    s = _mm256_add_epi64(s, u);
  }
  alignas(32) int64_t s4[4];
  _mm256_store_si256((__m256i*)s4, s);
  int64_t sum = s4[0] + s4[1] + s4[2] + s4[3];
  for (; i < n; ++i) sum += z[i] = exp2_neg_q30(zmax - z[i]);
  return sum;
}

namespace {

// p = round_shift(u * rr, 46) * va on four lanes: rr = rh 2^32 + rl with rh
// in {0, 1} (rr <= 2^32), u <= 2^30, so u * rr = u * rl (vpmuludq) + (u << 32 if rh)
// <= 2^62; the product is >= 0, so the rounding shift is a logical one;
// then p0 <= 2^16 times va < 2^31 (vpmuludq again) < 2^47.
struct ProbLanes {
  __m256i rl, rh, half;
  explicit ProbLanes(int64_t rr)
      : rl(_mm256_set1_epi64x(rr & 0xffffffffLL)),
        rh(_mm256_set1_epi64x(rr >> 32 ? -1 : 0)),
        half(_mm256_set1_epi64x((int64_t)1 << (61 - kProbFrac))) {}
  __m256i operator()(const int64_t* u, const int32_t* va) const {
    const __m256i uu = _mm256_loadu_si256((const __m256i*)u);
    const __m256i x = _mm256_add_epi64(_mm256_mul_epu32(uu, rl), _mm256_and_si256(_mm256_slli_epi64(uu, 32), rh));
    const __m256i p0 = _mm256_srli_epi64(_mm256_add_epi64(x, half), 62 - kProbFrac);
    return _mm256_mul_epu32(p0, _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)va)));
  }
};

}  // namespace

int64_t attn_prob_max_avx2(const int64_t* u, int64_t n, int64_t rr, const int32_t* va) {
  if (!attn_prob_lanes_ok(rr)) return attn_prob_max_generic(u, n, rr, va);
  const ProbLanes pl(rr);
  __m256i a = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i p = pl(u + i, va + i);
    a = _mm256_blendv_epi8(a, p, _mm256_cmpgt_epi64(p, a));
  }
  alignas(32) int64_t m4[4];
  _mm256_store_si256((__m256i*)m4, a);
  const int64_t mx = imax(imax(m4[0], m4[1]), imax(m4[2], m4[3]));
  return i < n ? imax(mx, attn_prob_max_generic(u + i, n - i, rr, va + i)) : mx;
}

// w16 = min(round_shift(p, e), 32767) (p >= 0, so the lower clamp never
// applies; p < 2^48, so p + 2^(e-1) cannot overflow).
void attn_prob_w16_avx2(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16) {
  if (!attn_prob_lanes_ok(rr) || e > 62) return attn_prob_w16_generic(u, n, rr, va, e, w16);
  const ProbLanes pl(rr);
  const __m256i half = _mm256_set1_epi64x(e ? (int64_t)1 << (e - 1) : 0), top = _mm256_set1_epi64x(kInt16QMax);
  const __m128i sh = _mm_cvtsi32_si128(e);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  auto four = [&](int64_t k) {
    const __m256i y = _mm256_srl_epi64(_mm256_add_epi64(pl(u + k, va + k), half), sh);
    return _mm256_blendv_epi8(y, top, _mm256_cmpgt_epi64(y, top));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i a = four(i), b = four(i + 4);
    const __m256i ab = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(a, pick),
                                                 _mm256_permutevar8x32_epi32(b, pick), 0x20);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(ab, ab), 0x08);
    _mm_storeu_si128((__m128i*)(w16 + i), _mm256_castsi256_si128(p));
  }
  if (i < n) attn_prob_w16_generic(u + i, n - i, rr, va + i, e, w16 + i);
}

void softmax_q16_row_avx2(const int64_t* z, int64_t n, int64_t* p) {
  softmax_q16_row_with(z, n, p, exp2_neg_q30_row_avx2);
}

// add_sat32_row on four int64 lanes (same bits): the clamp by compare-and-blend.
void add_sat32_row_avx2(int64_t* x, const int64_t* d, int64_t n) {
  const __m256i hi = _mm256_set1_epi64x(kInt32Max), lo = _mm256_set1_epi64x(-kInt32Max);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256i v = _mm256_add_epi64(_mm256_loadu_si256((const __m256i*)(x + i)), _mm256_loadu_si256((const __m256i*)(d + i)));
    v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
    v = _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
    _mm256_storeu_si256((__m256i*)(x + i), v);
  }
  for (; i < n; ++i) x[i] = sat32(x[i] + d[i]);
}

// rms_norm_row on four int64 lanes (same bits): rms_norm_row_avx512's steps
// (avx512.cpp, where the bounds are stated) with AVX2's means: |x| and the
// max by compare-and-blend, the arithmetic shifts by the sign-flip identity
// (x >> s) = ~(~x >>> s), the unsigned remainder test rem >= r as a signed
// one (both below 2^62), and the int32 results gathered by a permute.
void rms_norm_row_avx2(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i lim = _mm256_set1_epi64x(((int64_t)1 << 62) - 1);
  __m256i vm = zero, wide = zero;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(x + i));
    const __m256i sg = _mm256_cmpgt_epi64(zero, v);
    const __m256i a = _mm256_sub_epi64(_mm256_xor_si256(v, sg), sg);  // |v|; INT64_MIN stays negative
    wide = _mm256_or_si256(wide, _mm256_or_si256(_mm256_cmpgt_epi64(a, lim), _mm256_cmpgt_epi64(zero, a)));
    vm = _mm256_blendv_epi8(vm, a, _mm256_cmpgt_epi64(a, vm));
  }
  if (!_mm256_testz_si256(wide, wide)) return rms_norm_row(x, g, n, eps_q60, in_frac, y);
  alignas(32) int64_t m4[4];
  _mm256_store_si256((__m256i*)m4, vm);
  int64_t m = imax(imax(m4[0], m4[1]), imax(m4[2], m4[3]));
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
  const __m128i sl = _mm_cvtsi32_si128(a >= 0 ? a : 0), sr = _mm_cvtsi32_si128(a < 0 ? -a : 0);
  const __m256i vh = _mm256_set1_epi64x(a < 0 ? (int64_t)1 << (-a - 1) : 0);
  auto xs4 = [&](int64_t k) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(x + k));
    if (a >= 0) return _mm256_sll_epi64(v, sl);
    const __m256i w = _mm256_add_epi64(v, vh);
    const __m256i sg = _mm256_cmpgt_epi64(zero, w);
    return _mm256_xor_si256(_mm256_srl_epi64(_mm256_xor_si256(w, sg), sr), sg);
  };
  __m256i vs = zero;
  for (i = 0; i + 4 <= n; i += 4) {
    const __m256i v = xs4(i);
    vs = _mm256_add_epi64(vs, _mm256_mul_epi32(v, v));
  }
  alignas(32) int64_t s4[4];
  _mm256_store_si256((__m256i*)s4, vs);
  int64_t s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  for (; i < n; ++i) s += xs(i) * xs(i);
  const int64_t r = rms_norm_divisor(s, eps_q60, in_frac, a);
  if (r < ((int64_t)1 << 23) || r >= ((int64_t)1 << 32)) return rms_norm_row(x, g, n, eps_q60, in_frac, y);
  const int64_t inv = ((int64_t)1 << 62) / r;
  const __m256i vr = _mm256_set1_epi64x(r), vhalf = _mm256_set1_epi64x(r >> 1), one = _mm256_set1_epi64x(1);
  const __m256i i0 = _mm256_set1_epi64x(inv & 0xffffffffLL), i1 = _mm256_set1_epi64x(inv >> 32);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (i = 0; i + 4 <= n; i += 4) {
    const __m256i gg = _mm256_cvtepi16_epi64(_mm_loadl_epi64((const __m128i*)(g + i)));
    const __m256i v = _mm256_add_epi64(_mm256_slli_epi64(_mm256_mul_epi32(xs4(i), gg), kNormOutFrac), vhalf);
    const __m256i neg = _mm256_cmpgt_epi64(zero, v);
    const __m256i u = _mm256_xor_si256(v, neg);  // >= 0, < 2^54
    const __m256i u1 = _mm256_srli_epi64(u, 32);
    const __m256i mid = _mm256_add_epi64(_mm256_add_epi64(_mm256_srli_epi64(_mm256_mul_epu32(u, i0), 32),
                                                          _mm256_mul_epu32(u, i1)),
                                         _mm256_mul_epu32(u1, i0));
    const __m256i hi = _mm256_add_epi64(_mm256_slli_epi64(_mm256_mul_epu32(u1, i1), 32), mid);
    __m256i q = _mm256_srli_epi64(hi, 30);
    __m256i rem = _mm256_sub_epi64(u, _mm256_mul_epu32(q, vr));
    for (int c = 0; c < 2; ++c) {
      const __m256i ge = _mm256_xor_si256(_mm256_cmpgt_epi64(vr, rem), _mm256_set1_epi64x(-1));  // rem >= r
      q = _mm256_add_epi64(q, _mm256_and_si256(ge, one));
      rem = _mm256_sub_epi64(rem, _mm256_and_si256(ge, vr));
    }
    const __m256i out = _mm256_permutevar8x32_epi32(_mm256_xor_si256(q, neg), pick);  // low int32 of each lane
    _mm_storeu_si128((__m128i*)(y + i), _mm256_castsi256_si128(out));
  }
  for (; i < n; ++i) y[i] = rms_norm_out(xs(i), g[i], r);
}

// quant16_row on four int64 lanes (same bits). |x| <= m < 2^(e+15), so
// every rounded value fits in 17 bits; an arithmetic right shift is built
// from the logical one by the sign-flip identity (x >> e) = ~(~x >>> e).
int quant16_row_avx2(const int64_t* x, int64_t n, int16_t* q) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i vm = zero;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(x + i));
    const __m256i sg = _mm256_cmpgt_epi64(zero, v);
    const __m256i a = _mm256_sub_epi64(_mm256_xor_si256(v, sg), sg);  // |v| (inputs exceed -2^63)
    vm = _mm256_blendv_epi8(vm, a, _mm256_cmpgt_epi64(a, vm));
  }
  alignas(32) int64_t m4[4];
  _mm256_store_si256((__m256i*)m4, vm);
  int64_t m = imax(imax(m4[0], m4[1]), imax(m4[2], m4[3]));
  for (int64_t j = i; j < n; ++j) m = imax(m, iabs(x[j]));
  const int e = (int)imax(bitlen(m) - 15, 0);
  const __m256i half = _mm256_set1_epi64x(e ? (int64_t)1 << (e - 1) : 0);
  const __m128i sh = _mm_cvtsi32_si128(e);
  const __m256i lo = _mm256_set1_epi32(-(int32_t)kInt16QMax), pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  auto four = [&](int64_t k) {  // 4 rounded values in the low 128 bits as int32
    const __m256i y = _mm256_add_epi64(_mm256_loadu_si256((const __m256i*)(x + k)), half);
    const __m256i sg = _mm256_cmpgt_epi64(zero, y);
    const __m256i r = _mm256_xor_si256(_mm256_srl_epi64(_mm256_xor_si256(y, sg), sh), sg);
    return _mm256_permutevar8x32_epi32(r, pick);
  };
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256i a = _mm256_max_epi32(_mm256_permute2x128_si256(four(i), four(i + 4), 0x20), lo);
    // packs saturates +32768 to 32767; the max above lifts -32768 to -32767
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, a), 0x08);
    _mm_storeu_si128((__m128i*)(q + i), _mm256_castsi256_si128(p));
  }
  for (; i < n; ++i) q[i] = (int16_t)clamp(round_shift(x[i], e), -kInt16QMax, kInt16QMax);
  return e;
}

namespace {

// floor(x / 2^30) for int64 lanes: ~(~x >>> 30) where x < 0 (AVX2 has no
// 64-bit arithmetic shift).
inline __m256i floor_shift30(__m256i x) {
  const __m256i neg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), x);
  return _mm256_xor_si256(_mm256_srli_epi64(_mm256_xor_si256(x, neg), 30), neg);
}

// q = floor(2^60 / den), r = 2^60 - q den for den in [2^30, 2^31], exact:
// the avx512 set's recip60 (avx512.cpp, where the method is described) on 4
// lanes; compare masks are -1 where true, so q -= mask adds one.
inline bool recip60(__m256i den, __m256i* q_out, __m256i* r_out) {
  __m256i x = _mm256_sub_epi64(_mm256_set1_epi64x(3031741620),
                               _mm256_srli_epi64(_mm256_mul_epu32(den, _mm256_set1_epi64x(1010580540)), 30));
  for (int k = 0; k < 3; ++k) {
    const __m256i dx = _mm256_srli_epi64(_mm256_mul_epu32(den, x), 31);
    x = _mm256_srli_epi64(_mm256_mul_epu32(x, _mm256_sub_epi64(_mm256_set1_epi64x((int64_t)1 << 31), dx)), 30);
  }
  __m256i q = _mm256_srli_epi64(x, 1);
  __m256i r = _mm256_sub_epi64(_mm256_set1_epi64x((int64_t)1 << 60), _mm256_mul_epu32(q, den));
  const __m256i zero = _mm256_setzero_si256(), denm1 = _mm256_sub_epi64(den, _mm256_set1_epi64x(1));
  for (int k = 0; k < 2; ++k) {  // the estimate is within 1 of q (avx512.cpp)
    const __m256i lo = _mm256_cmpgt_epi64(zero, r);   // r < 0
    const __m256i hi = _mm256_cmpgt_epi64(r, denm1);  // r >= den
    q = _mm256_sub_epi64(_mm256_add_epi64(q, lo), hi);
    r = _mm256_add_epi64(r, _mm256_sub_epi64(_mm256_and_si256(lo, den), _mm256_and_si256(hi, den)));
  }
  *q_out = q;
  *r_out = r;
  const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi64(zero, r), _mm256_cmpgt_epi64(r, denm1));
  return _mm256_testz_si256(bad, bad);
}

// glu_gate for 4 elements (the avx512 set's glu_gate8, avx512.cpp).
inline bool glu_gate4(const int64_t* g, const int64_t* u, const int64_t* d, int64_t* a) {
  const __m256i gg = _mm256_loadu_si256((const __m256i*)g), dd = _mm256_loadu_si256((const __m256i*)d);
  const __m256i den = _mm256_add_epi64(_mm256_set1_epi64x((int64_t)1 << 30), dd);
  __m256i q, r;
  if (!recip60(den, &q, &r)) return false;
  const __m256i h = _mm256_srli_epi64(den, 1), denm1 = _mm256_sub_epi64(den, _mm256_set1_epi64x(1));
  const __m256i pos = _mm256_sub_epi64(q, _mm256_cmpgt_epi64(_mm256_add_epi64(r, h), denm1));  // + [r + h >= den]
  const __m256i neg = _mm256_add_epi64(_mm256_sub_epi64(_mm256_set1_epi64x((int64_t)1 << 30), q),
                                       _mm256_cmpgt_epi64(r, h));  // - [r > h]
  const __m256i sig = _mm256_blendv_epi8(pos, neg, _mm256_cmpgt_epi64(_mm256_setzero_si256(), gg));
  const __m256i gs =
      floor_shift30(_mm256_add_epi64(_mm256_mul_epi32(gg, sig), _mm256_set1_epi64x((int64_t)1 << 29)));
  _mm256_storeu_si256((__m256i*)a, _mm256_mul_epi32(gs, _mm256_loadu_si256((const __m256i*)u)));
  return true;
}

// Whether every |x[i]| and |y[i]| <= 2^31 - 1 (glu_gate4's operand bound).
inline bool fits_int32(const int64_t* x, const int64_t* y, int64_t n) {
  const __m256i top = _mm256_set1_epi64x(kInt32Max), bot = _mm256_set1_epi64x(-kInt32Max);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (const int64_t* p : {x + i, y + i}) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)p);
      bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpgt_epi64(v, top), _mm256_cmpgt_epi64(bot, v)));
    }
  if (!_mm256_testz_si256(bad, bad)) return false;
  for (; i < n; ++i)
    if (x[i] > kInt32Max || x[i] < -kInt32Max || y[i] > kInt32Max || y[i] < -kInt32Max) return false;
  return true;
}

void glu_rows(const int64_t* g, const int64_t* u, const int64_t* d, int64_t n, int64_t* a) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    if (!glu_gate4(g + i, u + i, d + i, a + i))
      for (int64_t k = i; k < i + 4; ++k) a[k] = glu_gate(g[k], u[k], d[k]);
  for (; i < n; ++i) a[i] = glu_gate(g[i], u[i], d[i]);
}

}  // namespace

// swiglu_row on four int64 lanes (same bits): the exp2 argument, the exp2
// and the sigmoid's division (recip60) in vectors; rows with g or u outside
// the int32 range (no linear layer makes them) take the scalar row.
void swiglu_row_avx2(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  if (!fits_int32(g, u, n)) return swiglu_row_with(g, u, n, a, exp2_neg_q30_row_avx2);
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  const __m256i l2e = _mm256_set1_epi64x(kLog2eQ30), half = _mm256_set1_epi64x((int64_t)1 << 29);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {  // round_shift(|g| log2(e), 30), |g| < 2^31: unsigned 32 x 32 -> 64
    const __m256i x = _mm256_loadu_si256((const __m256i*)(g + i));
    const __m256i sg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), x);
    const __m256i ag = _mm256_sub_epi64(_mm256_xor_si256(x, sg), sg);
    _mm256_storeu_si256((__m256i*)(d.data() + i),
                        _mm256_srli_epi64(_mm256_add_epi64(_mm256_mul_epu32(ag, l2e), half), 30));
  }
  for (; i < n; ++i) d[i] = round_shift(iabs(g[i]) * kLog2eQ30, 30);
  exp2_neg_q30_row_avx2(d.data(), n, d.data());  // exp(-|g|), Q30
  glu_rows(g, u, d.data(), n, a);
}

// geglu_row with its exp(-|y|) and sigmoid on the same lanes (same bits).
void geglu_row_avx2(const int64_t* g, const int64_t* u, int64_t n, int64_t* a) {
  if (!fits_int32(g, u, n)) return geglu_row_with(g, u, n, a, exp2_neg_q30_row_avx2);
  thread_local std::vector<int64_t> d;
  d.resize((size_t)n);
  for (int64_t i = 0; i < n; ++i) d[i] = gelu_exp2_arg(g[i]);  // |y| log2(e), Q16
  exp2_neg_q30_row_avx2(d.data(), n, d.data());                 // exp(-|y|), Q30
  glu_rows(g, u, d.data(), n, a);
}

namespace {

inline __m256i clamp_sat32_4(__m256i v) {
  const __m256i hi = _mm256_set1_epi64x(kInt32Max), lo = _mm256_set1_epi64x(-kInt32Max);
  v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
  return _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
}

}  // namespace

// rope_row on four int64 lanes (same bits): rope_row_avx512's steps
// (avx512.cpp, where the bounds are stated). AVX2 has no 64-bit arithmetic
// shift: |v| < 2^47, so (v + 2^13 + 2^62) >> 14 (logical) - 2^48 is
// round_shift(v, 14) exactly.
void rope_row_avx2(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin) {
  const int64_t h = D / 2;
  const __m256i bias = _mm256_set1_epi64x(((int64_t)1 << (kRopeFrac - 1)) + ((int64_t)1 << 62));
  const __m256i unbias = _mm256_set1_epi64x((int64_t)1 << (62 - kRopeFrac));
  const auto wide = [](const int16_t* p) {  // 4 int16 -> 4 int64 lanes
    int64_t v;
    std::memcpy(&v, p, 8);
    return _mm256_cvtepi16_epi64(_mm_cvtsi64_si128(v));
  };
  const auto rs = [&](__m256i v) {
    return clamp_sat32_4(_mm256_sub_epi64(_mm256_srli_epi64(_mm256_add_epi64(v, bias), kRopeFrac), unbias));
  };
  for (int64_t hd = 0; hd < nh; ++hd) {
    int64_t* v = x + hd * D;
    if (!fits_int32(v, v + h, h)) {
      rope_row(v, 1, D, cos, sin);
      continue;
    }
    int64_t i = 0;
    for (; i + 4 <= h; i += 4) {
      const __m256i x1 = _mm256_loadu_si256((const __m256i*)(v + i)), x2 = _mm256_loadu_si256((const __m256i*)(v + h + i));
      const __m256i c = wide(cos + i), s = wide(sin + i);
      const __m256i a = _mm256_sub_epi64(_mm256_mul_epi32(x1, c), _mm256_mul_epi32(x2, s));
      const __m256i b = _mm256_add_epi64(_mm256_mul_epi32(x2, c), _mm256_mul_epi32(x1, s));
      _mm256_storeu_si256((__m256i*)(v + i), rs(a));
      _mm256_storeu_si256((__m256i*)(v + h + i), rs(b));
    }
    for (; i < h; ++i) rope_pair(v, h, i, cos, sin);  // the tail
  }
}

// quant8_row on four int64 lanes (same bits): quant8_row_avx512's eight
// compare-and-subtract steps (avx512.cpp, where the bounds are stated), the
// masks as compare results (r >= t is !(t > r)). Domain |x| <= 2^31 - 1.
int32_t quant8_row_avx2(const int64_t* x, int64_t n, int8_t* q) {
  int64_t a = 0;
  for (int64_t i = 0; i < n; ++i) a = imax(a, iabs(x[i]));
  const int64_t d = imax(a, 1);
  const __m256i c127 = _mm256_set1_epi64x(127), bias = _mm256_set1_epi64x((d >> 1) + 128 * d);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256i r = _mm256_add_epi64(_mm256_mul_epi32(_mm256_loadu_si256((const __m256i*)(x + i)), c127), bias);
    __m256i qv = _mm256_setzero_si256();
    for (int k = 7; k >= 0; --k) {
      const __m256i t = _mm256_set1_epi64x(d << k);
      const __m256i lt = _mm256_cmpgt_epi64(t, r);  // all ones where r < t
      r = _mm256_sub_epi64(r, _mm256_andnot_si256(lt, t));
      qv = _mm256_add_epi64(qv, _mm256_andnot_si256(lt, _mm256_set1_epi64x((int64_t)1 << k)));
    }
    alignas(32) int64_t o[4];
    _mm256_store_si256((__m256i*)o, _mm256_sub_epi64(qv, _mm256_set1_epi64x(128)));
    for (int j = 0; j < 4; ++j) q[i + j] = (int8_t)clamp(o[j], -kInt8QMax, kInt8QMax);
  }
  for (; i < n; ++i) q[i] = quant8_value(x[i], d);
  return (int32_t)a;
}

namespace {

// attn_score on four lanes: shift_round_sat32(raw * mkm, s) with mkm =
// mk * score_mant < 2^31 (vpmuldq: exact signed 32 x 32 -> 64) and every
// s in [1, 62] (the caller checks; then round_shift is (x + 2^(s-1)) >> s,
// the arithmetic shift built from the logical one by the sign-flip identity).
inline __m256i score4(__m128i raw, __m256i mkm, __m256i s) {
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi64x(1);
  const __m256i lim = _mm256_set1_epi64x(kInt32Max), nlim = _mm256_set1_epi64x(-kInt32Max);
  const __m256i x = _mm256_mul_epi32(_mm256_cvtepi32_epi64(raw), mkm);
  const __m256i y = _mm256_add_epi64(x, _mm256_sllv_epi64(one, _mm256_sub_epi64(s, one)));
  const __m256i sg = _mm256_cmpgt_epi64(zero, y);
  __m256i r = _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(y, sg), s), sg);
  r = _mm256_blendv_epi8(r, lim, _mm256_cmpgt_epi64(r, lim));
  return _mm256_blendv_epi8(r, nlim, _mm256_cmpgt_epi64(nlim, r));
}

}  // namespace

namespace {

// a[0..7] (eight rows of eight int32) transposed in place.
inline void transpose8x8_epi32(__m256i* a) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(a[i], a[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(a[i], a[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    a[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// normalize_scale15 on eight lanes a in [0, 2^31): k = max(bitlen(a) - 15, 0)
// as bitlen(a >> 15) by halving (8, 4, 2, 1 bits), m = round_shift(a, k)
// (a + 2^(k-1) < 2^32: the logical shift is exact).
inline void normalize_scale15_x8(__m256i a, __m256i* m, __m256i* k) {
  __m256i t = _mm256_srli_epi32(a, 15), n = _mm256_setzero_si256();
  for (int b : {8, 4, 2, 1}) {
    const __m256i sh = _mm256_and_si256(_mm256_cmpgt_epi32(t, _mm256_set1_epi32((1 << b) - 1)), _mm256_set1_epi32(b));
    n = _mm256_add_epi32(n, sh);
    t = _mm256_srlv_epi32(t, sh);
  }
  n = _mm256_add_epi32(n, t);  // t is 0 or 1
  const __m256i half = _mm256_srli_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(1), n), 1);
  *m = _mm256_srlv_epi32(_mm256_add_epi32(a, half), n);
  *k = n;
}

inline bool all_nonnegative(const int32_t* a, int64_t n, int64_t stride) {
  int32_t o = 0;
  for (int64_t j = 0; j < n; ++j) o |= a[j * stride];
  return o >= 0;
}

inline int32_t hmin_epi32(__m256i v) {
  __m128i x = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_min_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_min_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

inline int32_t hmax_epi32(__m256i v) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_max_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

// The scale split of up to KB keys (attn_score's normalize_scale15 of each
// key's scale, done once per key for every row) and the score epilogue of
// one row's raw dot products: attn_score's arithmetic, four keys per
// vector where every shift is in [1, 62] and mk * score_mant < 2^31.
template <int KB>
struct KeyScales {
  alignas(32) int64_t mk[KB], mkm[KB], ek[KB];
  int64_t ekmin = 0, ekmax = 0;
  bool vec;
  KeyScales(const int32_t* ka, int64_t nk, int64_t sstride, int64_t score_mant) {
    vec = score_mant >= 0 && score_mant <= (1 << 15);  // then mk * score_mant < 2^31 (mk <= 2^15)
    if (!vec || !all_nonnegative(ka, nk, sstride)) {
      for (int64_t j = 0; j < nk; ++j) {
        normalize_scale15(ka[j * sstride], &mk[j], &ek[j]);
        mkm[j] = mk[j] * score_mant;
        ekmin = j ? imin(ekmin, ek[j]) : ek[j];
        ekmax = j ? imax(ekmax, ek[j]) : ek[j];
      }
      return;
    }
    __m256i lo = _mm256_set1_epi32(INT32_MAX), hi = _mm256_set1_epi32(INT32_MIN);
    const __m256i mant = _mm256_set1_epi32((int32_t)score_mant);
    for (int64_t j0 = 0; j0 < nk; j0 += 8) {
      alignas(32) int32_t a[8];  // lanes past nk repeat key j0 (min/max unchanged)
      for (int64_t j = 0; j < 8; ++j) a[j] = ka[(j0 + j < nk ? j0 + j : j0) * sstride];
      __m256i m, k;
      normalize_scale15_x8(_mm256_load_si256((const __m256i*)a), &m, &k);
      lo = _mm256_min_epi32(lo, k);
      hi = _mm256_max_epi32(hi, k);
      const __m256i mm = _mm256_mullo_epi32(m, mant);  // <= 2^30
      for (int h = 0; h < 2; ++h) {  // int64 lanes for score4
        const __m128i mh = h ? _mm256_extracti128_si256(m, 1) : _mm256_castsi256_si128(m);
        const __m128i mmh = h ? _mm256_extracti128_si256(mm, 1) : _mm256_castsi256_si128(mm);
        const __m128i kh = h ? _mm256_extracti128_si256(k, 1) : _mm256_castsi256_si128(k);
        _mm256_store_si256((__m256i*)(mk + j0 + 4 * h), _mm256_cvtepi32_epi64(mh));
        _mm256_store_si256((__m256i*)(mkm + j0 + 4 * h), _mm256_cvtepi32_epi64(mmh));
        _mm256_store_si256((__m256i*)(ek + j0 + 4 * h), _mm256_cvtepi32_epi64(kh));
      }
    }
    ekmin = hmin_epi32(lo);
    ekmax = hmax_epi32(hi);
  }
  // zr[j] = attn_score(raw[j], ...) for j < nk (nk >= 1), with s0 = score_shift - e_q.
  void score(const int32_t* raw, int64_t nk, int64_t s0, int64_t score_mant, int64_t* zr) const {
    int64_t j = 0;
    if (vec && s0 - ekmax >= 1 && s0 - ekmin <= 62) {
      const __m256i sv = _mm256_set1_epi64x(s0);
      for (; j + 4 <= nk; j += 4)
        _mm256_storeu_si256((__m256i*)(zr + j),
                            score4(_mm_loadu_si128((const __m128i*)(raw + j)), _mm256_load_si256((const __m256i*)(mkm + j)),
                                   _mm256_sub_epi64(sv, _mm256_load_si256((const __m256i*)(ek + j)))));
    }
    for (; j < nk; ++j) zr[j] = shift_round_sat32((int64_t)raw[j] * mk[j] * score_mant, s0 - ek[j]);
  }
};

// One block of up to 8 * NV keys (qk_tile_avx2): the keys widened to int16
// and transposed into kt [D/2 pairs][8 * NV keys] of int32 pairs (k[2p],
// k[2p+1]), keys past nk zero; then each row's scores are NV vectors of
// eight keys, one vpmaddwd per pair and vector with the row's broadcast
// query pair (keys are the lanes: no horizontal sums).
template <int NV>
void qk_block(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t nk,
              int64_t stride, int64_t sstride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z,
              int64_t ldz, int32_t* kt) {
  constexpr int KB = 8 * NV;
  const int64_t np = D / 2;
  for (int64_t t0 = 0; t0 < KB; t0 += 8) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {  // 8 keys x 8 pairs per transpose
      __m256i a[8];
      for (int j = 0; j < 8; ++j)
        a[j] = t0 + j < nk ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(kc + (t0 + j) * stride + d0)))
                           : _mm256_setzero_si256();
      // row j held key j's pairs 0..7 in its lanes: now row i holds pair i of keys 0..7
      transpose8x8_epi32(a);
      for (int i = 0; i < 8; ++i) _mm256_store_si256((__m256i*)(kt + (d0 / 2 + i) * KB + t0), a[i]);
    }
  }
  KeyScales<KB> sc(ka, nk, sstride, score_mant);
  for (int64_t r = 0; r < R; ++r) {
    const int16_t* qr = q + r * D;
    __m256i acc[NV];
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_si256();
    for (int64_t p = 0; p < np; ++p) {
      int32_t pair;  // q[2p] low, q[2p + 1] high (little endian), as kt's pairs
      std::memcpy(&pair, qr + 2 * p, 4);
      const __m256i b = _mm256_set1_epi32(pair);
      const int32_t* kp = kt + p * KB;
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm256_add_epi32(acc[v], _mm256_madd_epi16(b, _mm256_load_si256((const __m256i*)(kp + 8 * v))));
    }
    alignas(32) int32_t raw[KB];
    for (int v = 0; v < NV; ++v) _mm256_store_si256((__m256i*)(raw + 8 * v), acc[v]);
    sc.score(raw, nk, score_shift - e_q[r], score_mant, z + r * ldz);
  }
}

constexpr int64_t kPrefetchKeys = 16;

// Up to 8 keys' dot products with each of R rows (R <= 4: a decode row's
// query heads), for few rows: each key is widened once and multiplied with
// every row's query in place (4 vpmaddwd per 64 dims), and each row's eight
// per-key vectors are summed horizontally (vphaddd tree), so no block of
// keys is transposed (qk_block's cost per key, shared by only R rows).
// raw [R][8]; keys past nk are not read and their sums are not used.
template <int R, int NC>
inline void qk_few_rows(const int16_t* q, const int8_t* kc, int64_t nk, int64_t stride, int32_t* raw) {
  constexpr int64_t D = 16 * NC;
  __m256i h[R][4];  // h[r][j/2]: keys j, j+1 of row r, pairwise summed (vphaddd)
  for (int64_t j = 0; j < 8; j += 2) {
    __m256i a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_si256();
    const int8_t* k0 = kc + (j < nk ? j : 0) * stride;  // keys past nk: any key, sums unused
    const int8_t* k1 = kc + (j + 1 < nk ? j + 1 : 0) * stride;
    // A decode step reads every row's cache once, from DRAM: ask for the
    // keys kPrefetchKeys ahead (a prefetch past the end is harmless).
    for (int64_t d = 0; d < D; d += 64) {
      _mm_prefetch((const char*)(kc + (j + kPrefetchKeys) * stride + d), _MM_HINT_T0);
      _mm_prefetch((const char*)(kc + (j + 1 + kPrefetchKeys) * stride + d), _MM_HINT_T0);
    }
    for (int64_t d = 0; d < D; d += 16) {  // unrolled: NC is a constant
      const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k0 + d)));
      const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k1 + d)));
      for (int r = 0; r < R; ++r) {
        const __m256i qv = _mm256_loadu_si256((const __m256i*)(q + r * D + d));
        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(qv, x));
        b[r] = _mm256_add_epi32(b[r], _mm256_madd_epi16(qv, y));
      }
    }
    for (int r = 0; r < R; ++r) h[r][j / 2] = _mm256_hadd_epi32(a[r], b[r]);
  }
  for (int r = 0; r < R; ++r) {
    // lanes of lo: keys 0-3's halves (low 128: dims 0-3 of each 8, high: 4-7); hi: keys 4-7's
    const __m256i lo = _mm256_hadd_epi32(h[r][0], h[r][1]), hi = _mm256_hadd_epi32(h[r][2], h[r][3]);
    const __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
    _mm256_storeu_si256((__m256i*)(raw + 8 * r), s);
  }
}

template <int R, int NC>
void qk_tile_few_rows(const int16_t* q, const int32_t* e_q, const int8_t* kc, const int32_t* ka, int64_t n,
                      int64_t stride, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  const int64_t sstride = stride / (16 * NC);
  for (int64_t t = 0; t < n; t += 8) {
    const int64_t nk = n - t < 8 ? n - t : 8;
    alignas(32) int32_t raw[R * 8];
    qk_few_rows<R, NC>(q, kc + t * stride, nk, stride, raw);
    KeyScales<8> sc(ka + t * sstride, nk, sstride, score_mant);
    for (int r = 0; r < R; ++r) sc.score(raw + 8 * r, nk, score_shift - e_q[r], score_mant, z + r * ldz + t);
  }
}

}  // namespace

// Attention tiles (QkTileFn, kernels.h; same bits as qk_tile_generic).
// Blocks of 64 keys (32 at D > 128, so the block stays 16 KB in L1) are
// widened and transposed once, then every row's scores come eight keys per
// vector (qk_block). |q . k| < 2^31 (D <= 256), so int32 wrap-around in
// partial sums cannot change the value. The key's scale split (attn_score)
// is done once per key. The scalar epilogue (shift_round_sat32 of
// raw * mk * score_mant) is attn_score's own arithmetic.
void qk_tile_avx2(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                  int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  if (D % 16) {
    qk_tile_generic(q, e_q, R, kc, ka, n, stride, D, score_mant, score_shift, z, ldz);
    return;
  }
  // Few rows (a decode row's query heads) at the usual head sizes: no transpose.
  if (R >= 1 && R <= 4 && (D == 64 || D == 128 || D == 256)) {
    using Fn = void (*)(const int16_t*, const int32_t*, const int8_t*, const int32_t*, int64_t, int64_t, int64_t,
                        int64_t, int64_t*, int64_t);
    static constexpr Fn kFew[3][4] = {
        {qk_tile_few_rows<1, 4>, qk_tile_few_rows<2, 4>, qk_tile_few_rows<3, 4>, qk_tile_few_rows<4, 4>},
        {qk_tile_few_rows<1, 8>, qk_tile_few_rows<2, 8>, qk_tile_few_rows<3, 8>, qk_tile_few_rows<4, 8>},
        {qk_tile_few_rows<1, 16>, qk_tile_few_rows<2, 16>, qk_tile_few_rows<3, 16>, qk_tile_few_rows<4, 16>}};
    return kFew[D == 64 ? 0 : D == 128 ? 1 : 2][R - 1](q, e_q, kc, ka, n, stride, score_mant, score_shift, z, ldz);
  }
  const int64_t sstride = stride / D;
  alignas(32) int32_t kt[128 * 64];  // [D/2 <= 128 pairs][block keys], 16 KB used at most
  const int64_t kb = D > 128 ? 32 : 64;
  for (int64_t t = 0; t < n; t += kb) {
    const int64_t nk = n - t < kb ? n - t : kb;
    if (kb == 64)
      qk_block<8>(q, e_q, R, kc + t * stride, ka + t * sstride, nk, stride, sstride, D, score_mant, score_shift, z + t,
                  ldz, kt);
    else
      qk_block<4>(q, e_q, R, kc + t * stride, ka + t * sstride, nk, stride, sstride, D, score_mant, score_shift, z + t,
                  ldz, kt);
  }
}

namespace {

// Adds a 16-dim chunk's int32 P.V sums to out [16] int64: lo holds dims
// 0-3 | 8-11, hi 4-7 | 12-15 (the unpacklo / unpackhi pairing of two positions).
inline void add_chunk_i64(__m256i lo, __m256i hi, int64_t* out) {
  __m256i* ov = (__m256i*)out;
  _mm256_storeu_si256(ov, _mm256_add_epi64(_mm256_loadu_si256(ov), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(lo))));
  _mm256_storeu_si256(ov + 1, _mm256_add_epi64(_mm256_loadu_si256(ov + 1), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(hi))));
  _mm256_storeu_si256(ov + 2, _mm256_add_epi64(_mm256_loadu_si256(ov + 2), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(lo, 1))));
  _mm256_storeu_si256(ov + 3, _mm256_add_epi64(_mm256_loadu_si256(ov + 3), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(hi, 1))));
}

// One pass of pv_tile_avx2 over 16 * NC dims per block (NC a compile-time
// constant, so the 2 * NC accumulators are named registers, not an array
// on the stack).
template <int NC>
void pv_tile_pass(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out) {
  constexpr int64_t kPairs = 64;
  alignas(32) int16_t vb[kPairs * NC * 32];  // [pair][chunk][lo 16 | hi 16]
  for (int64_t t0 = 0; t0 < n; t0 += 2 * kPairs) {
    const int64_t nk = n - t0 < 2 * kPairs ? n - t0 : 2 * kPairs, np = (nk + 1) / 2, full = nk / 2;
    for (int64_t d0 = 0; d0 < D; d0 += 16 * NC) {
      for (int64_t p = 0; p < np; ++p) {
        const int8_t* v0 = vc + (t0 + 2 * p) * stride + d0;
        const bool two = 2 * p + 1 < nk;
        for (int c = 0; c < NC; ++c) {
          const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v0 + 16 * c)));
          const __m256i b = two ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v0 + stride + 16 * c)))
                                : _mm256_setzero_si256();
          int16_t* dst = vb + (p * NC + c) * 32;
          _mm256_store_si256((__m256i*)dst, _mm256_unpacklo_epi16(a, b));
          _mm256_store_si256((__m256i*)(dst + 16), _mm256_unpackhi_epi16(a, b));
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const int16_t* w = w16 + r * ldw + t0;
        // chunk c: lo d = 16c + {0-3, 8-11}, hi 16c + {4-7, 12-15}
        __m256i l0 = _mm256_setzero_si256(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
        auto step = [&](int64_t p, __m256i wp) {
          const int16_t* src = vb + p * NC * 32;
          l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)src), wp));
          h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 16)), wp));
          if constexpr (NC == 4) {
            l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 32)), wp));
            h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 48)), wp));
            l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 64)), wp));
            h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 80)), wp));
            l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 96)), wp));
            h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 112)), wp));
          }
        };
        for (int64_t p = 0; p < full; ++p) {
          int32_t pair;  // w[2p] in the low 16 bits, w[2p + 1] in the high (little endian)
          std::memcpy(&pair, w + 2 * p, 4);
          step(p, _mm256_set1_epi32(pair));
        }
        if (full < np) step(full, _mm256_set1_epi32((int32_t)(uint16_t)w[2 * full]));
        const __m256i acc[8] = {l0, h0, l1, h1, l2, h2, l3, h3};
        for (int c = 0; c < NC; ++c) add_chunk_i64(acc[2 * c], acc[2 * c + 1], out + r * D + d0 + 16 * c);
      }
    }
  }
}

// P . V for few rows (R <= 4, a decode row's query heads), 16 dims at a
// time: each pair of positions' values is widened and interleaved once in
// registers and multiplied with every row's weight pair, so nothing goes
// through a block buffer (pv_tile_pass's cost per position, shared by only
// R rows). Same int32 bound per block of 128 positions as pv_tile_pass.
template <int R>
void pv_few_rows(const int16_t* w16, int64_t ldw, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                 int64_t* out) {
  constexpr int64_t kBlock = 128;
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    const int64_t nk = n - t0 < kBlock ? n - t0 : kBlock, full = nk / 2;
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m256i lo[R], hi[R];  // lo: d0 + {0-3, 8-11}, hi: d0 + {4-7, 12-15}
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
      auto step = [&](__m256i a, __m256i b, int64_t t, bool two) {
        const __m256i x = _mm256_unpacklo_epi16(a, b), y = _mm256_unpackhi_epi16(a, b);
        for (int r = 0; r < R; ++r) {
          const int16_t* w = w16 + r * ldw + t0 + t;
          int32_t pair;  // w[t] low, w[t + 1] high (little endian)
          if (two)
            std::memcpy(&pair, w, 4);
          else
            pair = (int32_t)(uint16_t)w[0];
          const __m256i wp = _mm256_set1_epi32(pair);
          lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(x, wp));
          hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(y, wp));
        }
      };
      const int8_t* v = vc + t0 * stride + d0;
      const bool new_line = d0 % 64 == 0;  // later chunks of a line find it in L1
      for (int64_t p = 0; p < full; ++p, v += 2 * stride) {
        if (new_line) {
          _mm_prefetch((const char*)(v + kPrefetchKeys * stride), _MM_HINT_T0);
          _mm_prefetch((const char*)(v + (kPrefetchKeys + 1) * stride), _MM_HINT_T0);
        }
        step(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)v)),
             _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v + stride))), 2 * p, true);
      }
      if (nk % 2)
        step(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)v)), _mm256_setzero_si256(), 2 * full, false);
      for (int r = 0; r < R; ++r) add_chunk_i64(lo[r], hi[r], out + r * D + d0);
    }
  }
}

}  // namespace

// P . V tiles (PvTileFn; same bits as pv_tile_generic): a block of 128
// positions' values over 64 (else 16) dims is widened and interleaved in
// pairs once into L1, then every row adds it with its int16 weights paired
// in each 32-bit lane (vpmaddwd). int32 lanes gain at most 128 products
// |w16 * v| <= 32767 * 127 per block (< 2^31), then go to int64. Up to 4
// rows (decode) skip the buffer (pv_few_rows).
void pv_tile_avx2(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out) {
  if (D % 16)
    pv_tile_generic(w16, ldw, R, vc, n, stride, D, out);
  else if (R >= 1 && R <= 4) {
    using Fn = void (*)(const int16_t*, int64_t, const int8_t*, int64_t, int64_t, int64_t, int64_t*);
    static constexpr Fn kFew[4] = {pv_few_rows<1>, pv_few_rows<2>, pv_few_rows<3>, pv_few_rows<4>};
    kFew[R - 1](w16, ldw, vc, n, stride, D, out);
  } else if (D % 64 == 0)
    pv_tile_pass<4>(w16, ldw, R, vc, n, stride, D, out);
  else
    pv_tile_pass<1>(w16, ldw, R, vc, n, stride, D, out);
}

namespace {

// Baseline code (kernels.h): it decides whether the rest of this file may run.
INTDET_BASELINE_CODE bool cpu_has_avx2() {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");  // also checks the OS saves the YMM registers
#else
  return false;
#endif
}

}  // namespace

// Constant-initialized (no code runs at load on a CPU without AVX2).
extern const Kernels kAvx2Kernels;
constinit const Kernels kAvx2Kernels{
    .name = "avx2",
    .cpu_runs = cpu_has_avx2,
    .packing = &kPackG8,
    .linear = nullptr,
    .linear_packed = linear_avx2_packed,
    .linear_w4 = nullptr,
    .linear_w4_packed = linear_w4_avx2_packed,
    .qk_tile = qk_tile_avx2,
    .pv_tile = pv_tile_avx2,
    .attn_row = {attn_row_max_avx2, attn_exp_sum_avx2, attn_prob_max_avx2, attn_prob_w16_avx2},
    .softmax = softmax_q16_row_avx2,
    .exp2_row = exp2_neg_q30_row_avx2,
    .quant16 = quant16_row_avx2,
    .rms_norm = rms_norm_row_avx2,
    .add_sat32 = add_sat32_row_avx2,
    .rope = rope_row_avx2,
    .quant8 = quant8_row_avx2,
    .swiglu = swiglu_row_avx2,
    .geglu = geglu_row_avx2,
    .planes = {},
};

}  // namespace intdet
