// Shared pieces of the AVX2 linear kernels (avx2_gemm.cpp, avx2_w4.cpp):
// splitting tokens into register tiles, and the per-channel epilogue.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "intdet/ops.h"

namespace intdet {

// Calls f(std::integral_constant<int, R>{}, t) for tiles of R = MR tokens
// over [t0, t1), then one tail tile of R < MR tokens if any remain; R is a
// compile-time constant so each tile size gets its own unrolled code.
template <int MR, class F>
inline void token_tiles(int64_t t0, int64_t t1, F&& f) {
  static_assert(MR >= 1 && MR <= 12, "tail dispatch covers tiles of up to 12 tokens");
  int64_t t = t0;
  for (; t + MR <= t1; t += MR) f(std::integral_constant<int, MR>{}, t);
  switch (t1 - t) {
#define INTDET_TAIL(R) \
  case R:              \
    if constexpr (R < MR) f(std::integral_constant<int, R>{}, t); \
    break;
    INTDET_TAIL(1) INTDET_TAIL(2) INTDET_TAIL(3) INTDET_TAIL(4) INTDET_TAIL(5)
    INTDET_TAIL(6) INTDET_TAIL(7) INTDET_TAIL(8) INTDET_TAIL(9) INTDET_TAIL(10) INTDET_TAIL(11)
#undef INTDET_TAIL
    default:
      break;
  }
}

// linear_epilogue on 4 int64 lanes (channels j..j+3 of one row), written to
// o[0..3]; false (nothing written) unless every lane's shift s = shift - e
// is in [1, 62] and every mant in [0, 2^31), the case the vector form covers
// exactly (the loader bounds mant to [0, 2^15]; s outside that range is the
// scalar code's business). acc * mant is formed from two 32 x 32 -> 64
// products, exact modulo 2^64 as the scalar product is; the arithmetic right
// shift, which AVX2 lacks for int64, is x >> s = ~(~x >>> s) for x < 0.
inline bool epilogue4(const int64_t* acc, const int32_t* mant, const int32_t* shift, int32_t e, const int32_t* bias,
                      int64_t* o) {
  const __m256i m = _mm256_cvtepi32_epi64(_mm_loadu_si128((const __m128i*)mant));
  const __m256i s = _mm256_sub_epi64(_mm256_cvtepi32_epi64(_mm_loadu_si128((const __m128i*)shift)),
                                     _mm256_set1_epi64x(e));
  const __m256i bad = _mm256_or_si256(
      _mm256_or_si256(_mm256_cmpgt_epi64(_mm256_set1_epi64x(1), s), _mm256_cmpgt_epi64(s, _mm256_set1_epi64x(62))),
      _mm256_cmpgt_epi64(_mm256_setzero_si256(), m));
  if (!_mm256_testz_si256(bad, bad)) return false;
  const __m256i a = _mm256_loadu_si256((const __m256i*)acc);
  const __m256i x = _mm256_add_epi64(_mm256_mul_epu32(a, m),
                                     _mm256_slli_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), m), 32));
  const __m256i one = _mm256_set1_epi64x(1);
  const __m256i xr = _mm256_add_epi64(x, _mm256_sllv_epi64(one, _mm256_sub_epi64(s, one)));
  const __m256i neg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), xr);
  __m256i r = _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(xr, neg), s), neg);
  const __m256i hi = _mm256_set1_epi64x(kInt32Max), lo = _mm256_set1_epi64x(-kInt32Max);
  r = _mm256_blendv_epi8(r, hi, _mm256_cmpgt_epi64(r, hi));
  r = _mm256_blendv_epi8(r, lo, _mm256_cmpgt_epi64(lo, r));
  if (bias) {
    r = _mm256_add_epi64(r, _mm256_cvtepi32_epi64(_mm_loadu_si128((const __m128i*)bias)));
    r = _mm256_blendv_epi8(r, hi, _mm256_cmpgt_epi64(r, hi));
    r = _mm256_blendv_epi8(r, lo, _mm256_cmpgt_epi64(lo, r));
  }
  _mm256_storeu_si256((__m256i*)o, r);
  return true;
}

// out[(t + r) * ldo + j + c] for a tile's exact dots acc [R][W] (W channels
// from j, of which the first min(W, N - j) exist): the shared linear_epilogue,
// 4 channels at a time where epilogue4 covers them.
template <int R, int W>
inline void store_tile(const int64_t* acc, const int32_t* e, int64_t t, const int32_t* mant, const int32_t* shift,
                       const int32_t* bias, int64_t j, int64_t N, int64_t* out, int64_t ldo) {
  const int64_t nc = N - j < W ? N - j : W;
  for (int r = 0; r < R; ++r) {
    int64_t* o = out + (t + r) * ldo + j;
    int64_t c = 0;
    for (; c + 4 <= nc; c += 4)
      if (!epilogue4(acc + r * W + c, mant + j + c, shift + j + c, e[t + r], bias ? bias + j + c : nullptr, o + c))
        for (int64_t i = c; i < c + 4; ++i)
          o[i] = linear_epilogue(acc[r * W + i], mant[j + i], shift[j + i], e[t + r], bias, j + i);
    for (; c < nc; ++c) o[c] = linear_epilogue(acc[r * W + c], mant[j + c], shift[j + c], e[t + r], bias, j + c);
  }
}

}  // namespace intdet
