// The AVX2 set's attention tiles (QkTileFn, PvTileFn; kernels.h): same bits
// as qk_tile_generic and pv_tile_generic (dots are exact in any order).
// Compiled with -mavx2 only; the row kernels and the set's entry are in
// avx2.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "avx2.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {

namespace {

// attn_score on four lanes: shift_round_sat32(raw * mkm, s) with mkm =
// mk * score_mant < 2^31 (vpmuldq: exact signed 32 x 32 -> 64) and every
// s in [1, 62] (the caller checks; then round_shift is (x + 2^(s-1)) >> s,
// the arithmetic shift built from the logical one by the sign-flip identity).
inline __m256i score4(__m128i raw, __m256i mkm, __m256i s) {
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi64x(1);
  const __m256i lim = _mm256_set1_epi64x(kInt32Max), nlim = _mm256_set1_epi64x(-kInt32Max);
  const __m256i x = _mm256_mul_epi32(_mm256_cvtepi32_epi64(raw), mkm);
  const __m256i y = _mm256_add_epi64(x, _mm256_sllv_epi64(one, _mm256_sub_epi64(s, one)));
  const __m256i sg = _mm256_cmpgt_epi64(zero, y);
  __m256i r = _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(y, sg), s), sg);
  r = _mm256_blendv_epi8(r, lim, _mm256_cmpgt_epi64(r, lim));
  return _mm256_blendv_epi8(r, nlim, _mm256_cmpgt_epi64(nlim, r));
}

}  // namespace

namespace {

// a[0..7] (eight rows of eight int32) transposed in place.
inline void transpose8x8_epi32(__m256i* a) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(a[i], a[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(a[i], a[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    a[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// normalize_scale15 on eight lanes a in [0, 2^31): k = max(bitlen(a) - 15, 0)
// as bitlen(a >> 15) by halving (8, 4, 2, 1 bits), m = round_shift(a, k)
// (a + 2^(k-1) < 2^32: the logical shift is exact).
inline void normalize_scale15_x8(__m256i a, __m256i* m, __m256i* k) {
  __m256i t = _mm256_srli_epi32(a, 15), n = _mm256_setzero_si256();
  for (int b : {8, 4, 2, 1}) {
    const __m256i sh = _mm256_and_si256(_mm256_cmpgt_epi32(t, _mm256_set1_epi32((1 << b) - 1)), _mm256_set1_epi32(b));
    n = _mm256_add_epi32(n, sh);
    t = _mm256_srlv_epi32(t, sh);
  }
  n = _mm256_add_epi32(n, t);  // t is 0 or 1
  const __m256i half = _mm256_srli_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(1), n), 1);
  *m = _mm256_srlv_epi32(_mm256_add_epi32(a, half), n);
  *k = n;
}

inline bool all_nonnegative(const int32_t* a, int64_t n, int64_t stride) {
  int32_t o = 0;
  for (int64_t j = 0; j < n; ++j) o |= a[j * stride];
  return o >= 0;
}

inline int32_t hmin_epi32(__m256i v) {
  __m128i x = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_min_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_min_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

inline int32_t hmax_epi32(__m256i v) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_max_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

// The scale split of up to KB keys (attn_score's normalize_scale15 of each
// key's scale, done once per key for every row) and the score epilogue of
// one row's raw dot products: attn_score's arithmetic, four keys per
// vector where every shift is in [1, 62] and mk * score_mant < 2^31.
template <int KB>
struct KeyScales {
  alignas(32) int64_t mk[KB], mkm[KB], ek[KB];
  int64_t ekmin = 0, ekmax = 0;
  bool vec;
  KeyScales(const int32_t* ka, int64_t nk, int64_t sstride, int64_t score_mant) {
    vec = score_mant >= 0 && score_mant <= (1 << 15);  // then mk * score_mant < 2^31 (mk <= 2^15)
    if (!vec || !all_nonnegative(ka, nk, sstride)) {
      for (int64_t j = 0; j < nk; ++j) {
        normalize_scale15(ka[j * sstride], &mk[j], &ek[j]);
        mkm[j] = mk[j] * score_mant;
        ekmin = j ? imin(ekmin, ek[j]) : ek[j];
        ekmax = j ? imax(ekmax, ek[j]) : ek[j];
      }
      return;
    }
    __m256i lo = _mm256_set1_epi32(INT32_MAX), hi = _mm256_set1_epi32(INT32_MIN);
    const __m256i mant = _mm256_set1_epi32((int32_t)score_mant);
    for (int64_t j0 = 0; j0 < nk; j0 += 8) {
      alignas(32) int32_t a[8];  // lanes past nk repeat key j0 (min/max unchanged)
      for (int64_t j = 0; j < 8; ++j) a[j] = ka[(j0 + j < nk ? j0 + j : j0) * sstride];
      __m256i m, k;
      normalize_scale15_x8(_mm256_load_si256((const __m256i*)a), &m, &k);
      lo = _mm256_min_epi32(lo, k);
      hi = _mm256_max_epi32(hi, k);
      const __m256i mm = _mm256_mullo_epi32(m, mant);  // <= 2^30
      for (int h = 0; h < 2; ++h) {  // int64 lanes for score4
        const __m128i mh = h ? _mm256_extracti128_si256(m, 1) : _mm256_castsi256_si128(m);
        const __m128i mmh = h ? _mm256_extracti128_si256(mm, 1) : _mm256_castsi256_si128(mm);
        const __m128i kh = h ? _mm256_extracti128_si256(k, 1) : _mm256_castsi256_si128(k);
        _mm256_store_si256((__m256i*)(mk + j0 + 4 * h), _mm256_cvtepi32_epi64(mh));
        _mm256_store_si256((__m256i*)(mkm + j0 + 4 * h), _mm256_cvtepi32_epi64(mmh));
        _mm256_store_si256((__m256i*)(ek + j0 + 4 * h), _mm256_cvtepi32_epi64(kh));
      }
    }
    ekmin = hmin_epi32(lo);
    ekmax = hmax_epi32(hi);
  }
  // zr[j] = attn_score(raw[j], ...) for j < nk (nk >= 1), with s0 = score_shift - e_q.
  void score(const int32_t* raw, int64_t nk, int64_t s0, int64_t score_mant, int64_t* zr) const {
    int64_t j = 0;
    if (vec && s0 - ekmax >= 1 && s0 - ekmin <= 62) {
      const __m256i sv = _mm256_set1_epi64x(s0);
      for (; j + 4 <= nk; j += 4)
        _mm256_storeu_si256((__m256i*)(zr + j),
                            score4(_mm_loadu_si128((const __m128i*)(raw + j)), _mm256_load_si256((const __m256i*)(mkm + j)),
                                   _mm256_sub_epi64(sv, _mm256_load_si256((const __m256i*)(ek + j)))));
    }
    for (; j < nk; ++j) zr[j] = shift_round_sat32((int64_t)raw[j] * mk[j] * score_mant, s0 - ek[j]);
  }
};

// One block of up to 8 * NV keys (qk_tile_avx2): the keys widened to int16
// and transposed into kt [D/2 pairs][8 * NV keys] of int32 pairs (k[2p],
// k[2p+1]), keys past nk zero; then each row's scores are NV vectors of
// eight keys, one vpmaddwd per pair and vector with the row's broadcast
// query pair (keys are the lanes: no horizontal sums).
template <int NV>
void qk_block(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t nk,
              int64_t stride, int64_t sstride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z,
              int64_t ldz, int32_t* kt) {
  constexpr int KB = 8 * NV;
  const int64_t np = D / 2;
  for (int64_t t0 = 0; t0 < KB; t0 += 8) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {  // 8 keys x 8 pairs per transpose
      __m256i a[8];
      for (int j = 0; j < 8; ++j)
        a[j] = t0 + j < nk ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(kc + (t0 + j) * stride + d0)))
                           : _mm256_setzero_si256();
      // row j held key j's pairs 0..7 in its lanes: now row i holds pair i of keys 0..7
      transpose8x8_epi32(a);
      for (int i = 0; i < 8; ++i) _mm256_store_si256((__m256i*)(kt + (d0 / 2 + i) * KB + t0), a[i]);
    }
  }
  KeyScales<KB> sc(ka, nk, sstride, score_mant);
  for (int64_t r = 0; r < R; ++r) {
    const int16_t* qr = q + r * D;
    __m256i acc[NV];
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_si256();
    for (int64_t p = 0; p < np; ++p) {
      int32_t pair;  // q[2p] low, q[2p + 1] high (little endian), as kt's pairs
      std::memcpy(&pair, qr + 2 * p, 4);
      const __m256i b = _mm256_set1_epi32(pair);
      const int32_t* kp = kt + p * KB;
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm256_add_epi32(acc[v], _mm256_madd_epi16(b, _mm256_load_si256((const __m256i*)(kp + 8 * v))));
    }
    alignas(32) int32_t raw[KB];
    for (int v = 0; v < NV; ++v) _mm256_store_si256((__m256i*)(raw + 8 * v), acc[v]);
    sc.score(raw, nk, score_shift - e_q[r], score_mant, z + r * ldz);
  }
}

constexpr int64_t kPrefetchKeys = 16;

// Up to 8 keys' dot products with each of R rows (R <= 4: a decode row's
// query heads), for few rows: each key is widened once and multiplied with
// every row's query in place (4 vpmaddwd per 64 dims), and each row's eight
// per-key vectors are summed horizontally (vphaddd tree), so no block of
// keys is transposed (qk_block's cost per key, shared by only R rows).
// raw [R][8]; keys past nk are not read and their sums are not used.
template <int R, int NC>
inline void qk_few_rows(const int16_t* q, const int8_t* kc, int64_t nk, int64_t stride, int32_t* raw) {
  constexpr int64_t D = 16 * NC;
  __m256i h[R][4];  // h[r][j/2]: keys j, j+1 of row r, pairwise summed (vphaddd)
  for (int64_t j = 0; j < 8; j += 2) {
    __m256i a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_si256();
    const int8_t* k0 = kc + (j < nk ? j : 0) * stride;  // keys past nk: any key, sums unused
    const int8_t* k1 = kc + (j + 1 < nk ? j + 1 : 0) * stride;
    // A decode step reads every row's cache once, from DRAM: ask for the
    // keys kPrefetchKeys ahead (a prefetch past the end is harmless).
    for (int64_t d = 0; d < D; d += 64) {
      _mm_prefetch((const char*)(kc + (j + kPrefetchKeys) * stride + d), _MM_HINT_T0);
      _mm_prefetch((const char*)(kc + (j + 1 + kPrefetchKeys) * stride + d), _MM_HINT_T0);
    }
    for (int64_t d = 0; d < D; d += 16) {  // unrolled: NC is a constant
      const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k0 + d)));
      const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k1 + d)));
      for (int r = 0; r < R; ++r) {
        const __m256i qv = _mm256_loadu_si256((const __m256i*)(q + r * D + d));
        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(qv, x));
        b[r] = _mm256_add_epi32(b[r], _mm256_madd_epi16(qv, y));
      }
    }
    for (int r = 0; r < R; ++r) h[r][j / 2] = _mm256_hadd_epi32(a[r], b[r]);
  }
  for (int r = 0; r < R; ++r) {
    // lanes of lo: keys 0-3's halves (low 128: dims 0-3 of each 8, high: 4-7); hi: keys 4-7's
    const __m256i lo = _mm256_hadd_epi32(h[r][0], h[r][1]), hi = _mm256_hadd_epi32(h[r][2], h[r][3]);
    const __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
    _mm256_storeu_si256((__m256i*)(raw + 8 * r), s);
  }
}

template <int R, int NC>
void qk_tile_few_rows(const int16_t* q, const int32_t* e_q, const int8_t* kc, const int32_t* ka, int64_t n,
                      int64_t stride, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  const int64_t sstride = stride / (16 * NC);
  for (int64_t t = 0; t < n; t += 8) {
    const int64_t nk = n - t < 8 ? n - t : 8;
    alignas(32) int32_t raw[R * 8];
    qk_few_rows<R, NC>(q, kc + t * stride, nk, stride, raw);
    KeyScales<8> sc(ka + t * sstride, nk, sstride, score_mant);
    for (int r = 0; r < R; ++r) sc.score(raw + 8 * r, nk, score_shift - e_q[r], score_mant, z + r * ldz + t);
  }
}

}  // namespace

// Attention tiles (QkTileFn, kernels.h; same bits as qk_tile_generic).
// Blocks of 64 keys (32 at D > 128, so the block stays 16 KB in L1) are
// widened and transposed once, then every row's scores come eight keys per
// vector (qk_block). |q . k| < 2^31 (D <= 256), so int32 wrap-around in
// partial sums cannot change the value. The key's scale split (attn_score)
// is done once per key. The scalar epilogue (shift_round_sat32 of
// raw * mk * score_mant) is attn_score's own arithmetic.
void qk_tile_avx2(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                  int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  if (D % 16) {
    qk_tile_generic(q, e_q, R, kc, ka, n, stride, D, score_mant, score_shift, z, ldz);
    return;
  }
  // Few rows (a decode row's query heads) at the usual head sizes: no transpose.
  if (R >= 1 && R <= 4 && (D == 64 || D == 128 || D == 256)) {
    using Fn = void (*)(const int16_t*, const int32_t*, const int8_t*, const int32_t*, int64_t, int64_t, int64_t,
                        int64_t, int64_t*, int64_t);
    static constexpr Fn kFew[3][4] = {
        {qk_tile_few_rows<1, 4>, qk_tile_few_rows<2, 4>, qk_tile_few_rows<3, 4>, qk_tile_few_rows<4, 4>},
        {qk_tile_few_rows<1, 8>, qk_tile_few_rows<2, 8>, qk_tile_few_rows<3, 8>, qk_tile_few_rows<4, 8>},
        {qk_tile_few_rows<1, 16>, qk_tile_few_rows<2, 16>, qk_tile_few_rows<3, 16>, qk_tile_few_rows<4, 16>}};
    return kFew[D == 64 ? 0 : D == 128 ? 1 : 2][R - 1](q, e_q, kc, ka, n, stride, score_mant, score_shift, z, ldz);
  }
  const int64_t sstride = stride / D;
  alignas(32) int32_t kt[128 * 64];  // [D/2 <= 128 pairs][block keys], 16 KB used at most
  const int64_t kb = D > 128 ? 32 : 64;
  for (int64_t t = 0; t < n; t += kb) {
    const int64_t nk = n - t < kb ? n - t : kb;
    if (kb == 64)
      qk_block<8>(q, e_q, R, kc + t * stride, ka + t * sstride, nk, stride, sstride, D, score_mant, score_shift, z + t,
                  ldz, kt);
    else
      qk_block<4>(q, e_q, R, kc + t * stride, ka + t * sstride, nk, stride, sstride, D, score_mant, score_shift, z + t,
                  ldz, kt);
  }
}

namespace {

// Adds a 16-dim chunk's int32 P.V sums to out [16] int64: lo holds dims
// 0-3 | 8-11, hi 4-7 | 12-15 (the unpacklo / unpackhi pairing of two positions).
inline void add_chunk_i64(__m256i lo, __m256i hi, int64_t* out) {
  __m256i* ov = (__m256i*)out;
  _mm256_storeu_si256(ov, _mm256_add_epi64(_mm256_loadu_si256(ov), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(lo))));
  _mm256_storeu_si256(ov + 1, _mm256_add_epi64(_mm256_loadu_si256(ov + 1), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(hi))));
  _mm256_storeu_si256(ov + 2, _mm256_add_epi64(_mm256_loadu_si256(ov + 2), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(lo, 1))));
  _mm256_storeu_si256(ov + 3, _mm256_add_epi64(_mm256_loadu_si256(ov + 3), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(hi, 1))));
}

// One pass of pv_tile_avx2 over 16 * NC dims per block (NC a compile-time
// constant, so the 2 * NC accumulators are named registers, not an array
// on the stack).
template <int NC>
void pv_tile_pass(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out) {
  constexpr int64_t kPairs = 64;
  alignas(32) int16_t vb[kPairs * NC * 32];  // [pair][chunk][lo 16 | hi 16]
  for (int64_t t0 = 0; t0 < n; t0 += 2 * kPairs) {
    const int64_t nk = n - t0 < 2 * kPairs ? n - t0 : 2 * kPairs, np = (nk + 1) / 2, full = nk / 2;
    for (int64_t d0 = 0; d0 < D; d0 += 16 * NC) {
      for (int64_t p = 0; p < np; ++p) {
        const int8_t* v0 = vc + (t0 + 2 * p) * stride + d0;
        const bool two = 2 * p + 1 < nk;
        for (int c = 0; c < NC; ++c) {
          const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v0 + 16 * c)));
          const __m256i b = two ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v0 + stride + 16 * c)))
                                : _mm256_setzero_si256();
          int16_t* dst = vb + (p * NC + c) * 32;
          _mm256_store_si256((__m256i*)dst, _mm256_unpacklo_epi16(a, b));
          _mm256_store_si256((__m256i*)(dst + 16), _mm256_unpackhi_epi16(a, b));
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const int16_t* w = w16 + r * ldw + t0;
        // chunk c: lo d = 16c + {0-3, 8-11}, hi 16c + {4-7, 12-15}
        __m256i l0 = _mm256_setzero_si256(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
        auto step = [&](int64_t p, __m256i wp) {
          const int16_t* src = vb + p * NC * 32;
          l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)src), wp));
          h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 16)), wp));
          if constexpr (NC == 4) {
            l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 32)), wp));
            h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 48)), wp));
            l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 64)), wp));
            h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 80)), wp));
            l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 96)), wp));
            h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(src + 112)), wp));
          }
        };
        for (int64_t p = 0; p < full; ++p) {
          int32_t pair;  // w[2p] in the low 16 bits, w[2p + 1] in the high (little endian)
          std::memcpy(&pair, w + 2 * p, 4);
          step(p, _mm256_set1_epi32(pair));
        }
        if (full < np) step(full, _mm256_set1_epi32((int32_t)(uint16_t)w[2 * full]));
        const __m256i acc[8] = {l0, h0, l1, h1, l2, h2, l3, h3};
        for (int c = 0; c < NC; ++c) add_chunk_i64(acc[2 * c], acc[2 * c + 1], out + r * D + d0 + 16 * c);
      }
    }
  }
}

// P . V for few rows (R <= 4, a decode row's query heads), 16 dims at a
// time: each pair of positions' values is widened and interleaved once in
// registers and multiplied with every row's weight pair, so nothing goes
// through a block buffer (pv_tile_pass's cost per position, shared by only
// R rows). Same int32 bound per block of 128 positions as pv_tile_pass.
template <int R>
void pv_few_rows(const int16_t* w16, int64_t ldw, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                 int64_t* out) {
  constexpr int64_t kBlock = 128;
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    const int64_t nk = n - t0 < kBlock ? n - t0 : kBlock, full = nk / 2;
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m256i lo[R], hi[R];  // lo: d0 + {0-3, 8-11}, hi: d0 + {4-7, 12-15}
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
      auto step = [&](__m256i a, __m256i b, int64_t t, bool two) {
        const __m256i x = _mm256_unpacklo_epi16(a, b), y = _mm256_unpackhi_epi16(a, b);
        for (int r = 0; r < R; ++r) {
          const int16_t* w = w16 + r * ldw + t0 + t;
          int32_t pair;  // w[t] low, w[t + 1] high (little endian)
          if (two)
            std::memcpy(&pair, w, 4);
          else
            pair = (int32_t)(uint16_t)w[0];
          const __m256i wp = _mm256_set1_epi32(pair);
          lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(x, wp));
          hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(y, wp));
        }
      };
      const int8_t* v = vc + t0 * stride + d0;
      const bool new_line = d0 % 64 == 0;  // later chunks of a line find it in L1
      for (int64_t p = 0; p < full; ++p, v += 2 * stride) {
        if (new_line) {
          _mm_prefetch((const char*)(v + kPrefetchKeys * stride), _MM_HINT_T0);
          _mm_prefetch((const char*)(v + (kPrefetchKeys + 1) * stride), _MM_HINT_T0);
        }
        step(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)v)),
             _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v + stride))), 2 * p, true);
      }
      if (nk % 2)
        step(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)v)), _mm256_setzero_si256(), 2 * full, false);
      for (int r = 0; r < R; ++r) add_chunk_i64(lo[r], hi[r], out + r * D + d0);
    }
  }
}

}  // namespace

// P . V tiles (PvTileFn; same bits as pv_tile_generic): a block of 128
// positions' values over 64 (else 16) dims is widened and interleaved in
// pairs once into L1, then every row adds it with its int16 weights paired
// in each 32-bit lane (vpmaddwd). int32 lanes gain at most 128 products
// |w16 * v| <= 32767 * 127 per block (< 2^31), then go to int64. Up to 4
// rows (decode) skip the buffer (pv_few_rows).
void pv_tile_avx2(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out) {
  if (D % 16)
    pv_tile_generic(w16, ldw, R, vc, n, stride, D, out);
  else if (R >= 1 && R <= 4) {
    using Fn = void (*)(const int16_t*, int64_t, const int8_t*, int64_t, int64_t, int64_t, int64_t*);
    static constexpr Fn kFew[4] = {pv_few_rows<1>, pv_few_rows<2>, pv_few_rows<3>, pv_few_rows<4>};
    kFew[R - 1](w16, ldw, vc, n, stride, D, out);
  } else if (D % 64 == 0)
    pv_tile_pass<4>(w16, ldw, R, vc, n, stride, D, out);
  else
    pv_tile_pass<1>(w16, ldw, R, vc, n, stride, D, out);
}

}  // namespace intdet
