// AVX-512 VNNI int4 linear layer on the AVX2 set's g8-packed weights
// (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni only, or
// against SIMDe). Sharing the layout keeps one packed copy in memory.
//
// Layout (pack_w4, kernels.h): per 8 output channels and group of 32 inputs,
// a 160-byte block: the 8 steps gd, the 8 offsets gm (int16), then 8 rows of
// 16 bytes whose byte 2c + i holds the codes of inputs 4r + i (low nibble)
// and 4r + 2 + i (high nibble) of channel c. The same field of two blocks
// side by side covers 16 channels: one row pair widened to int16 gives
// two vectors of codes u, each laid out like the int8 kernel's weights
// (lane 2c + i), so one vpdpwssd with a broadcast activation pair adds 2
// products to each channel's int32 lane.
//
// Decode multiplies the raw codes and applies each group's step and offset
// once per group (gd * S + gm * Q, docs/format.md); prefill rebuilds 16
// channels' weights w = u * gd + gm as int16 (|w| <= 2047, exact) once per
// chunk of tokens into a scratch and runs register tiles of vpdpwssd.
//
// Exactness (the AVX2 kernel's bounds, kept): decode's S over one group is
// at most 32 * 32768 * 15 < 2^24 in int32; prefill's lanes gain at most
// 2 * 32768 * 2047 < 2^27 a step, so the 16 steps of one group fit int32
// (< 2^31); each group's lanes are then added into int64. The dot product
// is exact in any order and the epilogue is the shared linear_epilogue, so
// the bits equal linear_w4_generic's.
#include <cstring>
#include <vector>

#include "avx512.h"
#include "avx512_intrin.h"
#include "epilogue512.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kTokChunk = 96;   // tokens per L2 block of activations
constexpr int64_t kPrefillMin = 8;  // from this many tokens, expand the weights once per 16 channels

inline __m512i bcast_pair(const int16_t* a) {
  int32_t v;
  std::memcpy(&v, a, 4);
  return _mm512_set1_epi32(v);
}

// 16 bytes at pa, then 16 at pb: the same field of two g8 blocks (8 + 8 channels).
inline __m256i load2(const uint8_t* pa, const uint8_t* pb) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)pa)),
                                 _mm_loadu_si128((const __m128i*)pb), 1);
}

// 16 int16 scales (8 at pa, 8 at pb) -> 32 lanes, each scale twice (the lanes of inputs 2p, 2p+1).
inline __m512i dup_scales(const uint8_t* pa, const uint8_t* pb) {
  const __m512i x = _mm512_cvtepu16_epi32(load2(pa, pb));
  return _mm512_or_si512(x, _mm512_slli_epi32(x, 16));
}

// The g8 groups of channels [j + 16v, j + 16v + 8) and [j + 16v + 8, j + 16v + 16)
// for v < NV; a group past channel N is never read (its lanes are not stored).
template <int NV>
inline void group_pairs(const uint8_t* w4p, int64_t G, int64_t j, int64_t N, const uint8_t** ga, const uint8_t** gb) {
  for (int v = 0; v < NV; ++v) {
    ga[v] = w4p + (j / 8 + 2 * v) * G * kW4Block;
    gb[v] = j + 16 * v + 8 < N ? ga[v] + G * kW4Block : ga[v];
  }
}

// Decode tile, factorised: per group S = sum a * u over the raw codes
// (int16 0..15, so no weight rebuild), then gd * S + gm * Q in int64 with
// Q = the group's activation sum (qs [MR][G]). acc [MR][16*NV] int64 for NV
// 16-channel pairs of g8 groups (ga, gb: G blocks each). Two
// accumulators per (token, group) (low and high nibbles) make 2*MR*NV
// independent vpdpwssd chains.
template <int MR, int NV>
inline void tile(const int16_t* a, int64_t lda, const int32_t* qs, int64_t G, const uint8_t* const* ga,
                 const uint8_t* const* gb, int64_t* acc) {
  __m512i ev[MR][NV], od[MR][NV];  // int64 sums of channels 0, 2, .., 14 and 1, 3, .., 15
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) ev[r][v] = od[r][v] = _mm512_setzero_si512();
  const __m512i nib = _mm512_set1_epi16(15);
  for (int64_t j = 0; j < G; ++j) {
    __m512i s0[MR][NV], s1[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) s0[r][v] = s1[r][v] = _mm512_setzero_si512();
    const int16_t* aj = a + 32 * j;
#pragma GCC unroll 8  // rolled, GCC 12 copies every accumulator each row
    for (int row = 0; row < 8; ++row) {
      __m512i u0[NV], u1[NV];
      for (int v = 0; v < NV; ++v) {
        const int64_t o = j * kW4Block + 32 + 16 * row;
        const __m512i c = _mm512_cvtepu8_epi16(load2(ga[v] + o, gb[v] + o));
        u0[v] = _mm512_and_si512(c, nib);
        u1[v] = _mm512_srli_epi16(c, 4);
      }
      for (int r = 0; r < MR; ++r) {
        const int16_t* ar = aj + r * lda + 4 * row;
        const __m512i x0 = bcast_pair(ar), x1 = bcast_pair(ar + 2);
        for (int v = 0; v < NV; ++v) {
          s0[r][v] = _mm512_dpwssd_epi32(s0[r][v], u0[v], x0);
          s1[r][v] = _mm512_dpwssd_epi32(s1[r][v], u1[v], x1);
        }
      }
    }
    // vpmuldq multiplies the low (signed) 32 bits of each 64-bit lane: even
    // channels as they lie, odd ones after a 32-bit shift.
    for (int v = 0; v < NV; ++v) {
      const uint8_t *ba = ga[v] + j * kW4Block, *bb = gb[v] + j * kW4Block;
      const __m512i d = _mm512_cvtepi16_epi32(load2(ba, bb));
      const __m512i m = _mm512_cvtepi16_epi32(load2(ba + 16, bb + 16));
      const __m512i d1 = _mm512_srli_epi64(d, 32), m1 = _mm512_srli_epi64(m, 32);
      for (int r = 0; r < MR; ++r) {
        const __m512i s = _mm512_add_epi32(s0[r][v], s1[r][v]);  // the group's S: < 2^24
        const __m512i qv = _mm512_set1_epi32(qs[r * G + j]);
        ev[r][v] = _mm512_add_epi64(ev[r][v], _mm512_add_epi64(_mm512_mul_epi32(s, d), _mm512_mul_epi32(m, qv)));
        od[r][v] = _mm512_add_epi64(od[r][v], _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(s, 32), d1),
                                                               _mm512_mul_epi32(m1, qv)));
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      alignas(64) int64_t e8[8], o8[8];
      _mm512_store_si512((void*)e8, ev[r][v]);
      _mm512_store_si512((void*)o8, od[r][v]);
      int64_t* o = acc + (r * NV + v) * 16;
      for (int c = 0; c < 8; ++c) {
        o[2 * c] = e8[c];
        o[2 * c + 1] = o8[c];
      }
    }
}

// One 16-channel group's weights as int16, 32 lanes per input pair p
// (lane 2c + i = w[c][2p + i]): ws [K/2][32].
inline void expand(const uint8_t* ga, const uint8_t* gb, int64_t G, int16_t* ws) {
  const __m512i nib = _mm512_set1_epi16(15);
  for (int64_t j = 0; j < G; ++j) {
    const uint8_t *ba = ga + j * kW4Block, *bb = gb + j * kW4Block;
    const __m512i d = dup_scales(ba, bb), m = dup_scales(ba + 16, bb + 16);
    for (int row = 0; row < 8; ++row) {
      const __m512i v = _mm512_cvtepu8_epi16(load2(ba + 32 + 16 * row, bb + 32 + 16 * row));
      int16_t* o = ws + (16 * j + 2 * row) * 32;
      _mm512_storeu_si512((void*)o, _mm512_add_epi16(_mm512_mullo_epi16(_mm512_and_si512(v, nib), d), m));
      _mm512_storeu_si512((void*)(o + 32), _mm512_add_epi16(_mm512_mullo_epi16(_mm512_srli_epi16(v, 4), d), m));
    }
  }
}

// acc16 [16] int64 += the 16 int32 lanes of v.
inline void add_lanes(__m512i v, int64_t* acc16) {
  const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
  const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
  _mm512_storeu_si512((void*)acc16, _mm512_add_epi64(_mm512_loadu_si512((const void*)acc16), lo));
  _mm512_storeu_si512((void*)(acc16 + 8), _mm512_add_epi64(_mm512_loadu_si512((const void*)(acc16 + 8)), hi));
}

// acc [MR][16*NV] int64: MR activation rows against NV expanded groups
// (ws + v * K * 16), int32 within a group of 16 pairs, then int64.
template <int MR, int NV>
inline void tile_x(const int16_t* a, int64_t lda, int64_t G, const int16_t* ws, int64_t K, int64_t* acc) {
  for (int i = 0; i < MR * 16 * NV; ++i) acc[i] = 0;
  const int64_t Kp = 16 * G;
  const int16_t* wv[NV];
  for (int v = 0; v < NV; ++v) wv[v] = ws + v * K * 16;
  for (int64_t p0 = 0; p0 < Kp; p0 += 16) {
    __m512i s[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_setzero_si512();
    const int64_t p1 = p0 + 16 < Kp ? p0 + 16 : Kp;  // 16 pairs: one group; not a constant (a constant spilled)
    for (int64_t p = p0; p < p1; ++p) {
      __m512i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = _mm512_loadu_si512((const void*)(wv[v] + p * 32));
      for (int r = 0; r < MR; ++r) {
        const __m512i x = bcast_pair(a + r * lda + 2 * p);
        for (int v = 0; v < NV; ++v) s[r][v] = _mm512_dpwssd_epi32(s[r][v], x, w[v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) add_lanes(s[r][v], acc + (r * NV + v) * 16);
  }
}

// Tokens [t0, t1) against NV expanded groups starting at channel j. At most
// 16 accumulators: with more, GCC 12 spilled them in this loop (the int8
// kernel's 24 stay in registers).
template <int MR, int NV>
inline void tokens_x(const int16_t* q, const int32_t* e, int64_t t0, int64_t t1, int64_t K, const int16_t* ws,
                     const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                     int64_t* out, int64_t ldo) {
  token_tiles<MR>(t0, t1, [&](auto R, int64_t t) {
    alignas(64) int64_t acc[R * 16 * NV];
    tile_x<R, NV>(q + t * K, K, K / kW4Group, ws, K, acc);
    store_tile8<R, 16 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
  });
}

// Decode: tokens [0, T) against NV packed groups from channel j.
template <int MR, int NV>
inline void tokens_d(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int32_t* qs, const uint8_t* w4p,
                     const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                     int64_t* out, int64_t ldo) {
  const int64_t G = K / kW4Group;
  const uint8_t *ga[NV], *gb[NV];
  group_pairs<NV>(w4p, G, j, N, ga, gb);
  token_tiles<MR>(0, T, [&](auto R, int64_t t) {
    alignas(64) int64_t acc[R * 16 * NV];
    tile<R, NV>(q + t * K, K, qs + t * G, G, ga, gb, acc);
    store_tile8<R, 16 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
  });
}

}  // namespace

void linear_w4_avx512_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4p,
                             const int16_t*, const int16_t*, const int32_t* mant, const int32_t* shift,
                             const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  const int64_t G = K / kW4Group;
  if (T >= kPrefillMin) {
    thread_local std::vector<int16_t> ws;  // up to 64 channels' int16 weights, reused across calls
    ws.resize((size_t)(64 * K));
    // Token chunks outermost so the activations stay in L2; rebuilding the
    // weights per chunk costs about 2% of the chunk's multiply-adds.
    for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
      const int64_t t1 = t0 + kTokChunk < T ? t0 + kTokChunk : T;
      for (int64_t j = 0; j < N; j += 64) {
        const int64_t nv = (N - j) >= 64 ? 4 : (N - j + 15) / 16;
        for (int64_t v = 0; v < nv; ++v) {  // as group_pairs
          const uint8_t* ga = w4p + (j / 8 + 2 * v) * G * kW4Block;
          expand(ga, j + 16 * v + 8 < N ? ga + G * kW4Block : ga, G, ws.data() + v * K * 16);
        }
        switch (nv) {
          case 4: tokens_x<4, 4>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo); break;
          case 3: tokens_x<5, 3>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo); break;
          case 2: tokens_x<8, 2>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo); break;
          default: tokens_x<8, 1>(q, e, t0, t1, K, ws.data(), mant, shift, bias, j, N, out, ldo); break;
        }
      }
    }
    return;
  }
  // Decode: the groups' activation sums once (|sum| <= 32 * 32768), then
  // tiles of up to 2 tokens x 32 channels or 1 token x 64 channels (their
  // int64 sums and 2 int32 chains per token and group stay in registers).
  thread_local std::vector<int32_t> qs;
  qs.resize((size_t)(T * G));
  const __m512i ones = _mm512_set1_epi16(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const __m512i s = _mm512_madd_epi16(_mm512_loadu_si512((const void*)(q + t * K + g * kW4Group)), ones);
      const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
      __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
      x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
      qs[t * G + g] = _mm_cvtsi128_si32(x);
    }
  int64_t j = 0;
  if (T == 1)
    for (; j + 64 <= N; j += 64) tokens_d<1, 4>(q, e, T, K, qs.data(), w4p, mant, shift, bias, j, N, out, ldo);
  for (; j + 32 <= N; j += 32) tokens_d<2, 2>(q, e, T, K, qs.data(), w4p, mant, shift, bias, j, N, out, ldo);
  for (; j < N; j += 16) tokens_d<2, 1>(q, e, T, K, qs.data(), w4p, mant, shift, bias, j, N, out, ldo);
}

}  // namespace intdet
