// AVX-512 VNNI linear layer on the AVX2 set's g8-packed int8 weights
// (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni only, or
// against SIMDe). Sharing the layout keeps one packed copy in memory.
//
// Layout (pack_w8x2, kernels.h): output channels in groups of 8, K in pairs;
// 16 bytes hold w[8g + c][2p + i] at byte 2c + i. Two groups' 16 bytes for
// pair p, side by side and widened to int16 (32 lanes),
// one vpdpwssd with the broadcast activation pair (a[2p], a[2p+1]) adds 2
// products to each of 16 channels' int32 lanes: lanes are output channels,
// no horizontal sum. vpdpwssd is the VNNI form of the AVX2 kernel's
// vpmaddwd + vpaddd (products and sums wrap in int32 exactly alike).
//
// Exactness (the AVX2 kernel's bound, kept): activations |a| <= 32767
// (quant16_row), weights |w| <= 128, so a step adds at most
// 2 * 32767 * 128 < 2^23 to a lane and 256 steps (512 k) stay below 2^31;
// then the lanes are added into int64. The dot product is exact in any
// order (two interleaved accumulators in decode included: their sum is
// the same block's sum) and the epilogue is the shared linear_epilogue, so
// the bits equal linear_generic's.
#include <cstring>

#include "avx512.h"
#include "avx512_intrin.h"
#include "epilogue512.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kPairBlock = 256;  // pairs per int32 accumulation block
constexpr int64_t kTokChunk = 96;    // tokens per L2 block of activations

inline __m512i bcast_pair(const int16_t* a) {
  int32_t v;
  std::memcpy(&v, a, 4);
  return _mm512_set1_epi32(v);
}

// The 16 channels' weights of pair p as 32 int16 lanes (lane 2c + i =
// w[c][2p + i]): 16 bytes from each of two g8 groups.
inline __m512i wvec(const int8_t* ga, const int8_t* gb, int64_t p) {
  const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(ga + 16 * p))),
                                            _mm_loadu_si128((const __m128i*)(gb + 16 * p)), 1);
  return _mm512_cvtepi8_epi16(w);
}

// acc16 [16] int64 += the 16 int32 lanes of v.
inline void add_lanes(__m512i v, int64_t* acc16) {
  const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
  const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
  _mm512_storeu_si512((void*)acc16, _mm512_add_epi64(_mm512_loadu_si512((const void*)acc16), lo));
  _mm512_storeu_si512((void*)(acc16 + 8), _mm512_add_epi64(_mm512_loadu_si512((const void*)(acc16 + 8)), hi));
}

// acc [MR][16*NV] int64 = exact dots of MR activation rows (stride lda,
// K inputs) with channels [j, j + 16*NV) of wp (g8 groups of Kp*16 bytes;
// a group past channel N is never read: its lanes are not stored). KS
// interleaved accumulator sets (1 or 2) give decode's few tiles more
// independent vpdpwssd chains.
template <int MR, int NV, int KS>
inline void tile(const int16_t* a, int64_t lda, int64_t K, const int8_t* wp, int64_t Kp, int64_t j, int64_t N,
                 int64_t* acc) {
  for (int i = 0; i < MR * 16 * NV; ++i) acc[i] = 0;
  const int8_t *ga[NV], *gb[NV];
  for (int v = 0; v < NV; ++v) {
    ga[v] = wp + (j / 8 + 2 * v) * Kp * 16;
    gb[v] = j + 16 * v + 8 < N ? ga[v] + Kp * 16 : ga[v];
  }
  const int64_t Kf = K / 2;  // whole pairs; an odd K's last pair is (a[K-1], 0)
  for (int64_t p0 = 0; p0 < Kp; p0 += kPairBlock) {
    const int64_t p1 = p0 + kPairBlock < Kp ? p0 + kPairBlock : Kp;
    const int64_t pf = p1 < Kf ? p1 : Kf;
    __m512i s[KS][MR][NV];
    for (int k = 0; k < KS; ++k)
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) s[k][r][v] = _mm512_setzero_si512();
    int64_t p = p0;
    for (; p + KS <= pf; p += KS)
      for (int k = 0; k < KS; ++k) {  // constant trip counts: unrolled, s stays in registers
        __m512i w[NV];
        for (int v = 0; v < NV; ++v) w[v] = wvec(ga[v], gb[v], p + k);
        for (int r = 0; r < MR; ++r) {
          const __m512i x = bcast_pair(a + r * lda + 2 * (p + k));
          for (int v = 0; v < NV; ++v) s[k][r][v] = _mm512_dpwssd_epi32(s[k][r][v], x, w[v]);
        }
      }
    for (; p < p1; ++p) {  // the block's last pair when KS does not divide it, and an odd K's (a[K-1], 0)
      __m512i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = wvec(ga[v], gb[v], p);
      for (int r = 0; r < MR; ++r) {
        const __m512i x = p < pf ? bcast_pair(a + r * lda + 2 * p) : _mm512_set1_epi32((int32_t)(uint16_t)a[r * lda + K - 1]);
        for (int v = 0; v < NV; ++v) s[0][r][v] = _mm512_dpwssd_epi32(s[0][r][v], x, w[v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) {
        __m512i t = s[0][r][v];
        for (int k = 1; k < KS; ++k) t = _mm512_add_epi32(t, s[k][r][v]);  // one block's sum: < 2^31
        add_lanes(t, acc + (r * NV + v) * 16);
      }
  }
}

// Tokens [t0, t1) against channels [j, j + 16*NV): tiles of up to MR tokens.
template <int MR, int NV, int KS>
inline void tokens(const int16_t* q, const int32_t* e, int64_t t0, int64_t t1, int64_t K, const int8_t* wp,
                   int64_t Kp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                   int64_t* out, int64_t ldo) {
  token_tiles<MR>(t0, t1, [&](auto R, int64_t t) {
    alignas(64) int64_t acc[R * 16 * NV];
    tile<R, NV, KS>(q + t * K, K, K, wp, Kp, j, N, acc);
    store_tile8<R, 16 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
  });
}

// Channels [0, N) in tiles of 16*NV channels, the last tile narrower:
// MR*NV*KS accumulators + NV weights + a broadcast within the 32 registers.
template <int MR4, int MR3, int MR2, int MR1, int KS>
inline void channels(const int16_t* q, const int32_t* e, int64_t t0, int64_t t1, int64_t K, const int8_t* wp,
                     int64_t Kp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                     int64_t* out, int64_t ldo) {
  int64_t j = 0;  // (the packing pads the last group to 16 channels)
  for (; j < N - 48; j += 64) tokens<MR4, 4, KS>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
  switch ((N - j + 15) / 16) {
    case 3: tokens<MR3, 3, KS>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo); break;
    case 2: tokens<MR2, 2, KS>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo); break;
    case 1: tokens<MR1, 1, KS>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo); break;
    default: break;
  }
}

}  // namespace

void linear_avx512_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                          const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                          int64_t ldo) {
  const int64_t Kp = (K + 1) / 2;
  if (T <= 2) {
    // Decode: up to 64 channels x 2 tokens, two accumulator sets (16 chains).
    channels<2, 2, 2, 2, 2>(q, e, 0, T, K, wp, Kp, mant, shift, bias, N, out, ldo);
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
    const int64_t t1 = t0 + kTokChunk < T ? t0 + kTokChunk : T;
    channels<6, 8, 12, 12, 1>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, N, out, ldo);
  }
}

}  // namespace intdet
