// AVX2 linear kernel (compiled with -mavx2 only). Same bits as
// linear_generic: the dot product is exact in any order, and the epilogue is
// the shared linear_epilogue.
#include <immintrin.h>

#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {
namespace {

// int8 weights widened to int16, then vpmaddwd: each int32 lane gains at most
// 2 * 32767 * 127 < 2^23 per step, so 256 steps (K block of 4096) cannot
// overflow; blocks are summed in int64.
constexpr int64_t kBlock = 4096;

inline int64_t hsum_epi32_to_i64(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256((__m256i*)lanes, v);
  int64_t s = 0;
  for (int i = 0; i < 8; ++i) s += lanes[i];
  return s;
}

// Dot products of 4 weight rows with one activation row (the activation
// load is shared by the 4 rows).
inline void dot4(const int16_t* a, const int8_t* w, int64_t K, int64_t* acc) {
  for (int r = 0; r < 4; ++r) acc[r] = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = k0 + kBlock < K ? k0 + kBlock : K;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
      const __m256i x = _mm256_loadu_si256((const __m256i*)(a + k));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(x, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + k)))));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(x, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + K + k)))));
      s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(x, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + 2 * K + k)))));
      s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(x, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + 3 * K + k)))));
    }
    acc[0] += hsum_epi32_to_i64(s0);
    acc[1] += hsum_epi32_to_i64(s1);
    acc[2] += hsum_epi32_to_i64(s2);
    acc[3] += hsum_epi32_to_i64(s3);
    for (; k < k1; ++k)
      for (int r = 0; r < 4; ++r) acc[r] += (int32_t)a[k] * (int32_t)w[r * K + k];
  }
}

inline int64_t dot1(const int16_t* a, const int8_t* w, int64_t K) {
  int64_t acc = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = k0 + kBlock < K ? k0 + kBlock : K;
    __m256i s = _mm256_setzero_si256();
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16)
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)(a + k)),
                                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + k)))));
    acc += hsum_epi32_to_i64(s);
    for (; k < k1; ++k) acc += (int32_t)a[k] * (int32_t)w[k];
  }
  return acc;
}

}  // namespace

void linear_avx2(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                 const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  int64_t j = 0;
  for (; T > 1 && j + 4 <= N; j += 4) {
    const int8_t* wj = w + j * K;
    for (int64_t t = 0; t < T; ++t) {
      int64_t acc[4];
      dot4(q + t * K, wj, K, acc);
      for (int r = 0; r < 4; ++r)
        out[t * ldo + j + r] = linear_epilogue(acc[r], mant[j + r], shift[j + r], e[t], bias, j + r);
    }
  }
  for (; j < N; ++j)
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot1(q + t * K, w + j * K, K), mant[j], shift[j], e[t], bias, j);
}

}  // namespace intdet
