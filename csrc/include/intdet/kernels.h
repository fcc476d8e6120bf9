// Runtime choice of the CPU kernel set (ISA) and the thread count.
// Every kernel set computes the same bits as the generic scalar one; they
// differ only in speed (tests/test_isa.py compares them all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace intdet {

using LinearFn = void (*)(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w,
                          const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                          int64_t ldo);

using AttendFn = void (*)(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                          const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                          int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out);

// Int4 linear layer (docs/format.md): the same output as LinearFn with the
// effective weights w[j][k] = gd[j][k/32] * u[j][k] + gm[j][k/32], u the
// 4-bit code in w4 [N, K/2] (input 2i in the low nibble of byte i), K a
// multiple of 32. Packed kernels read pack_w4's layout from w4 and ignore gd, gm.
using LinearW4Fn = void (*)(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4,
                            const int16_t* gd, const int16_t* gm, const int32_t* mant, const int32_t* shift,
                            const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);

// `linear` reads row-major weights [N, K]; `linear_packed`, when not null,
// is used instead and reads Linear::wp (pack_w8x2 layout, made by
// pack_model at load). Likewise `linear_w4` / `linear_w4_packed` (Linear::w4p).
using RowFn = void (*)(const int64_t* x, int64_t n, int64_t* y);

struct Kernels {
  const char* name;
  LinearFn linear;
  LinearFn linear_packed;
  AttendFn attend;
  RowFn softmax;   // softmax_q16_row; the attend kernel uses its own set's
  RowFn exp2_row;  // y[i] = exp2_neg_q30(x[i]), x >= 0
  int (*quant16)(const int64_t* x, int64_t n, int16_t* q);  // quant16_row
  void (*swiglu)(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);  // swiglu_row (a may alias g)
  LinearW4Fn linear_w4;
  LinearW4Fn linear_w4_packed;
};

// The active kernel set: the best the CPU supports, or INTDET_ISA / set_isa().
const Kernels& kernels();
// Names this build has and this CPU can run, best last ("scalar" first).
std::vector<std::string> available_isas();
// Force a kernel set; throws std::invalid_argument naming the ISA when the
// build or the CPU lacks it.
void set_isa(const std::string& name);

// Threads for prefill and decode (OpenMP); 0 = all cores.
void set_num_threads(int n);
int num_threads();

// Weight layout of the packed kernels: output channels in groups of 8, K in
// pairs, 16 bytes = w[8g + c][2p + i] at byte 2c + i (zero padded). The
// group holding channel j (a multiple of 8) starts at byte j * ((K + 1) / 2) * 2.
int64_t packed_size_w8x2(int64_t N, int64_t K);
void pack_w8x2(const int8_t* w, int64_t N, int64_t K, int8_t* out);

// Int4 layout of the packed kernels: output channels in groups of 8; per
// group of 32 inputs a 160-byte block: gd[8] int16, gm[8] int16, then 8
// rows of 16 bytes, row r byte 2c + i = u[8g + c][32j + 4r + i] (low
// nibble) | u[8g + c][32j + 4r + 2 + i] << 4. Channel j (a multiple of 8)
// starts at byte j * (K / 32) * 20. Padded channels are zero.
constexpr int64_t kW4Group = 32;
constexpr int64_t kW4Block = 160;
int64_t packed_size_w4(int64_t N, int64_t K);
void pack_w4(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out);

// Kernel sets compiled in their own files with their own flags.
#if defined(__x86_64__) || defined(_M_X64)
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
void attend_head_avx2(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                      const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                      int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out);
#endif

#if defined(__aarch64__)
void linear_neon(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                 const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);
void linear_w4_neon(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
                    const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                    int64_t* out, int64_t ldo);
void attend_head_neon(const int16_t* q, int e_q, const int8_t* kc, const int32_t* ka, const int8_t* vc,
                      const int32_t* va, int64_t n, int64_t stride, int64_t D, int64_t score_mant,
                      int64_t score_shift, int64_t* z, int64_t* p, int16_t* w16, int64_t* out);
#endif

}  // namespace intdet
