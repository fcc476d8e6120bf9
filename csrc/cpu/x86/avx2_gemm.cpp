// AVX2 linear layer on repacked weights (compiled with -mavx2 only).
//
// Layout (pack_w8x2): output channels in groups of 8, K in pairs; 16 bytes
// hold w[8g + c][2p + i] at byte 2c + i. Widened to int16, one vpmaddwd with
// the broadcast activation pair (a[2p], a[2p+1]) adds 2 products to each of
// 8 channels' int32 lanes, so lanes are output channels and no horizontal sum
// is needed. A tile is R tokens x 8*NV channels held in registers.
//
// The activation pair of row r at step p is one 4-byte broadcast load from
// the row itself (rows 4-byte aligned or not: x86 loads need no alignment);
// an odd K's last pair (a[K-1], 0) is a separate final step, so the inner
// loop has no branch and never reads past a row.
//
// Exactness: per step a lane gains at most 2 * 32767 * 127 < 2^23, so 256
// steps (512 k) fit int32; then the lanes are added into int64. The dot
// product is exact in any order, and the epilogue is the shared
// linear_epilogue, so the bits equal linear_generic's.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "avx2.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kPairBlock = 256;  // pairs per int32 accumulation block
// Tokens per block of rows: 12 rows' activations (14 KB at K = 576) and
// a 16-channel weight strip (9 KB) stay in the 32 KB L1 while the strip's
// tiles (two of 6 rows) run; the next strip then streams from L2. With
// 96-row blocks (110 KB) the activations came from L2 for every strip:
// 12 was ~4% faster (0.99-1.10x, 9 interleaved in-process comparisons on
// this project's Zen 3, N 576..49152, T 256 and 512; same outputs).
constexpr int64_t kTokChunk = 12;
constexpr int kMR = 6;               // most rows per tile: 12 accumulators at NV = 2

// acc8[0..7] += the 8 int32 lanes of v, widened to int64.
inline void add_lanes(__m256i v, int64_t* acc8) {
  __m256i* a = (__m256i*)acc8;
  _mm256_storeu_si256(a, _mm256_add_epi64(_mm256_loadu_si256(a), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v))));
  _mm256_storeu_si256(a + 1, _mm256_add_epi64(_mm256_loadu_si256(a + 1),
                                              _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1))));
}

// Named accumulators a<r><v> for tile rows r < 6 and channel groups v < 4
// (the ones a tile does not use are never touched). The empty volatile asm
// statements keep GCC 12 from hoisting all six broadcasts to the top of the
// step: with them live at once, the 6 x 2 tile's 12 accumulators no longer
// fit the 16 registers and went through the stack every step.
#define INTDET_STEP_ATTR __attribute__((always_inline))
#define INTDET_ACC_ROW(r) __m256i a##r##0 = z, a##r##1 = z, a##r##2 = z, a##r##3 = z;
#define INTDET_MAC(r, v) \
  if constexpr (NV > v) a##r##v = _mm256_add_epi32(a##r##v, _mm256_madd_epi16(b, w##v));
#define INTDET_PIN(r, v) \
  if constexpr (NV > v) asm volatile("" : "+x"(a##r##v));
#define INTDET_ROW_STEP(r)                                              \
  if constexpr (R > r) {                                                \
    __m256i b = bcast(r, p, tail);                                      \
    asm volatile("" : "+x"(b));                                         \
    INTDET_MAC(r, 0) INTDET_MAC(r, 1) INTDET_MAC(r, 2) INTDET_MAC(r, 3) \
    INTDET_PIN(r, 0) INTDET_PIN(r, 1) INTDET_PIN(r, 2) INTDET_PIN(r, 3) \
  }
#define INTDET_FLUSH(r, v) \
  if constexpr (R > r && NV > v) add_lanes(a##r##v, acc + (r * NV + v) * 8);
#define INTDET_FLUSH_ROW(r) INTDET_FLUSH(r, 0) INTDET_FLUSH(r, 1) INTDET_FLUSH(r, 2) INTDET_FLUSH(r, 3)

// acc [R][8*NV] int64 = exact dots of R activation rows (a, stride lda,
// K columns) with NV packed 8-channel groups (each Kp*16 bytes apart);
// R <= 6, NV <= 4.
template <int R, int NV>
inline void tile(const int16_t* a, int64_t lda, int64_t K, const int8_t* wg, int64_t Kp, int64_t* acc) {
  static_assert(R >= 1 && R <= kMR && NV >= 1 && NV <= 4, "tile shape");
  for (int i = 0; i < R * 8 * NV; ++i) acc[i] = 0;
  const int64_t wstride = Kp * 16;
  const __m256i z = _mm256_setzero_si256();
  const int16_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = a + r * lda;
  const int64_t full = K / 2;  // pairs with both halves in the row
  // The broadcast pair (a_r[2p], a_r[2p+1]); at p == full (odd K) (a_r[K-1], 0).
  auto bcast = [&](int r, int64_t p, auto tail) {
    if constexpr (decltype(tail)::value)
      return _mm256_set1_epi32((int32_t)(uint16_t)x[r][K - 1]);
    else
      return _mm256_broadcastd_epi32(_mm_loadu_si32(x[r] + 2 * p));
  };
  for (int64_t p0 = 0; p0 < Kp; p0 += kPairBlock) {
    const int64_t p1 = p0 + kPairBlock < Kp ? p0 + kPairBlock : Kp;
    INTDET_ACC_ROW(0) INTDET_ACC_ROW(1) INTDET_ACC_ROW(2) INTDET_ACC_ROW(3) INTDET_ACC_ROW(4) INTDET_ACC_ROW(5)
    const int8_t* w = wg + p0 * 16;
    // [p0, pe) has whole pairs only; the odd-K pair, if in this block, after it
    const int64_t pe = p1 < full ? p1 : full;
    auto step = [&](int64_t p, const int8_t* w, auto tail) INTDET_STEP_ATTR {
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w));
      __m256i w1 = z, w2 = z, w3 = z;
      if constexpr (NV > 1) w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + wstride)));
      if constexpr (NV > 2) w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + 2 * wstride)));
      if constexpr (NV > 3) w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + 3 * wstride)));
      INTDET_ROW_STEP(0) INTDET_ROW_STEP(1) INTDET_ROW_STEP(2) INTDET_ROW_STEP(3) INTDET_ROW_STEP(4) INTDET_ROW_STEP(5)
    };
    int64_t p = p0;
    for (; p < pe; ++p, w += 16) step(p, w, std::false_type{});
    if (p < p1) step(p, w, std::true_type{});  // p == full: the odd-K pair
    INTDET_FLUSH_ROW(0) INTDET_FLUSH_ROW(1) INTDET_FLUSH_ROW(2) INTDET_FLUSH_ROW(3) INTDET_FLUSH_ROW(4)
    INTDET_FLUSH_ROW(5)
  }
}
#undef INTDET_ACC_ROW
#undef INTDET_STEP_ATTR
#undef INTDET_MAC
#undef INTDET_ROW_STEP
#undef INTDET_PIN
#undef INTDET_FLUSH
#undef INTDET_FLUSH_ROW

template <int R, int NV>
inline void run_tile(const int16_t* q, const int32_t* e, int64_t t, int64_t K, const int8_t* wp, int64_t Kp,
                     const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                     int64_t* out, int64_t ldo) {
  int64_t acc[R * 8 * NV];
  tile<R, NV>(q + t * K, K, K, wp + (j / 8) * Kp * 16, Kp, acc);
  store_tile<R, 8 * NV>(acc, e, t, mant, shift, bias, j, N, out, ldo);
}

// Tiles of a chunk of n rows: as even as possible, at most kMR rows each (8
// rows are 4 + 4, not 6 + 2, so no tile is left with few accumulators).
struct TileRows {
  int64_t count, base, extra;  // tile i has base + (i < extra) rows
  explicit TileRows(int64_t n) : count((n + kMR - 1) / kMR), base(n / count), extra(n % count) {}
  int64_t rows(int64_t i) const { return base + (i < extra ? 1 : 0); }
  int64_t start(int64_t i) const { return i * base + (i < extra ? i : extra); }
};

// Every tile of the rows [t0, t0 + n) (tiles tr) against channels [j, j + 8*NV).
template <int NV>
void rows_channels(const int16_t* q, const TileRows& tr, const int32_t* e, int64_t t0, int64_t K, const int8_t* wp,
                   int64_t Kp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t j, int64_t N,
                   int64_t* out, int64_t ldo) {
  for (int64_t i = 0; i < tr.count; ++i) {
    const int64_t t = t0 + tr.start(i);
    switch (tr.rows(i)) {
#define INTDET_ROWS(R) \
  case R:              \
    run_tile<R, NV>(q, e, t, K, wp, Kp, mant, shift, bias, j, N, out, ldo); \
    break;
      INTDET_ROWS(1) INTDET_ROWS(2) INTDET_ROWS(3) INTDET_ROWS(4) INTDET_ROWS(5) INTDET_ROWS(6)
#undef INTDET_ROWS
      default:
        break;
    }
  }
}

}  // namespace

void linear_avx2_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                        const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                        int64_t ldo) {
  const int64_t Kp = (K + 1) / 2;
  if (T <= 2) {
    // Decode: the widest tiles that fit (more independent accumulators and
    // weight streams in flight).
    int64_t j = 0;
    if (T == 1) {
      for (; j + 32 <= N; j += 32) run_tile<1, 4>(q, e, 0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
      for (; j < N; j += 8) run_tile<1, 1>(q, e, 0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    } else {
      for (; j + 32 <= N; j += 32) run_tile<2, 4>(q, e, 0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
      for (; j < N; j += 8) run_tile<2, 1>(q, e, 0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    }
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
    const int64_t t1 = t0 + kTokChunk < T ? t0 + kTokChunk : T;
    const TileRows tr(t1 - t0);
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) rows_channels<2>(q, tr, e, t0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
    for (; j < N; j += 8) rows_channels<1>(q, tr, e, t0, K, wp, Kp, mant, shift, bias, j, N, out, ldo);
  }
}

}  // namespace intdet
