// NEON linear and attention kernels for aarch64 (ASIMD is baseline there)
// and the NEON kernel set's entry.
// Same bits as the generic kernels: exact integer dot products in any order,
// the shared linear_epilogue / attn_score, and the spec's P.V quantization.
#include <arm_neon.h>

#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {
namespace {

// vmlal_s16 adds 4 products (|p| < 2^22) to each int32 lane per call, two
// calls per 8 elements: 1024 elements give each lane 256 products < 2^30.
constexpr int64_t kBlock = 1024;

inline int64_t dot_i16_i8(const int16_t* a, const int8_t* w, int64_t K) {
  int64_t acc = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = k0 + kBlock < K ? k0 + kBlock : K;
    int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
      const int16x8_t x = vld1q_s16(a + k);
      const int16x8_t y = vmovl_s8(vld1_s8(w + k));
      s0 = vmlal_s16(s0, vget_low_s16(x), vget_low_s16(y));
      s1 = vmlal_high_s16(s1, x, y);
    }
    acc += (int64_t)vaddlvq_s32(s0) + (int64_t)vaddlvq_s32(s1);
    for (; k < k1; ++k) acc += (int32_t)a[k] * (int32_t)w[k];
  }
  return acc;
}

// Int4 weights (docs/format.md): one group's codes, unzipped into input
// order, become int16 weights gd * u + gm (exact: |w| <= 2047); each int32
// lane then gains 4 products (< 2^26 each) per group before the int64 add.
inline int64_t dot_i16_w4(const int16_t* a, const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t K) {
  int64_t acc = 0;
  const uint8x16_t nib = vdupq_n_u8(15);
  for (int64_t g = 0; g < K / 32; ++g) {
    const uint8x16_t b = vld1q_u8(w4 + 16 * g);
    const uint8x16x2_t z = vzipq_u8(vandq_u8(b, nib), vshrq_n_u8(b, 4));  // codes of inputs 0..15, 16..31
    const int16x8_t d = vdupq_n_s16(gd[g]), m = vdupq_n_s16(gm[g]);
    int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const int16x8_t w0 = vmlaq_s16(m, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(z.val[h]))), d);
      const int16x8_t w1 = vmlaq_s16(m, vreinterpretq_s16_u16(vmovl_high_u8(z.val[h])), d);
      const int16x8_t x0 = vld1q_s16(a + 32 * g + 16 * h), x1 = vld1q_s16(a + 32 * g + 16 * h + 8);
      s0 = vmlal_s16(s0, vget_low_s16(x0), vget_low_s16(w0));
      s1 = vmlal_high_s16(s1, x0, w0);
      s0 = vmlal_s16(s0, vget_low_s16(x1), vget_low_s16(w1));
      s1 = vmlal_high_s16(s1, x1, w1);
    }
    acc += (int64_t)vaddlvq_s32(s0) + (int64_t)vaddlvq_s32(s1);
  }
  return acc;
}

}  // namespace

void linear_w4_neon(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
                    const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                    int64_t* out, int64_t ldo) {
  const int64_t G = K / 32;
  for (int64_t j = 0; j < N; ++j)
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot_i16_w4(q + t * K, w4 + j * (K / 2), gd + j * G, gm + j * G, K), mant[j],
                                         shift[j], e[t], bias, j);
}

void linear_neon(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                 const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo) {
  for (int64_t j = 0; j < N; ++j)
    for (int64_t t = 0; t < T; ++t)
      out[t * ldo + j] = linear_epilogue(dot_i16_i8(q + t * K, w + j * K, K), mant[j], shift[j], e[t], bias, j);
}


// Attention tiles (QkTileFn, kernels.h; same bits as qk_tile_generic): a
// block of 16 keys, then every row's dots against it (the block stays in L1).
void qk_tile_neon(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                  int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz) {
  if (D % 8) {
    qk_tile_generic(q, e_q, R, kc, ka, n, stride, D, score_mant, score_shift, z, ldz);
    return;
  }
  const int64_t sstride = stride / D;
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t t1 = t0 + 16 < n ? t0 + 16 : n;
    int64_t mk[16], ek[16];
    for (int64_t t = t0; t < t1; ++t) normalize_scale15(ka[t * sstride], &mk[t - t0], &ek[t - t0]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t t = t0; t < t1; ++t)
        z[r * ldz + t] = shift_round_sat32((int64_t)(int32_t)dot_i16_i8(q + r * D, kc + t * stride, D) *
                                               mk[t - t0] * score_mant,
                                           score_shift - e_q[r] - ek[t - t0]);
  }
}

// P . V tiles (PvTileFn; same bits as pv_tile_generic): blocks of 64
// positions (in L1) added into every row with vmlal (int32 lanes gain at
// most 64 products |w16 * v| <= 32767 * 127 per block), then int64.
void pv_tile_neon(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out) {
  if (D % 8 || D > 256) {
    pv_tile_generic(w16, ldw, R, vc, n, stride, D, out);
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += 64) {
    const int64_t t1 = t0 + 64 < n ? t0 + 64 : n;
    for (int64_t r = 0; r < R; ++r) {
      int32x4_t acc[64];
      for (int64_t c = 0; c < D / 4; ++c) acc[c] = vdupq_n_s32(0);
      for (int64_t t = t0; t < t1; ++t) {
        const int16_t wt = w16[r * ldw + t];
        const int8_t* v = vc + t * stride;
        for (int64_t c = 0; c < D / 8; ++c) {
          const int16x8_t y = vmovl_s8(vld1_s8(v + 8 * c));
          acc[2 * c] = vmlal_n_s16(acc[2 * c], vget_low_s16(y), wt);
          acc[2 * c + 1] = vmlal_high_n_s16(acc[2 * c + 1], y, wt);
        }
      }
      for (int64_t c = 0; c < D / 4; ++c) {
        int32_t lanes[4];
        vst1q_s32(lanes, acc[c]);
        for (int i = 0; i < 4; ++i) out[r * D + 4 * c + i] += lanes[i];
      }
    }
  }
}

// Row ops (and the softmax's row passes) are the scalar ones; the weights stay row-major (no packing).
extern const Kernels kNeonKernels;
constinit const Kernels kNeonKernels{
    .name = "neon",
    .cpu_runs = [] { return true; },  // ASIMD is part of the aarch64 baseline
    .packing = nullptr,
    .linear = linear_neon,
    .linear_packed = nullptr,
    .linear_w4 = linear_w4_neon,
    .linear_w4_packed = nullptr,
    .qk_tile = qk_tile_neon,
    .pv_tile = pv_tile_neon,
    .attn_row = kAttnRowGeneric,
    .softmax = softmax_q16_row,
    .exp2_row = exp2_neg_q30_row,
    .quant16 = quant16_row,
    .rms_norm = rms_norm_row,
    .add_sat32 = add_sat32_row,
    .rope = rope_row,
    .quant8_row = quant8_row,
    .swiglu = swiglu_row,
    .geglu = geglu_row,
    .planes = {},
};

}  // namespace intdet
