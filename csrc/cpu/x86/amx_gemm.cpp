// The AMX kernel set's int8 linear layer on the q16 layout (kPackQ16,
// kernels.h), and the set's entry. Compiled with the AVX-512 set's flags and
// -mamx-tile -mamx-int8, or in the SIMDe test build against SIMDe and the
// tile emulation of amx_intrin.h.
//
// Prefill and batched decode (T >= kAmxMinRows), AMX tiles: an int16 activation splits exactly as
// x = 256 * hi + lo, hi = x >> 8 in [-128, 127] (signed int8), lo = x & 255 in
// [0, 255] (unsigned int8): the forward makes both planes once per activation
// matrix (ActPlanes, split_row_amx). Per 16 rows and 32 output channels,
// TDPBSSD (hi x w, signed x signed) and TDPBUSD (lo x w, unsigned x signed)
// accumulate int32 tiles over K blocks of at most kAmxKBlock inputs; then
// dot = 256 * hi_sum + lo_sum in int64.
// Exactness: |hi * w| <= 128 * 128 = 2^14 and |lo * w| <= 255 * 128 < 2^15,
// so over kAmxKBlock = 2^15 inputs |hi_sum| <= 2^29 and |lo_sum| < 2^30:
// no int32 lane wraps. The int64 dot is the exact sum, and the epilogue is the
// shared linear_epilogue (tiles.h), so the bits equal linear_generic's.
//
// Decode and few rows (T < kAmxMinRows), AVX-512 VNNI on the same
// weights: the 32 bytes of 8 channels' quad p widen to 32 int16 lanes, int32
// lane L = (channel L / 2, inputs 4p + 2 (L % 2) + {0, 1}); vpdpwssd with the
// quad's four activations broadcast as one 64-bit element adds 2 products
// (|.| <= 2 * 32767 * 128 < 2^23) to each lane, so kQuadBlock = 256 quads stay
// below 2^31; each block's lane pairs are then added as int64: 8 channels per
// vector.
#include <algorithm>
#include <cstring>

#include "amx.h"
#include "amx_intrin.h"
#include "avx2.h"
#include "avx512.h"
#include "epilogue512.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "tiles.h"

namespace intdet {
namespace {

constexpr int64_t kAmxKBlock = 32768;  // inputs per int32 tile accumulation (bound above)
constexpr int64_t kQuadBlock = 256;    // quads per int32 VNNI accumulation block

inline int64_t padded_k(int64_t K) { return (K + 63) / 64 * 64; }

// ---- AVX-512 VNNI on q16 ----

// The four activations of quad p broadcast to every 64-bit element (the
// last quad of a row whose K is not a multiple of 4: zeros past K).
inline __m512i bcast_quad(const int16_t* a, int64_t p, int64_t K) {
  int64_t v = 0;
  if (4 * p + 4 <= K) {
    std::memcpy(&v, a + 4 * p, 8);
  } else {
    int16_t t[4] = {0, 0, 0, 0};
    for (int64_t k = 4 * p; k < K; ++k) t[k - 4 * p] = a[k];
    std::memcpy(&v, t, 8);
  }
  return _mm512_set1_epi64(v);
}

// acc8 [8] int64 += the 8 channel sums of v (int32 lanes 2c and 2c + 1,
// widened to int64 first): per 128-bit lane, unpacklo/hi pair lanes
// (0, 1) of the low half with (8, 9) of the high half, so the sums come in
// channel order 0 4 1 5 2 6 3 7, which one permute undoes.
inline void add_pairs(__m512i v, int64_t* acc8) {
  const __m512i a = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));         // lanes 0-7
  const __m512i b = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));   // lanes 8-15
  const __m512i s = _mm512_add_epi64(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
  const __m512i c = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), s);
  _mm512_storeu_si512((void*)acc8, _mm512_add_epi64(_mm512_loadu_si512((const void*)acc8), c));
}

// acc [MR][16*NG] int64 = exact dots of MR activation rows (stride lda, K
// inputs) with the NG 16-channel groups starting at g0 of wp (group stride
// 16*Kq bytes); KS interleaved accumulator sets.
template <int MR, int NG, int KS>
inline void q16_tile(const int16_t* a, int64_t lda, int64_t K, const int8_t* wp, int64_t Kq, int64_t g0,
                     int64_t* acc) {
  constexpr int NV = 2 * NG;  // vectors of 8 channels
  for (int i = 0; i < MR * 16 * NG; ++i) acc[i] = 0;
  const int8_t* gv[NV];
  for (int v = 0; v < NV; ++v) gv[v] = wp + (g0 + v / 2) * 16 * Kq + 32 * (v % 2);
  const int64_t Q = (K + 3) / 4, Qf = K / 4;  // quads holding inputs; whole quads
  for (int64_t p0 = 0; p0 < Q; p0 += kQuadBlock) {
    const int64_t p1 = std::min(Q, p0 + kQuadBlock), pf = std::min(p1, Qf);
    __m512i s[KS][MR][NV];
    for (int k = 0; k < KS; ++k)
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) s[k][r][v] = _mm512_setzero_si512();
    int64_t p = p0;
    for (; p + KS <= pf; p += KS)
      for (int k = 0; k < KS; ++k) {
        __m512i w[NV];
        for (int v = 0; v < NV; ++v)
          w[v] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(gv[v] + 64 * (p + k))));
        for (int r = 0; r < MR; ++r) {
          int64_t x;
          std::memcpy(&x, a + r * lda + 4 * (p + k), 8);
          const __m512i xb = _mm512_set1_epi64(x);
          for (int v = 0; v < NV; ++v) s[k][r][v] = _mm512_dpwssd_epi32(s[k][r][v], xb, w[v]);
        }
      }
    for (; p < p1; ++p) {  // what KS leaves, and a partial last quad
      __m512i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(gv[v] + 64 * p)));
      for (int r = 0; r < MR; ++r) {
        const __m512i xb = bcast_quad(a + r * lda, p, K);
        for (int v = 0; v < NV; ++v) s[0][r][v] = _mm512_dpwssd_epi32(s[0][r][v], xb, w[v]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) {
        __m512i t = s[0][r][v];
        for (int k = 1; k < KS; ++k) t = _mm512_add_epi32(t, s[k][r][v]);  // one block's sum: < 2^31
        add_pairs(t, acc + r * 16 * NG + 8 * v);
      }
  }
}

template <int MR, int NG, int KS>
inline void q16_tokens(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp, int64_t Kq,
                       const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t g0, int64_t N,
                       int64_t* out, int64_t ldo) {
  token_tiles<MR>(0, T, [&](auto R, int64_t t) {
    alignas(64) int64_t acc[R * 16 * NG];
    q16_tile<R, NG, KS>(q + t * K, K, K, wp, Kq, g0, acc);
    store_tile8<R, 16 * NG>(acc, e, t, mant, shift, bias, 16 * g0, N, out, ldo);
  });
}

// Groups [0, G) in tiles of NG groups, the last tile narrower.
template <int MR, int NG, int KS>
inline void q16_groups(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                       const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                       int64_t ldo) {
  const int64_t Kq = padded_k(K), G = (N + 15) / 16;
  int64_t g = 0;
  for (; g + NG <= G; g += NG) q16_tokens<MR, NG, KS>(q, e, T, K, wp, Kq, mant, shift, bias, g, N, out, ldo);
  if constexpr (NG > 1) {  // fewer than NG groups left: 2 then 1
    if constexpr (NG > 2)
      if (G - g >= 2) {
        q16_tokens<MR, 2, KS>(q, e, T, K, wp, Kq, mant, shift, bias, g, N, out, ldo);
        g += 2;
      }
    if (G - g == 1) q16_tokens<MR, 1, KS>(q, e, T, K, wp, Kq, mant, shift, bias, g, N, out, ldo);
  }
}

// ---- AMX tiles on the planes ----

// Tiles 0-3: int32 sums (hi x group a, lo x group a, hi x group b, lo x
// group b); 4, 5: the hi and lo rows; 6, 7: groups a and b. All 16 x 64 bytes.
AmxTileConfig full_tiles() {
  AmxTileConfig c{};
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

// The 16 x 16 int32 sums of tiles 0-3 (group b's only if TWO) in memory.
template <bool TWO>
inline void store_sums(int32_t (*c)[16][16]) {
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  if constexpr (TWO) {
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
  }
}

// 256 * hi + lo for 8 channels (half `half` of group h) of row r, as int64.
inline __m512i dot8(const int32_t (*c)[16][16], int h, int r, int half) {
  const __m512i hh = _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)(c[2 * h][r] + 8 * half)));
  const __m512i ll = _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)(c[2 * h + 1][r] + 8 * half)));
  return _mm512_add_epi64(_mm512_slli_epi64(hh, 8), ll);
}

// Rows [t, t + rows) x channels [j, j + 32) (of which those below N exist)
// from the AMX planes: tiles over K blocks of kAmxKBlock inputs, int64 sums
// kept in acc between blocks, then the epilogue straight from the last
// block's tiles, 8 channels at a time (epilogue8), or per channel where the
// vector form does not cover the case or the block is partial.
template <bool TWO>
inline void amx_block(const int8_t* hi, const uint8_t* lo, int64_t ld, int64_t t, int rows, const int8_t* wp,
                      int64_t Kq, int64_t j, const int32_t* e, const int32_t* mant, const int32_t* shift,
                      const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  alignas(64) int32_t c[4][16][16];
  alignas(64) int64_t acc[16][32];
  const int8_t* ha = hi + t * ld;
  const uint8_t* la = lo + t * ld;
  const int8_t* wa = wp + j * Kq;
  const int8_t* wb = wa + 16 * Kq;
  const bool multi = Kq > kAmxKBlock;
  for (int64_t k0 = 0; k0 < Kq; k0 += kAmxKBlock) {
    const int64_t k1 = std::min(Kq, k0 + kAmxKBlock);
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (TWO) {
      _tile_zero(2);
      _tile_zero(3);
    }
    // Each load just before its first use (the lo rows last): 10% faster
    // than all loads first, on a Sapphire Rapids-class Xeon.
    for (int64_t k = k0; k < k1; k += 64) {
      _tile_loadd(4, ha + k, ld);
      _tile_loadd(6, wa + 16 * k, 64);  // quads k/4 .. k/4 + 15 of group a
      _tile_dpbssd(0, 4, 6);
      if constexpr (TWO) {
        _tile_loadd(7, wb + 16 * k, 64);
        _tile_dpbssd(2, 4, 7);
      }
      _tile_loadd(5, la + k, ld);
      _tile_dpbusd(1, 5, 6);
      if constexpr (TWO) _tile_dpbusd(3, 5, 7);
    }
    store_sums<TWO>(c);
    if (multi) {  // more than one block: int64 sums across them
      for (int r = 0; r < 16; ++r)
        for (int h = 0; h < (TWO ? 2 : 1); ++h)
          for (int half = 0; half < 2; ++half) {
            int64_t* a = acc[r] + 16 * h + 8 * half;
            const __m512i prev = k0 ? _mm512_load_si512((const void*)a) : _mm512_setzero_si512();
            _mm512_store_si512((void*)a, _mm512_add_epi64(prev, dot8(c, h, r, half)));
          }
    }
  }
  const int64_t nc = std::min<int64_t>(N - j, 32);
  for (int q = 0; q < (TWO ? 4 : 2); ++q) {  // 8-channel chunks
    const int64_t c0 = 8 * q;
    if (c0 >= nc) break;
    const bool full = c0 + 8 <= nc;
    Scales8 sc{};
    if (full) sc = load_scales8(mant + j + c0, shift + j + c0);
    for (int r = 0; r < rows; ++r) {
      const __m512i d = multi ? _mm512_load_si512((const void*)(acc[r] + c0)) : dot8(c, q / 2, r, q % 2);
      int64_t* o = out + (t + r) * ldo + j + c0;
      if (full && epilogue8(d, sc, e[t + r], bias ? bias + j + c0 : nullptr, o)) continue;
      alignas(64) int64_t v[8];
      _mm512_store_si512((void*)v, d);
      for (int64_t i = 0; i < std::min<int64_t>(8, nc - c0); ++i)
        o[i] = linear_epilogue(v[i], mant[j + c0 + i], shift[j + c0 + i], e[t + r], bias, j + c0 + i);
    }
  }
}

}  // namespace

void linear_q16_avx512(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                       const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                       int64_t ldo) {
  // 64 channels x 2 rows (16 accumulators, 8 weight vectors) read the weights
  // about as fast as the avx512 set's g8 GEMV with them in DRAM (23 GB/s on
  // one core, 72 copies of 1536 x 576). The forward gives this kernel only
  // T <= 2 (kAmxMinRows); more rows run as pairs (LinearFn takes any T).
  q16_groups<2, 4, 1>(q, e, T, K, wp, mant, shift, bias, N, out, ldo);
}

int64_t amx_planes_ld(int64_t K) { return padded_k(K); }

void split_row_amx(const int16_t* q, int64_t K, int8_t* hi, uint8_t* lo) {
  const int64_t ld = padded_k(K);
  for (int64_t k = 0; k < K; ++k) {
    hi[k] = (int8_t)(q[k] >> 8);  // arithmetic shift (C++20): floor(x / 256)
    lo[k] = (uint8_t)(q[k] & 255);
  }
  for (int64_t k = K; k < ld; ++k) hi[k] = 0, lo[k] = 0;
}

void linear_amx_planes(const int8_t* hi, const uint8_t* lo, int64_t ld, const int32_t* e, int64_t T, int64_t K,
                       const int8_t* wp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                       int64_t* out, int64_t ldo) {
  // The tile configuration is per thread, and this call may run on any
  // pool thread: load it on entry, release the tiles on exit.
  static const AmxTileConfig cfg = full_tiles();
  _tile_loadconfig(&cfg);
  const int64_t Kq = padded_k(K), G = (N + 15) / 16;
  for (int64_t t = 0; t < T; t += 16) {
    const int rows = (int)std::min<int64_t>(16, T - t);
    for (int64_t g = 0; g < G; g += 2) {
      if (g + 1 < G)
        amx_block<true>(hi, lo, ld, t, rows, wp, Kq, 16 * g, e, mant, shift, bias, N, out, ldo);
      else
        amx_block<false>(hi, lo, ld, t, rows, wp, Kq, 16 * g, e, mant, shift, bias, N, out, ldo);
    }
  }
  _tile_release();
}

extern const Kernels kAmxKernels;
constinit const Kernels kAmxKernels{
    .name = "amx",
    .cpu_runs = cpu_has_amx_int8,
    .packing = &kPackQ16,
    .linear = nullptr,
    .linear_packed = linear_q16_avx512,
    .linear_w4 = nullptr,
    .linear_w4_packed = linear_w4_avx512_packed,  // q16 keeps int4 weights in g8
    .qk_tile = qk_tile_avx512,  // as the avx512 set (avx512.cpp)
    .pv_tile = pv_tile_avx512,
    .attn_row = {attn_row_max_avx512, attn_exp_sum_avx512, attn_prob_max_avx512, attn_prob_w16_avx512},
    .softmax = softmax_q16_row_avx512,
    .exp2_row = exp2_neg_q30_row_avx512,
    .quant16 = quant16_row_avx512,
    .rms_norm = rms_norm_row_avx512,
    .add_sat32 = add_sat32_row_avx512,
    .rope = rope_row_avx512,
    .quant8_row = quant8_row_avx512,
    .swiglu = swiglu_row_avx512,
    .geglu = geglu_row_avx512,
    .planes = {.min_rows = kAmxMinRows, .ld = amx_planes_ld, .split_row = split_row_amx, .linear = linear_amx_planes},
};

}  // namespace intdet
