// AVX2 int4 linear layer on repacked weights (compiled with -mavx2 only).
//
// Layout (pack_w4): per 8 output channels and group of 32 inputs, a 160-byte
// block: the 8 steps gd, the 8 offsets gm (int16), then 8 rows of 16 bytes
// whose byte 2c + i holds the codes of inputs 4r + i (low nibble) and
// 4r + 2 + i (high nibble) of channel c. One row widened to int16 gives two
// vectors of codes u; w = u * gd + gm (vpmullw, vpaddw; |w| <= 2047 so
// int16 is exact) is laid out like the int8 kernel's weights, so one
// vpmaddwd with a broadcast activation pair adds 2 products to each
// channel's int32 lane.
//
// Decode multiplies the raw codes and applies each group's step and offset
// once per group (gd * S + gm * Q); prefill rebuilds 16 channels' weights once per chunk of tokens into an
// int16 scratch (the int8 kernel's layout, widened) and runs 6 x 16 tiles.
//
// Exactness: a vpmaddwd lane is at most 2 * 32768 * 2047 < 2^27, so the 16
// of one group (32 inputs) fit int32 (< 2^31); each group's lanes are then
// added into int64. The dot product is exact in any order and the epilogue
// is the shared linear_epilogue, so the bits equal linear_w4_generic's.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "avx2.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kTokChunk = 96;   // tokens per L2 block of activations
constexpr int64_t kPrefillMin = 8;  // from this many tokens, expand the weights once per 16 channels

inline __m256i bcast_pair(const int16_t* a) {
  int32_t v;
  std::memcpy(&v, a, 4);
  return _mm256_set1_epi32(v);
}

// 8 int16 scales -> 16 lanes, each scale twice (the lanes of inputs 2p, 2p+1).
inline __m256i dup_scales(const uint8_t* p) {
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_or_si256(x, _mm256_slli_epi32(x, 16));
}

// Decode tile, factorised: per group S = sum a * u over the raw codes
// (int16 0..15, so no weight rebuild; |S| < 2^24 in int32), then
// gd * S + gm * Q in int64 with Q = the group's activation sum (qs [MR][G]).
// acc [MR][8] int64 for one packed 8-channel group of G blocks.
template <int MR>
inline void tile(const int16_t* a, int64_t lda, const int32_t* qs, int64_t G, const uint8_t* wg, int64_t* acc) {
  __m256i ev[MR], od[MR];  // int64 sums of channels 0, 2, 4, 6 and 1, 3, 5, 7
  for (int r = 0; r < MR; ++r) ev[r] = od[r] = _mm256_setzero_si256();
  const __m256i nib = _mm256_set1_epi16(15);
  for (int64_t j = 0; j < G; ++j) {
    const uint8_t* b = wg + j * kW4Block;
    __m256i s[MR];
    for (int r = 0; r < MR; ++r) s[r] = _mm256_setzero_si256();
    const int16_t* aj = a + 32 * j;
    for (int row = 0; row < 8; ++row) {
      const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * row)));
      const __m256i u0 = _mm256_and_si256(v, nib), u1 = _mm256_srli_epi16(v, 4);
      for (int r = 0; r < MR; ++r) {
        const int16_t* ar = aj + r * lda + 4 * row;
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(u0, bcast_pair(ar)));
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(u1, bcast_pair(ar + 2)));
      }
    }
    // vpmuldq multiplies the low (signed) 32 bits of each 64-bit lane: even
    // channels as they lie, odd ones after a 32-bit shift.
    const __m256i d = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)b));
    const __m256i m = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)(b + 16)));
    const __m256i d1 = _mm256_srli_epi64(d, 32), m1 = _mm256_srli_epi64(m, 32);
    for (int r = 0; r < MR; ++r) {
      const __m256i qv = _mm256_set1_epi32(qs[r * G + j]);
      ev[r] = _mm256_add_epi64(ev[r], _mm256_add_epi64(_mm256_mul_epi32(s[r], d), _mm256_mul_epi32(m, qv)));
      od[r] = _mm256_add_epi64(od[r], _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(s[r], 32), d1),
                                                       _mm256_mul_epi32(m1, qv)));
    }
  }
  for (int r = 0; r < MR; ++r) {
    alignas(32) int64_t e4[4], o4[4];
    _mm256_store_si256((__m256i*)e4, ev[r]);
    _mm256_store_si256((__m256i*)o4, od[r]);
    for (int c = 0; c < 4; ++c) {
      acc[8 * r + 2 * c] = e4[c];
      acc[8 * r + 2 * c + 1] = o4[c];
    }
  }
}

// One 8-channel group's weights as int16, 16 lanes per input pair p
// (lane 2c + i = w[c][2p + i]): ws [K/2][16].
inline void expand(const uint8_t* wg, int64_t G, int16_t* ws) {
  const __m256i nib = _mm256_set1_epi16(15);
  for (int64_t j = 0; j < G; ++j) {
    const uint8_t* b = wg + j * kW4Block;
    const __m256i d = dup_scales(b), m = dup_scales(b + 16);
    for (int row = 0; row < 8; ++row) {
      const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * row)));
      int16_t* o = ws + (16 * j + 2 * row) * 16;
      _mm256_storeu_si256((__m256i*)o, _mm256_add_epi16(_mm256_mullo_epi16(_mm256_and_si256(v, nib), d), m));
      _mm256_storeu_si256((__m256i*)(o + 16), _mm256_add_epi16(_mm256_mullo_epi16(_mm256_srli_epi16(v, 4), d), m));
    }
  }
}

// acc [MR][8*NV] int64: MR activation rows against NV expanded groups
// (ws + v * K * 8), int32 within a group of 16 pairs, then int64.
template <int MR, int NV>
inline void tile_x(const int16_t* a, int64_t lda, int64_t G, const int16_t* ws, int64_t K, int64_t* acc) {
  for (int i = 0; i < MR * 8 * NV; ++i) acc[i] = 0;
  for (int64_t j = 0; j < G; ++j) {
    __m256i s[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) s[r][v] = _mm256_setzero_si256();
    for (int64_t p = 16 * j; p < 16 * j + 16; ++p) {
      __m256i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = _mm256_loadu_si256((const __m256i*)(ws + v * K * 8 + p * 16));
      for (int r = 0; r < MR; ++r) {
        const __m256i x = bcast_pair(a + r * lda + 2 * p);
        for (int v = 0; v < NV; ++v) s[r][v] = _mm256_add_epi32(s[r][v], _mm256_madd_epi16(x, w[v]));
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) {
        int64_t* o = acc + (r * NV + v) * 8;
        const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(s[r][v]));
        const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(s[r][v], 1));
        _mm256_storeu_si256((__m256i*)o, _mm256_add_epi64(_mm256_loadu_si256((const __m256i*)o), lo));
        _mm256_storeu_si256((__m256i*)(o + 4), _mm256_add_epi64(_mm256_loadu_si256((const __m256i*)(o + 4)), hi));
      }
  }
}

// Tokens [t0, t1) against NV expanded groups starting at channel j.
template <int NV>
inline void tokens_x(const int16_t* q, const int32_t* e, int64_t t0, int64_t t1, int64_t K, const int16_t* ws,
                     const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                     int64_t* out, int64_t ldo) {
  // 8 accumulators, NV weights and the broadcasts stay in the 16 registers
  token_tiles<8 / NV>(t0, t1, [&](auto R, int64_t t) {
    alignas(32) int64_t acc[R * 8 * NV];
    tile_x<R, NV>(q + t * K, K, K / kW4Group, ws, K, acc);
    store_tile<R, 8 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
  });
}

}  // namespace

void linear_w4_avx2_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4p,
                           const int16_t*, const int16_t*, const int32_t* mant, const int32_t* shift,
                           const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  const int64_t G = K / kW4Group;
  if (T >= kPrefillMin) {
    thread_local std::vector<int16_t> ws;  // 16 channels' int16 weights, reused across calls
    ws.resize((size_t)(16 * K));
    // Token chunks outermost so the activations stay in L2; rebuilding the
    // weights per chunk costs about 2% of the chunk's multiply-adds.
    for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
      const int64_t t1 = t0 + kTokChunk < T ? t0 + kTokChunk : T;
      for (int64_t j = 0; j < N; j += 16) {
        const int64_t nv = N - j > 8 ? 2 : 1;
        for (int64_t v = 0; v < nv; ++v) expand(w4p + (j / 8 + v) * G * kW4Block, G, ws.data() + v * K * 8);
        if (nv == 2)
          tokens_x<2>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo);
        else
          tokens_x<1>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo);
      }
    }
    return;
  }
  // Decode: the groups' activation sums once, then 2 x 8 tiles (2 int32 and
  // 4 int64 accumulators, scales, codes: no spills).
  // (Each thread's row block recomputes them: T * K adds, vectorized, against
  // T * K * rows multiply-adds.)
  thread_local std::vector<int32_t> qs;
  qs.resize((size_t)(T * G));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {  // |sum| <= 32 * 32768
      const int16_t* a = q + t * K + g * kW4Group;
      const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)a), ones),
                                         _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)(a + 16)), ones));
      __m128i x = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
      x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
      qs[t * G + g] = _mm_cvtsi128_si32(x);
    }
  for (int64_t j = 0; j < N; j += 8)
    token_tiles<2>(0, T, [&](auto R, int64_t t) {
      alignas(32) int64_t acc[R * 8];
      tile<R>(q + t * K, K, qs.data() + t * G, G, w4p + (j / 8) * G * kW4Block, acc);
      store_tile<R, 8>(acc, e, t, mant, shift, bias, j, N, out, ldo);
    });
}

}  // namespace intdet
