// linear_epilogue (ops.h) on 8 int64 lanes with AVX-512F, for the AVX-512
// and AMX sets' tiles; the AVX2 form is epilogue4 (tiles.h). Only
// instructions SIMDe (0.8.2) also provides, so the test build compiles the
// same text.
#pragma once

#include <cstdint>

#include "avx512_intrin.h"
#include "intdet/ops.h"

namespace intdet {

// One block of 8 output channels' scales, widened once for every row.
struct Scales8 {
  __m512i mant, shift;  // int64 lanes
  bool vector_ok;       // every mant in [0, 2^31) (the loader's bound is [0, 2^15])
};

inline Scales8 load_scales8(const int32_t* mant, const int32_t* shift) {
  Scales8 s;
  s.mant = _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)mant));
  s.shift = _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)shift));
  s.vector_ok = _mm512_cmpgt_epi64_mask(_mm512_setzero_si512(), s.mant) == 0;
  return s;
}

// o[0..7] = linear_epilogue(acc[c], mant[c], shift[c], e, bias, c) for the
// 8 channels of sc; false (nothing written) unless every lane's s = shift - e
// is in [1, 62] and sc.vector_ok, the case this form covers exactly (as
// epilogue4: acc * mant modulo 2^64 from two 32 x 32 -> 64 products; the
// arithmetic right shift as ~(~x >>> s) for x < 0).
inline bool epilogue8(__m512i acc, const Scales8& sc, int32_t e, const int32_t* bias, int64_t* o) {
  if (!sc.vector_ok) return false;
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i s = _mm512_sub_epi64(sc.shift, _mm512_set1_epi64(e));
  if ((_mm512_cmpgt_epi64_mask(one, s) | _mm512_cmpgt_epi64_mask(s, _mm512_set1_epi64(62))) != 0) return false;
  const __m512i x = _mm512_add_epi64(_mm512_mul_epu32(acc, sc.mant),
                                     _mm512_slli_epi64(_mm512_mul_epu32(_mm512_srli_epi64(acc, 32), sc.mant), 32));
  const __m512i xr = _mm512_add_epi64(x, _mm512_sllv_epi64(one, _mm512_sub_epi64(s, one)));
  const __m512i neg = _mm512_mask_blend_epi64(_mm512_cmpgt_epi64_mask(_mm512_setzero_si512(), xr),
                                              _mm512_setzero_si512(), _mm512_set1_epi64(-1));
  __m512i r = _mm512_xor_si512(_mm512_srlv_epi64(_mm512_xor_si512(xr, neg), s), neg);
  const __m512i hi = _mm512_set1_epi64(kInt32Max), lo = _mm512_set1_epi64(-kInt32Max);
  r = _mm512_max_epi64(_mm512_min_epi64(r, hi), lo);
  if (bias) {
    r = _mm512_add_epi64(r, _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)bias)));
    r = _mm512_max_epi64(_mm512_min_epi64(r, hi), lo);
  }
  _mm512_storeu_si512((void*)o, r);
  return true;
}

// out[(t + r) * ldo + j + c] for a tile's exact dots acc [R][W] (W channels
// from j, of which the first min(W, N - j) exist): store_tile (tiles.h) on 8
// lanes, each 8-channel block's scales widened once for all R rows. The
// 4-lane epilogue was a fifth of the avx512 GEMM's time in a SmolLM2
// prefill on AMD Zen 4 (perf).
template <int R, int W>
inline void store_tile8(const int64_t* acc, const int32_t* e, int64_t t, const int32_t* mant, const int32_t* shift,
                        const int32_t* bias, int64_t j, int64_t N, int64_t* out, int64_t ldo) {
  const int64_t nc = N - j < W ? N - j : W;
  int64_t c = 0;
  for (; c + 8 <= nc; c += 8) {
    const Scales8 sc = load_scales8(mant + j + c, shift + j + c);
    for (int r = 0; r < R; ++r) {
      const int64_t* a = acc + r * W + c;
      int64_t* o = out + (t + r) * ldo + j + c;
      if (!epilogue8(_mm512_loadu_si512((const void*)a), sc, e[t + r], bias ? bias + j + c : nullptr, o))
        for (int i = 0; i < 8; ++i) o[i] = linear_epilogue(a[i], mant[j + c + i], shift[j + c + i], e[t + r], bias, j + c + i);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t i = c; i < nc; ++i)
      out[(t + r) * ldo + j + i] = linear_epilogue(acc[r * W + i], mant[j + i], shift[j + i], e[t + r], bias, j + i);
}

}  // namespace intdet
