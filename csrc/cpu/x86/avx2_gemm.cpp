// AVX2 linear layer on repacked weights (compiled with -mavx2 only).
//
// Layout (pack_w8x2): output channels in groups of 8, K in pairs; 16 bytes
// hold w[8g + c][2p + i] at byte 2c + i. Widened to int16, one vpmaddwd with
// the broadcast activation pair (a[2p], a[2p+1]) adds 2 products to each of
// 8 channels' int32 lanes, so lanes are output channels and no horizontal sum
// is needed. A tile is MR tokens x 8*NV channels held in registers.
//
// Exactness: per step a lane gains at most 2 * 32767 * 127 < 2^23, so 256
// steps (512 k) fit int32; then the lanes are added into int64. The dot
// product is exact in any order, and the epilogue is the shared
// linear_epilogue, so the bits equal linear_generic's.
#include <immintrin.h>

#include <cstring>

#include "avx2.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kPairBlock = 256;  // pairs per int32 accumulation block
constexpr int64_t kTokChunk = 96;    // tokens per L2 block of activations

inline __m256i bcast_pair(const int16_t* a, int64_t p, int64_t K) {
  if (2 * p + 1 < K) {
    int32_t v;
    std::memcpy(&v, a + 2 * p, 4);
    return _mm256_set1_epi32(v);
  }
  return _mm256_set1_epi32((int32_t)(uint16_t)a[2 * p]);  // odd K: (a[K-1], 0)
}

inline __m256i wvec(const int8_t* g, int64_t p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(g + 16 * p)));
}

inline void add_lanes(__m256i v, int64_t* acc8) {
  alignas(32) int32_t l[8];
  _mm256_store_si256((__m256i*)l, v);
  for (int i = 0; i < 8; ++i) acc8[i] += l[i];
}

// acc [MR][8*NV] int64 = exact dots of MR activation rows (stride lda) with
// NV packed 8-channel groups (each Kp*16 bytes apart).
template <int MR, int NV>
inline void tile(const int16_t* a, int64_t lda, int64_t K, const int8_t* wg, int64_t Kp, int64_t* acc) {
  for (int i = 0; i < MR * 8 * NV; ++i) acc[i] = 0;
  for (int64_t p0 = 0; p0 < Kp; p0 += kPairBlock) {
    const int64_t p1 = p0 + kPairBlock < Kp ? p0 + kPairBlock : Kp;
    __m256i s[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) s[r][v] = _mm256_setzero_si256();
    for (int64_t p = p0; p < p1; ++p) {
      __m256i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = wvec(wg + v * Kp * 16, p);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = bcast_pair(a + r * lda, p, K);
        for (int v = 0; v < NV; ++v) s[r][v] = _mm256_add_epi32(s[r][v], _mm256_madd_epi16(x, w[v]));
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) add_lanes(s[r][v], acc + (r * NV + v) * 8);
  }
}

template <int MR, int NV>
inline void run_tile(const int16_t* q, const int32_t* e, int64_t t, int64_t K, const int8_t* wp, int64_t Kp,
                     const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                     int64_t* out, int64_t ldo) {
  int64_t acc[MR * 8 * NV];
  tile<MR, NV>(q + t * K, K, K, wp + (j / 8) * Kp * 16, Kp, acc);
  store_tile<MR, 8 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
}

// All tokens [t0, t1) against channels [j, j + 8*NV).
template <int NV>
inline void tokens(const int16_t* q, const int32_t* e, int64_t t0, int64_t t1, int64_t K, const int8_t* wp,
                   int64_t Kp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                   int64_t* out, int64_t ldo) {
  constexpr int MR = 12 / NV;  // 12 accumulators + NV weights + 1 broadcast <= 16 registers
  int64_t t = t0;
  for (; t + MR <= t1; t += MR) run_tile<MR, NV>(q, e, t, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
  // The tail tile by hand rather than tiles.h's token_tiles: an A/B of the
  // lambda form here looked slower but was within this machine's noise, so
  // the kernel the README measured stays as it was.
  switch (t1 - t) {  // MR - 1 at most
#define INTDET_TAIL(R) \
  case R:              \
    if constexpr (R < MR) run_tile<R, NV>(q, e, t, K, wp, Kp, mant, shift, bias, j, N, out, ldo); \
    break;
    INTDET_TAIL(1) INTDET_TAIL(2) INTDET_TAIL(3) INTDET_TAIL(4) INTDET_TAIL(5)
    INTDET_TAIL(6) INTDET_TAIL(7) INTDET_TAIL(8) INTDET_TAIL(9) INTDET_TAIL(10) INTDET_TAIL(11)
#undef INTDET_TAIL
    default:
      break;
  }
}

}  // namespace

void linear_avx2_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                        const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                        int64_t ldo) {
  const int64_t Kp = (K + 1) / 2;
  if (T <= 2) {
    // Decode: the widest tiles that fit (more independent accumulators).
    int64_t j = 0;
    for (; j + 32 <= N; j += 32) tokens<4>(q, e, 0, T, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    for (; j + 16 <= N; j += 16) tokens<2>(q, e, 0, T, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    for (; j < N; j += 8) tokens<1>(q, e, 0, T, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
    const int64_t t1 = t0 + kTokChunk < T ? t0 + kTokChunk : T;
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) tokens<2>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    for (; j < N; j += 8) tokens<1>(q, e, t0, t1, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
  }
}

}  // namespace intdet
