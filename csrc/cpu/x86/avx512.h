// The AVX-512 kernel set (AVX512F/BW/VL + VNNI): its functions, defined in
// avx512.cpp, avx512_attn.cpp, avx512_gemm.cpp and avx512_w4.cpp (each compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni only, or against SIMDe in the
// test build), and its CPU check (avx512_cpu.cpp, portable code).
// avx512.cpp holds the entry; docs/kernel-sets.md.
#pragma once

#include <cstdint>

#include "intdet/kernels.h"

namespace intdet {

// The linear kernels read the AVX2 set's g8 layout (kPackG8, kernels.h), two
// 8-channel groups per 512-bit vector: one packed copy serves both sets.

// CPUID and XCR0 say the CPU has AVX512F/BW/VL/VNNI (and AVX2) and the OS
// saves the ZMM state (avx512_cpu.cpp, baseline code).
bool cpu_has_avx512_vnni();

// ---- the kernels (same bits as the scalar set) ----
void linear_avx512_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                          const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                          int64_t ldo);
void linear_w4_avx512_packed(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4p,
                             const int16_t* gd, const int16_t* gm, const int32_t* mant, const int32_t* shift,
                             const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);

// Attention scores (avx512_attn.cpp; QkTileFn): keys as int8 bytes under
// vpdpbusd, the query split into bytes (D of 64, 128, 256; else the AVX2 tiles).
void qk_tile_avx512(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka, int64_t n,
                    int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z, int64_t ldz);
// P . V (PvTileFn): vpdpwssd on interleaved value pairs (D a multiple of 64; else the AVX2 tiles).
void pv_tile_avx512(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride, int64_t D,
                    int64_t* out);

// The rest of the set (avx512.cpp), also read by the AMX set's entry.
void exp2_neg_q30_row_avx512(const int64_t* u, int64_t n, int64_t* p);
int64_t attn_row_max_avx512(const int64_t* z, int64_t n);
int64_t attn_exp_sum_avx512(int64_t* z, int64_t n, int64_t zmax);
int64_t attn_prob_max_avx512(const int64_t* u, int64_t n, int64_t rr, const int32_t* va);
void attn_prob_w16_avx512(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16);
void softmax_q16_row_avx512(const int64_t* z, int64_t n, int64_t* p);
int quant16_row_avx512(const int64_t* x, int64_t n, int16_t* q);
void add_sat32_row_avx512(int64_t* x, const int64_t* d, int64_t n);
int32_t quant8_row_avx512(const int64_t* x, int64_t n, int8_t* q);
void rope_row_avx512(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin);
void rms_norm_row_avx512(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y);
void swiglu_row_avx512(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);
void geglu_row_avx512(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);

}  // namespace intdet
