// The AVX2 kernel set's functions, defined in avx2.cpp, avx2_attn.cpp,
// avx2_gemm.cpp and avx2_w4.cpp (each compiled with -mavx2 only); avx2.cpp
// holds the entry.
#pragma once

#include <cstdint>

namespace intdet {

// Linear layers on the g8 packed layout (kPackG8, kernels.h).
void linear_avx2_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                        const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                        int64_t ldo);
void linear_w4_avx2_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4p,
                           const int16_t* gd, const int16_t* gm, const int32_t* mant, const int32_t* shift,
                           const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);
void softmax_q16_row_avx2(const int64_t* z, int64_t n, int64_t* p);
void exp2_neg_q30_row_avx2(const int64_t* u, int64_t n, int64_t* p);
int quant16_row_avx2(const int64_t* x, int64_t n, int16_t* q);
void swiglu_row_avx2(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);
void geglu_row_avx2(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);
void rope_row_avx2(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin);
int32_t quant8_row_avx2(const int64_t* x, int64_t n, int8_t* q);
// Attention tiles (avx2_attn.cpp).
void qk_tile_avx2(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                  int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz);
// The softmax's row passes (AttnRowFns): va >= 0.
// The vector weight passes (ProbLanes here, ProbLanes8 in avx512.cpp) need
// rr in [0, 2^32]; other rr take the scalar pass.
inline bool attn_prob_lanes_ok(int64_t rr) { return rr >= 0 && rr <= ((int64_t)1 << 32); }
int64_t attn_row_max_avx2(const int64_t* z, int64_t n);
int64_t attn_exp_sum_avx2(int64_t* z, int64_t n, int64_t zmax);
int64_t attn_prob_max_avx2(const int64_t* u, int64_t n, int64_t rr, const int32_t* va);
void attn_prob_w16_avx2(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16);
void pv_tile_avx2(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                  int64_t* out);

}  // namespace intdet
