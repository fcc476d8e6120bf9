// The AMX kernel set ("amx"): the AVX-512 set with its int8 linear layer on
// AMX-INT8 tiles for prefill and on the q16 layout (kPackQ16, kernels.h) for
// decode. Kernels in amx_gemm.cpp (compiled with the AVX-512 flags and
// -mamx-tile -mamx-int8, or against SIMDe and the tile emulation of
// amx_intrin.h in the test build); the CPU check in amx_cpu.cpp (portable
// code). docs/kernel-sets.md.
#pragma once

#include <cstdint>

namespace intdet {

// CPUID says AMX-TILE and AMX-INT8 (and the AVX-512 set's features), XCR0
// enables the tile state, and Linux granted this process tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool cpu_has_amx_int8();

// Rows of at least this many take the AMX tiles (ActPlanes::min_rows);
// fewer take AVX-512 VNNI on the same q16 weights. With the weights in DRAM
// a tile pass costs about the same for 1 to 16 rows (it streams the weights
// once): it beat the q16 VNNI tiles from 3 rows on (72 copies of 1536 x 576,
// one core; at 1 and 2 rows VNNI streamed faster: 23 against 15 GB/s).
constexpr int64_t kAmxMinRows = 3;

// linear on q16-packed int8 weights with AVX-512 VNNI (any T): LinearFn.
void linear_q16_avx512(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* wp,
                       const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                       int64_t ldo);
// The planes (ActPlanes, kernels.h): row bytes, the split of one row, and
// the AMX tile linear on q16-packed weights.
int64_t amx_planes_ld(int64_t K);
void split_row_amx(const int16_t* q, int64_t K, int8_t* hi, uint8_t* lo);
void linear_amx_planes(const int8_t* hi, const uint8_t* lo, int64_t ld, const int32_t* e, int64_t T, int64_t K,
                       const int8_t* wp, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N,
                       int64_t* out, int64_t ldo);

}  // namespace intdet
