// The AVX-512 kernel set (AVX512F/BW/VL + VNNI): its functions, defined in
// avx512.cpp, avx512_gemm.cpp and avx512_w4.cpp (each compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni only, or against SIMDe in the
// test build), and its packed weight layout g16 (avx512_pack.cpp, portable
// code). avx512.cpp holds the entry; docs/kernel-sets.md.
#pragma once

#include <cstdint>

#include "intdet/kernels.h"

namespace intdet {

// ---- the g16 layout (kPackG16): 16 output channels per 512-bit vector ----
// Int8: output channels in groups of 16, K in pairs; 32 bytes hold
// w[16g + c][2p + i] at byte 2c + i (zero padded). The group holding channel
// j (a multiple of 16) starts at byte j * ((K + 1) / 2) * 2.
int64_t packed_size_w8x2_g16(int64_t N, int64_t K);
void pack_w8x2_g16(const int8_t* w, int64_t N, int64_t K, int8_t* out);
// Int4: output channels in groups of 16; per group of 32 inputs a 320-byte
// block: gd[16] int16, gm[16] int16, then 8 rows of 32 bytes, row r byte
// 2c + i = u[16g + c][32j + 4r + i] (low nibble) | u[16g + c][32j + 4r + 2 + i] << 4.
// Channel j (a multiple of 16) starts at byte j * (K / 32) * 20. Padded channels are zero.
constexpr int64_t kW4Block16 = 320;
int64_t packed_size_w4_g16(int64_t N, int64_t K);
void pack_w4_g16(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out);
extern const Packing kPackG16;

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

}  // namespace intdet
