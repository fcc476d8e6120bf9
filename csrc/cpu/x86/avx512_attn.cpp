// The AVX-512 sets' attention scores (QkTileFn, kernels.h): same bits as
// qk_tile_generic. Compiled with the avx512 set's flags, or against SIMDe in
// the test build (avx512_intrin.h).
//
// VNNI's byte product vpdpbusd multiplies unsigned by signed bytes, four
// per int32 lane. The int8 keys are biased to unsigned k' = k + 128; each
// query row's int16 q splits once per call into signed bytes as
// q = 256 * h + l + 128 with h = q >> 8 and l = (q & 255) - 128, so
//   q . k = q . k' - 128 * sum q
//         = 256 * (h . k') + l . k' + 128 * sum k' - 128 * sum q,
// where sum k' (per key) is one more vpdpbusd against bytes of 1 and sum q
// is per row. Every term is computed modulo 2^32 (vpdpbusd, shifts and adds
// wrap) and the true q . k lies in int32 (|q . k| <= 2^15 * 127 * 256 <
// 2^31), so the int32 result is exact. 16 keys x 64 bytes are loaded as 16
// vectors and transposed (16 x 16 int32: lane j of vector i = dims 4i..4i+3
// of key j), so each vpdpbusd with a row's 4 bytes (broadcast from memory)
// adds to 16 keys' dots at once: no horizontal sums, and the transpose is
// shared by every row. The score epilogue (attn_score) runs on 8 int64 lanes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx512_intrin.h"
#include "intdet/intmath.h"
#include "intdet/ops.h"
#include "avx2.h"
#include "avx512.h"

namespace intdet {
namespace {

// a[0..15] (16 rows of 16 int32) transposed in place: 4 x 4 transposes
// inside each 128-bit lane, then the 128-bit blocks.
__attribute__((always_inline)) inline void transpose16x16_epi32(__m512i* a) {
  __m512i u[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512i t0 = _mm512_unpacklo_epi32(a[4 * g], a[4 * g + 1]), t1 = _mm512_unpackhi_epi32(a[4 * g], a[4 * g + 1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[4 * g + 2], a[4 * g + 3]);
    const __m512i t3 = _mm512_unpackhi_epi32(a[4 * g + 2], a[4 * g + 3]);
    // u[4g + k], lane L: element 4L + k of rows 4g .. 4g + 3
    u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // column 4L + k: lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    a[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    a[4 + k] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    a[8 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    a[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

inline __m512i bcast4(const int8_t* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return _mm512_set1_epi32(x);
}

constexpr int64_t kKeys = 16;  // keys per block: the int32 lanes
constexpr int kRowGroup = 4;   // rows per pass over a block's vectors

// The scale split of a block's keys (attn_score's normalize_scale15, once
// per key for every row) and the score epilogue of one row's 16 raw dots on
// 8 int64 lanes, where every shift is in [1, 62] and mk * score_mant < 2^31
// (else the scalar arithmetic of attn_score, the same integers).
struct Scales16 {
  alignas(64) int64_t mk[kKeys], ek[kKeys];
  __m512i mkm[2], ekv[2];  // keys 0-7 and 8-15, int64 lanes
  int32_t ekmin = 0, ekmax = 0;
  bool vec;
  int64_t score_mant;
  Scales16(const int32_t* ka, int64_t nk, int64_t sstride, int64_t score_mant_) : score_mant(score_mant_) {
    alignas(64) int32_t a[kKeys];  // lanes past nk repeat key 0 (min / max unchanged)
    __m512i av;
    if (sstride == 1 && nk == kKeys) {
      av = _mm512_loadu_si512((const void*)ka);
    } else {
      for (int64_t j = 0; j < kKeys; ++j) a[j] = ka[(j < nk ? j : 0) * sstride];
      av = _mm512_load_si512((const void*)a);
    }
    vec = score_mant >= 0 && score_mant <= (1 << 15) &&  // then mk * score_mant <= 2^30
          _mm512_cmpgt_epi32_mask(_mm512_setzero_si512(), av) == 0;
    if (!vec) {
      _mm512_store_si512((void*)a, av);
      for (int64_t j = 0; j < nk; ++j) normalize_scale15(a[j], &mk[j], &ek[j]);
      return;
    }
    // k = max(bitlen(a) - 15, 0) as bitlen(a >> 15) by halving, m = round_shift(a, k)
    __m512i t = _mm512_srli_epi32(av, 15), k = _mm512_setzero_si512();
    const auto halve = [&](int b) {
      const __m512i sh = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(t, _mm512_set1_epi32((1 << b) - 1)),
                                                _mm512_set1_epi32(b));
      k = _mm512_add_epi32(k, sh);
      t = _mm512_srlv_epi32(t, sh);
    };
    halve(8);
    halve(4);
    halve(2);
    halve(1);
    k = _mm512_add_epi32(k, t);  // t is 0 or 1
    const __m512i half = _mm512_srli_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(1), k), 1);
    const __m512i m = _mm512_srlv_epi32(_mm512_add_epi32(av, half), k);  // a + half < 2^32: logical shift exact
    const __m512i mm = _mm512_mullo_epi32(m, _mm512_set1_epi32((int32_t)score_mant));
    ekmin = _mm512_reduce_min_epi32(k);
    ekmax = _mm512_reduce_max_epi32(k);
    for (int h = 0; h < 2; ++h) {
      mkm[h] = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(mm, 1) : _mm512_castsi512_si256(mm));
      ekv[h] = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(k, 1) : _mm512_castsi512_si256(k));
      _mm512_store_si512((void*)(mk + 8 * h),
                         _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(m, 1) : _mm512_castsi512_si256(m)));
      _mm512_store_si512((void*)(ek + 8 * h), ekv[h]);
    }
  }
  // zr[j] = attn_score(raw[j], ...) for j < nk, with s0 = score_shift - e_q.
  void score(const int32_t* raw, int64_t nk, int64_t s0, int64_t* zr) const {
    if (vec && s0 - ekmax >= 1 && s0 - ekmin <= 62) {
      const __m512i sv = _mm512_set1_epi64(s0), one = _mm512_set1_epi64(1);
      const __m512i lim = _mm512_set1_epi64(kInt32Max), nlim = _mm512_set1_epi64(-kInt32Max);
      const __m512i rv = _mm512_loadu_si512((const void*)raw);
      for (int h = 0; h < 2 && 8 * h < nk; ++h) {
        const __m512i x = _mm512_mul_epi32(
            _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(rv, 1) : _mm512_castsi512_si256(rv)), mkm[h]);
        const __m512i sh = _mm512_sub_epi64(sv, ekv[h]);
        const __m512i y = _mm512_add_epi64(x, _mm512_sllv_epi64(one, _mm512_sub_epi64(sh, one)));
        const __m512i r = _mm512_min_epi64(_mm512_max_epi64(_mm512_srav_epi64(y, sh), nlim), lim);
        const int64_t left = nk - 8 * h;
        if (left >= 8) {
          _mm512_storeu_si512((void*)(zr + 8 * h), r);
        } else {  // a plain copy: SIMDe's masked store writes all 64 bytes
          alignas(64) int64_t tmp[8];
          _mm512_store_si512((void*)tmp, r);
          std::memcpy(zr + 8 * h, tmp, (size_t)left * sizeof(int64_t));
        }
      }
      return;
    }
    for (int64_t j = 0; j < nk; ++j) zr[j] = shift_round_sat32((int64_t)raw[j] * mk[j] * score_mant, s0 - ek[j]);
  }
};

// Raw dots of RG rows (byte planes h, l with row stride D = 64 * NC, and
// their corrections rc = 128 * sum q) with one block's biased, transposed
// keys kt [16 * NC] (kc = 128 * sum k' per key), into raw [RG][16].
template <int NC, int RG>
inline void dots_rows(const int8_t* h, const int8_t* l, const int32_t* rc, const __m512i* kt, __m512i kc,
                      int32_t* raw) {
  constexpr int64_t D = 64 * NC;
  // Two accumulator sets (even and odd quads) for up to 3 rows: the chains of
  // dependent vpdpbusd are then 12 wide, enough to hide their latency.
  constexpr int S = RG <= 3 ? 2 : 1;
  __m512i ah[S][RG], al[S][RG];
  for (int u = 0; u < S; ++u)
    for (int r = 0; r < RG; ++r) ah[u][r] = al[u][r] = _mm512_setzero_si512();
#pragma GCC unroll 64
  for (int64_t i = 0; i < D / 4; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {  // the row's 4 bytes broadcast from memory
      ah[i % S][r] = _mm512_dpbusd_epi32(ah[i % S][r], kt[i], bcast4(h + r * D + 4 * i));
      al[i % S][r] = _mm512_dpbusd_epi32(al[i % S][r], kt[i], bcast4(l + r * D + 4 * i));
    }
  if constexpr (S == 2)
    for (int r = 0; r < RG; ++r) {
      ah[0][r] = _mm512_add_epi32(ah[0][r], ah[1][r]);
      al[0][r] = _mm512_add_epi32(al[0][r], al[1][r]);
    }
  for (int r = 0; r < RG; ++r) {
    const __m512i v = _mm512_add_epi32(_mm512_slli_epi32(ah[0][r], 8), al[0][r]);
    _mm512_storeu_si512((void*)(raw + kKeys * r), _mm512_sub_epi32(_mm512_add_epi32(v, kc), _mm512_set1_epi32(rc[r])));
  }
}

template <int NC>
void qk_tile_bytes(const int8_t* h, const int8_t* l, const int32_t* rc, const int32_t* e_q, int64_t R,
                   const int8_t* kc, const int32_t* ka, int64_t n, int64_t stride, int64_t score_mant,
                   int64_t score_shift, int64_t* z, int64_t ldz) {
  constexpr int64_t D = 64 * NC;
  const int64_t sstride = stride / D;
  alignas(64) int32_t raw[kRowGroup * kKeys];
  __m512i kt[16 * NC];  // one block's keys + 128, transposed: quad i of keys 0..15
  const __m512i ones = _mm512_set1_epi8(1), bias = _mm512_set1_epi8((char)0x80);
  // Key blocks outside, row groups inside: each block of keys is loaded,
  // transposed and its scales split once for all rows.
  for (int64_t t = 0; t < n; t += kKeys) {
    const int64_t nk = n - t < kKeys ? n - t : kKeys;
    // sum k' in four independent chains (one chain of 16 waits on each vpdpbusd's latency)
    __m512i ks[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) {
      __m512i* blk = kt + 16 * c;
#pragma GCC unroll 16
      for (int64_t j = 0; j < kKeys; ++j) {
        // keys past nk: zeros (their dots are not stored)
        blk[j] = j < nk ? _mm512_loadu_si512((const void*)(kc + (t + j) * stride + 64 * c)) : _mm512_setzero_si512();
        // A decode step reads the cache from DRAM: ask for the next block
        // (a prefetch past the end is harmless).
        _mm_prefetch((const char*)(kc + (t + kKeys + j) * stride + 64 * c), _MM_HINT_T0);
      }
      transpose16x16_epi32(blk);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        blk[i] = _mm512_xor_si512(blk[i], bias);  // k' = k + 128 as unsigned bytes
        ks[i % 4] = _mm512_dpbusd_epi32(ks[i % 4], blk[i], ones);
      }
    }
    const __m512i ksum = _mm512_add_epi32(_mm512_add_epi32(ks[0], ks[1]), _mm512_add_epi32(ks[2], ks[3]));
    const __m512i kcorr = _mm512_slli_epi32(ksum, 7);
    const Scales16 sc(ka + t * sstride, nk, sstride, score_mant);
    for (int64_t r0 = 0; r0 < R; r0 += kRowGroup) {
      const int64_t rg = R - r0 < kRowGroup ? R - r0 : kRowGroup;
      const int8_t *hr = h + r0 * D, *lr = l + r0 * D;
      if (rg == 4) dots_rows<NC, 4>(hr, lr, rc + r0, kt, kcorr, raw);
      else if (rg == 3) dots_rows<NC, 3>(hr, lr, rc + r0, kt, kcorr, raw);
      else if (rg == 2) dots_rows<NC, 2>(hr, lr, rc + r0, kt, kcorr, raw);
      else dots_rows<NC, 1>(hr, lr, rc + r0, kt, kcorr, raw);
      for (int64_t r = 0; r < rg; ++r) sc.score(raw + kKeys * r, nk, score_shift - e_q[r0 + r], z + (r0 + r) * ldz + t);
    }
  }
}

// P . V of RG rows (RG <= 4) over keys [t0, t0 + nk) (nk <= kPvBlock) and
// dims [d0, d0 + 64): each pair of keys' values is widened to int16 and
// interleaved once (lane = (v[t][d], v[t+1][d])) and multiplied by every
// row's weight pair (w[t], w[t+1]) broadcast from memory (vpdpwssd); int32
// sums over at most kPvBlock positions are exact (|w16 v| <= 32767 * 128),
// added into out [RG][D] int64.
template <int RG>
inline void pv_rows64(const int16_t* w16, int64_t ldw, const int8_t* vc, int64_t nk, int64_t stride, int64_t d0,
                      int64_t D, int64_t* out) {
  __m512i acc[RG][4];  // per row: dims of chunk c (32 dims), lo / hi halves of the interleave
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
  const auto step = [&](const int8_t* v0, const int8_t* v1, int64_t t, bool two) {
    __m512i x[4];
    for (int c = 0; c < 2; ++c) {
      const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(v0 + d0 + 32 * c)));
      const __m512i b = two ? _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(v1 + d0 + 32 * c)))
                            : _mm512_setzero_si512();
      x[2 * c] = _mm512_unpacklo_epi16(a, b);
      x[2 * c + 1] = _mm512_unpackhi_epi16(a, b);
    }
    for (int r = 0; r < RG; ++r) {
      int32_t pair;  // w[t] in the low 16 bits, w[t + 1] in the high (zero past the end)
      if (two) std::memcpy(&pair, w16 + r * ldw + t, 4);
      else pair = (int32_t)(uint16_t)w16[r * ldw + t];
      const __m512i wp = _mm512_set1_epi32(pair);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpwssd_epi32(acc[r][j], x[j], wp);
    }
  };
  int64_t t = 0;
  for (; t + 2 <= nk; t += 2) step(vc + t * stride, vc + (t + 1) * stride, t, true);
  if (t < nk) step(vc + t * stride, vc, t, false);
  // acc[r][2c] lane L (128-bit) dword j: dim 32c + 8L + j; acc[r][2c + 1]: 32c + 8L + 4 + j
  for (int r = 0; r < RG; ++r) {
    alignas(64) int32_t s[4][16];
    for (int j = 0; j < 4; ++j) _mm512_store_si512((void*)s[j], acc[r][j]);
    int64_t* o = out + r * D + d0;
    for (int c = 0; c < 2; ++c)
      for (int L = 0; L < 4; ++L)
        for (int j = 0; j < 4; ++j) {
          o[32 * c + 8 * L + j] += s[2 * c][4 * L + j];
          o[32 * c + 8 * L + 4 + j] += s[2 * c + 1][4 * L + j];
        }
  }
}

}  // namespace

void qk_tile_avx512(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                    int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  if ((D != 64 && D != 128 && D != 256) || R < 1) {
    qk_tile_avx2(q, e_q, R, kc, ka, n, stride, D, score_mant, score_shift, z, ldz);
    return;
  }
  // The rows' signed byte planes q = 256 * h + l + 128 (h = q >> 8, l = (q & 255) - 128)
  // and 128 * sum q per row, once per call.
  thread_local std::vector<int8_t> h, l;
  thread_local std::vector<int32_t> rc;
  h.resize((size_t)(R * D));
  l.resize((size_t)(R * D));
  rc.resize((size_t)R);
  for (int64_t r = 0; r < R; ++r) {
    int32_t sum = 0;
    for (int64_t d = 0; d < D; ++d) {
      const int32_t x = q[r * D + d];
      sum += x;
      h[(size_t)(r * D + d)] = (int8_t)(x >> 8);
      l[(size_t)(r * D + d)] = (int8_t)((x & 0xff) - 128);
    }
    rc[(size_t)r] = (int32_t)((uint32_t)sum << 7);  // modulo 2^32, as the lanes
  }
  if (D == 64) qk_tile_bytes<1>(h.data(), l.data(), rc.data(), e_q, R, kc, ka, n, stride, score_mant, score_shift, z, ldz);
  else if (D == 128)
    qk_tile_bytes<2>(h.data(), l.data(), rc.data(), e_q, R, kc, ka, n, stride, score_mant, score_shift, z, ldz);
  else qk_tile_bytes<4>(h.data(), l.data(), rc.data(), e_q, R, kc, ka, n, stride, score_mant, score_shift, z, ldz);
}

// P . V (PvTileFn): rows in groups of up to 4, keys in blocks of kPvBlock,
// dims in chunks of 64 (pv_rows64); other head sizes on the AVX2 tiles.
void pv_tile_avx512(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                    int64_t* out) {
  if (D % 64 || R < 1) {
    pv_tile_avx2(w16, ldw, R, vc, n, stride, D, out);
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += kPvBlock) {
    const int64_t nk = n - t0 < kPvBlock ? n - t0 : kPvBlock;
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
      const int64_t rg = R - r0 < 4 ? R - r0 : 4;
      const int16_t* w = w16 + r0 * ldw + t0;
      const int8_t* v = vc + t0 * stride;
      int64_t* o = out + r0 * D;
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        if (rg == 4) pv_rows64<4>(w, ldw, v, nk, stride, d0, D, o);
        else if (rg == 3) pv_rows64<3>(w, ldw, v, nk, stride, d0, D, o);
        else if (rg == 2) pv_rows64<2>(w, ldw, v, nk, stride, d0, D, o);
        else pv_rows64<1>(w, ldw, v, nk, stride, d0, D, o);
      }
    }
  }
}

}  // namespace intdet
