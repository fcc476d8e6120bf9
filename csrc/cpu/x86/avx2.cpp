// AVX2 linear kernel (compiled with -mavx2 only). Same bits as
// linear_generic: the dot product is exact in any order, and the epilogue is
// the shared linear_epilogue.
#include <immintrin.h>

#include <vector>

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

// Prefill tile: 4 weight rows (already widened to int16 in w16) x 2 tokens,
// 8 int32 accumulators; no shuffles in the inner loop.
inline void tile4x2(const int16_t* a0, const int16_t* a1, const int16_t* w16, int64_t K, int64_t* acc) {
  for (int i = 0; i < 8; ++i) acc[i] = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = k0 + kBlock < K ? k0 + kBlock : K;
    __m256i s[8];
    for (int i = 0; i < 8; ++i) s[i] = _mm256_setzero_si256();
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
      const __m256i x0 = _mm256_loadu_si256((const __m256i*)(a0 + k));
      const __m256i x1 = _mm256_loadu_si256((const __m256i*)(a1 + k));
      for (int r = 0; r < 4; ++r) {
        const __m256i w = _mm256_loadu_si256((const __m256i*)(w16 + r * K + k));
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(x0, w));
        s[4 + r] = _mm256_add_epi32(s[4 + r], _mm256_madd_epi16(x1, w));
      }
    }
    for (int i = 0; i < 8; ++i) acc[i] += hsum_epi32_to_i64(s[i]);
    for (; k < k1; ++k)
      for (int r = 0; r < 4; ++r) {
        acc[r] += (int32_t)a0[k] * w16[r * K + k];
        acc[4 + r] += (int32_t)a1[k] * w16[r * K + k];
      }
  }
}

}  // namespace

void linear_avx2(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                 const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  int64_t j = 0;
  if (T > 1) {
    // Prefill: weights are reused by every token, so widen each 4-row block
    // to int16 once and run 4x2 tiles over the tokens.
    std::vector<int16_t> w16((size_t)(4 * K));
    for (; j + 4 <= N; j += 4) {
      for (int64_t i = 0; i < 4 * K; ++i) w16[i] = w[j * K + i];
      int64_t t = 0;
      for (; t + 2 <= T; t += 2) {
        int64_t acc[8];
        tile4x2(q + t * K, q + (t + 1) * K, w16.data(), K, acc);
        for (int r = 0; r < 4; ++r) {
          out[t * ldo + j + r] = linear_epilogue(acc[r], mant[j + r], shift[j + r], e[t], bias, j + r);
          out[(t + 1) * ldo + j + r] = linear_epilogue(acc[4 + r], mant[j + r], shift[j + r], e[t + 1], bias, j + r);
        }
      }
      for (; t < T; ++t) {
        int64_t acc[4];
        dot4(q + t * K, w + j * K, K, acc);
        for (int r = 0; r < 4; ++r)
          out[t * ldo + j + r] = linear_epilogue(acc[r], mant[j + r], shift[j + r], e[t], bias, j + r);
      }
    }
  }
  // Decode (and leftover rows): one row at a time streams the weights in
  // order, which the hardware prefetcher handles best.
  for (; j < N; ++j)
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot1(q + t * K, w + j * K, K), mant[j], shift[j], e[t], bias, j);
}

// Attention for one query head (same bits as attend_head in ops_generic.cpp).
// q . k: int8 keys widened to int16, vpmaddwd. P . V: two positions per
// vpmaddwd (their int16 weights paired in every 32-bit lane, their value rows
// interleaved), int32 accumulators flushed to int64 every kPvBlock positions.
void attend_head_avx2(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                      const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                      int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out) {
  if (D % 16) {  // the vector loops below assume whole 16-element chunks
    attend_head(q, e_q, kc, ka, vc, va, n, stride, D, score_mant, score_shift, z, p, w16, out);
    return;
  }
  const int64_t sstride = stride / D;
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* k = kc + t * stride;
    __m256i s = _mm256_setzero_si256();
    for (int64_t d = 0; d < D; d += 16)
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)(q + d)),
                                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k + d)))));
    z[t] = attn_score((int32_t)hsum_epi32_to_i64(s), ka[t * sstride], e_q, score_mant, score_shift);
  }
  softmax_q16_row(z, n, p);
  for (int64_t t = 0; t < n; ++t) p[t] *= va[t * sstride];
  const int sh = quant16_row(p, n, w16);
  for (int64_t d = 0; d < D; ++d) out[d] = 0;
  const int64_t nc = D / 16;  // 16-wide chunks of the head
  for (int64_t t0 = 0; t0 < n; t0 += kPvBlock) {
    const int64_t t1 = t0 + kPvBlock < n ? t0 + kPvBlock : n;
    __m256i lo[16], hi[16];  // D <= 256: chunk c holds d = 16c + {0-3, 8-11} / {4-7, 12-15}
    for (int64_t c = 0; c < nc; ++c) lo[c] = hi[c] = _mm256_setzero_si256();
    int64_t t = t0;
    for (; t + 2 <= t1; t += 2) {
      const __m256i wp = _mm256_set1_epi32((int32_t)(((uint32_t)(uint16_t)w16[t + 1] << 16) | (uint16_t)w16[t]));
      const int8_t* v0 = vc + t * stride;
      const int8_t* v1 = v0 + stride;
      for (int64_t c = 0; c < nc; ++c) {
        const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v0 + 16 * c)));
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v1 + 16 * c)));
        lo[c] = _mm256_add_epi32(lo[c], _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wp));
        hi[c] = _mm256_add_epi32(hi[c], _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wp));
      }
    }
    for (int64_t c = 0; c < nc; ++c) {
      alignas(32) int32_t l[8], h[8];
      _mm256_store_si256((__m256i*)l, lo[c]);
      _mm256_store_si256((__m256i*)h, hi[c]);
      int64_t* o = out + 16 * c;
      for (int i = 0; i < 4; ++i) {
        o[i] += l[i];
        o[8 + i] += l[4 + i];
        o[4 + i] += h[i];
        o[12 + i] += h[4 + i];
      }
    }
    for (; t < t1; ++t) {  // odd position left over
      const int8_t* v = vc + t * stride;
      for (int64_t d = 0; d < D; ++d) out[d] += (int32_t)w16[t] * v[d];
    }
  }
  for (int64_t d = 0; d < D; ++d) out[d] = shl(out[d], sh);
}

}  // namespace intdet
