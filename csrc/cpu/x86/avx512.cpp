// The AVX-512 kernel set's entry (AVX512F/BW/VL + VNNI). Its CPU check is in
// avx512_cpu.cpp (baseline code, no ISA flags), the linear layers in
// avx512_gemm.cpp and avx512_w4.cpp, the g16 packing in avx512_pack.cpp.
// Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni only, or against SIMDe in the test build (INTDET_AVX512_SIMDE,
// where the set is emulated on an AVX2 CPU). docs/kernel-sets.md.
#include <cstdint>

#include "avx2.h"
#include "avx512.h"
#include "avx512_intrin.h"
#include "intdet/kernels.h"
#include "intdet/ops.h"

namespace intdet {

// Constant-initialized (no code runs at load on a CPU without AVX-512).
extern const Kernels kAvx512Kernels;
constinit const Kernels kAvx512Kernels{
    .name = "avx512",
    .cpu_runs = cpu_has_avx512_vnni,
    .packing = &kPackG16,
    .linear = nullptr,
    .linear_packed = linear_avx512_packed,
    .linear_w4 = nullptr,
    .linear_w4_packed = linear_w4_avx512_packed,
    .attend = attend_head_avx2,
    .softmax = softmax_q16_row_avx2,
    .exp2_row = exp2_neg_q30_row_avx2,
    .quant16 = quant16_row_avx2,
    .swiglu = swiglu_row_avx2,
};

}  // namespace intdet
