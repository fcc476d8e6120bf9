// AVX2 row kernels (compiled with -mavx2 only) and the AVX2 kernel set's
// entry; the attention tiles are in avx2_attn.cpp, the linear layers in
// avx2_gemm.cpp and avx2_w4.cpp. Same bits as the scalar set.
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
    .quant8_row = quant8_row_avx2,
    .swiglu = swiglu_row_avx2,
    .geglu = geglu_row_avx2,
    .planes = {},
};

}  // namespace intdet
