// CUDA kernels of the integer forward pass (csrc/cuda/kernels_*.cu, one file
// per op family; this one: the embedding, SwiGLU/GeGLU, the softcap,
// round_div and the launch count). Each one is the scalar C++
// reference (csrc/cpu/ops_generic.cpp, csrc/model/forward.cpp) spread over
// threads, and calls the same INTDET_HD primitives (intmath.h, ops.h).
//
// Why the bits cannot change: every value is an integer and every sum is an
// exact integer sum. Sums are split across threads and warps in any order,
// which is harmless for integers as long as no partial sum overflows its
// type: int32 partial sums are bounded by the same argument as on the CPU
// (at most 512 products of |int16 * int8| <= 32767 * 127 per int32 partial),
// everything else accumulates in int64. Maxima are order-free too.
//
// No floating point: no float types, no '/' or '%' by a variable (nvcc lowers
// those through MUFU.RCP; floor_div divides by a reciprocal on the device,
// intmath.h DivBy), no float
// intrinsics. scripts/check_sass.py disassembles the result to prove it.
#include "kernels_shared.cuh"  // first: kernels.cuh, then the shared device helpers

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace cuda {
namespace {

int64_t g_launches = 0;  // kernel launches enqueued (launch_count)

// ---------------------------------------------------------------- embedding

__global__ void embed_kernel(const int32_t* __restrict__ tokens, const int8_t* __restrict__ emb,
                             const int32_t* __restrict__ mant, const int32_t* __restrict__ shift, int H,
                             int32_t* __restrict__ x) {
  const int64_t t = blockIdx.x;
  const int64_t tok = tokens[t];
  const int8_t* row = emb + tok * H;
  const int64_t m = mant[tok], s = shift[tok];
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    x[t * H + i] = (int32_t)shift_round_sat32((int64_t)row[i] * m, s);
}

// ---------------------------------------------------------------- SwiGLU

__global__ void swiglu_kernel(const int32_t* __restrict__ gate, const int32_t* __restrict__ up, int64_t count,
                              int64_t* __restrict__ a) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    a[i] = glu_one(gate[i], up[i], false);
}

// Soft-capping in place (Gemma 2's final logits): intmath.h softcap per element.
__global__ void softcap_kernel(int32_t* __restrict__ x, int64_t count, Softcap cap) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = (int32_t)softcap(x[i], cap);
}

// GeGLU: geglu_row's steps per element (gelu_exp2_arg in ops.h, shared with the CPU).
__global__ void geglu_kernel(const int32_t* __restrict__ gate, const int32_t* __restrict__ up, int64_t count,
                             int64_t* __restrict__ a) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    a[i] = glu_one(gate[i], up[i], true);
}

__global__ void round_div_kernel(const int64_t* a, const int64_t* b, int64_t count, int64_t* out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = round_div(a[i], b[i]);
}

// The division microbenchmark (scripts/bench_div.py): out[i] = the sum over
// r < reps of floor(a[i] + r, divisor) by mode 0: udiv_u64 (floor_div_intonly)
// and 1: a DivBy per division, both by b[i] + r (a per-element divisor, the
// GLU's case: nothing to hoist); 2: udiv_u64 and 3: one DivBy hoisted out of
// the loop, both by b[i] (a per-row divisor: RMSNorm, quant8). Modes 0 and 1
// (2 and 3) give the same sums.
__global__ void div_bench_kernel(const int64_t* a, const int64_t* b, int64_t count, int reps, int mode,
                                 int64_t* out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t x = a[i], d = b[i];
    int64_t acc = 0;
    if (mode == 0) {
      for (int r = 0; r < reps; ++r) acc += floor_div_intonly(x + r, d + r);
    } else if (mode == 1) {
      for (int r = 0; r < reps; ++r) acc += floor_div(x + r, div_by(d + r));
    } else if (mode == 2) {
      for (int r = 0; r < reps; ++r) acc += floor_div_intonly(x + r, d);
    } else {
      const DivBy v = div_by(d);
      for (int r = 0; r < reps; ++r) acc += floor_div(x + r, v);
    }
    out[i] = acc;
  }
}

}  // namespace

void check_launch(const char* what) {
  ++g_launches;
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(err));
}

void launch_embed(const int32_t* tokens, const int8_t* emb, const int32_t* mant, const int32_t* shift, int T, int H,
                  int32_t* x, cudaStream_t st) {
  INTDET_LAUNCH_AT(embed_kernel, shape_embed(T), st, tokens, emb, mant, shift, H, x);
  check_launch("embed");
}

int64_t launch_count() { return g_launches; }

void launch_softcap(int32_t* x, int64_t count, const Softcap& cap, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH_AT(softcap_kernel, shape_elementwise(count), st, x, count, cap);
  check_launch("softcap");
}

void launch_swiglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH_AT(swiglu_kernel, shape_elementwise(count), st, g, u, count, a);
  check_launch("swiglu");
}

void launch_geglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH_AT(geglu_kernel, shape_elementwise(count), st, g, u, count, a);
  check_launch("geglu");
}

void launch_round_div(const int64_t* a, const int64_t* b, int64_t count, int64_t* out, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH_AT(round_div_kernel, shape_elementwise(count), st, a, b, count, out);
  check_launch("round_div");
}

void launch_div_bench(const int64_t* a, const int64_t* b, int64_t count, int reps, int mode, int64_t* out,
                      cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH_AT(div_bench_kernel, shape_elementwise(count), st, a, b, count, reps, mode, out);
  check_launch("div_bench");
}

}  // namespace cuda
}  // namespace intdet
