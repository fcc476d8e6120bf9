// Shared device helpers of the CUDA kernel files (csrc/cuda/kernels_*.cu,
// listed in csrc/cuda/sources.txt): block and warp reductions, the per-row
// and per-head steps more than one kernel family runs (norm_row,
// quant16_block, norm_rope_head, quant8_block, glu_one), the 16-byte loads
// and __dp2a dots, the mma.sync tile and the int4 code unpacking. Included
// only by those files (each compiles its own copy: internal linkage), after
// kernels.cuh. The section markers name the files (kernels_<name>.cu) that
// use each part. kernels_elementwise.cu says why the bits cannot change; the
// same argument holds for every file.
#pragma once

#include "kernels.cuh"  // first: cuda_runtime.h, or the host emulator (emu.h)
#include "launch_shapes.cuh"  // block sizes and grids of every kernel

#include <cstdint>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace cuda {

// Counts the launch (launch_count) and throws on a launch error
// (kernels_elementwise.cu).
void check_launch(const char* what);

namespace {

constexpr int64_t kI64Min = -9223372036854775807LL - 1;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ int64_t warp_max(int64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = imax(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Block-wide exact reduction (sum or max) of one int64 per thread; every
// thread gets the result. red: shared int64 [33]. blockDim.x is a multiple
// of 32. Back-to-back calls may reuse red: a call's result slot red[32] is
// rewritten only after the next call's first barrier.
template <bool kMax>
__device__ int64_t block_reduce(int64_t v, int64_t identity, int64_t* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t r = lane < nw ? red[lane] : identity;
    r = kMax ? warp_max(r) : warp_sum(r);
    if (lane == 0) red[32] = r;
  }
  __syncthreads();
  return red[32];
}

__device__ __forceinline__ int64_t block_max(int64_t v, int64_t identity, int64_t* red) {
  return block_reduce<true>(v, identity, red);
}
__device__ __forceinline__ int64_t block_sum(int64_t v, int64_t* red) { return block_reduce<false>(v, 0, red); }

// Reads a value another block wrote in this kernel (L2, not a stale L1 line).
template <class T>
__device__ __forceinline__ T load_cg(const T* p) {
#if defined(INTDET_CUDA_EMU)
  return *p;
#else
  return __ldcg(p);
#endif
}

// The threadFenceReduction pattern: every block calls it after its global
// writes; it returns true (to the whole block) in the one block that arrives
// last at counter (whose count of blocks is `total`), which then sees all the
// other blocks' writes. That block resets the counter for the next launch.
__device__ bool last_block_arrives(int* counter, int total, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int old = atomicAdd(counter, 1);
    *flag = old == total - 1;
    if (*flag) *counter = 0;
  }
  __syncthreads();
  const bool last = *flag;
  if (last) __threadfence();
  return last;
}

// Programmatic dependent launch (sm_90+, launch_shapes.cuh launch_at): wait
// until the previous launch has finished and its writes are visible; let the
// next launch start. No-ops for a launch without the attribute, before sm_90
// and in the emulator (launches run one after another there).
__device__ __forceinline__ void grid_dep_wait() {
#if !defined(INTDET_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if !defined(INTDET_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---------------------------------------------------------------- RMSNorm (norm_rope, linear, attention)

// rms_norm_row of x [n] (Q16) into y [n] (shared or global), by the whole
// block; ops_generic.cpp's steps in the same order. Ends with a barrier.
__device__ void norm_row(const int32_t* x, const int16_t* g, int n, int64_t eps_q60, int in_frac, int32_t* y,
                         int64_t* red) {
  int64_t m = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = imax(m, iabs(x[i]));
  m = block_max(m, 0, red);
  if (m == 0) {  // block-uniform
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = 0;
    __syncthreads();
    return;
  }
  const int a = kNormTopBit - bitlen(m);  // pre-shift so max|x'| has 24 bits
  int64_t s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t v = a >= 0 ? shl(x[i], a) : round_shift(x[i], -a);
    s += v * v;  // the row's sum is < 2^61 (n <= 2^13), so is every partial sum
  }
  s = block_sum(s, red);
  const int64_t e_shift = kEpsFrac - 2 * (in_frac + a);
  int64_t eps;
  if (e_shift >= 0) {
    eps = round_shift(eps_q60, e_shift);
  } else {
    const int t = (int)imin(-e_shift, 62);
    eps = (-e_shift >= 62 || eps_q60 > (kSCap >> t)) ? kSCap : shl(eps_q60, t);
  }
  s = imin(s + imin(eps, kSCap), kSCap);
  const DivBy r = div_by(imax(isqrt(s), 1));  // the row's divisor: its reciprocal once
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t v = a >= 0 ? shl(x[i], a) : round_shift(x[i], -a);
    y[i] = (int32_t)round_div(v * g[i] * ((int64_t)1 << kNormOutFrac), r);
  }
  __syncthreads();
}

// quant16 of y [n] (by the block) into q [n], returns e; quant16_row's steps.
template <typename T>
__device__ int quant16_block(const T* y, int n, int16_t* q, int64_t* red) {
  int64_t m = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = imax(m, iabs((int64_t)y[i]));
  m = block_max(m, 0, red);
  const int e = (int)imax(bitlen(m) - 15, 0);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    q[i] = (int16_t)clamp(round_shift((int64_t)y[i], e), -kInt16QMax, kInt16QMax);
  return e;
}

// ---------------------------------------------------------------- q/k norm + RoPE (norm_rope, attention)

constexpr int kMaxHeadDim = 256;

// Per-head RMSNorm (g not null: Qwen3's q/k norm) then split-half RoPE at
// position p, in place on row [D], by the block. y, red: shared scratch.
__device__ void norm_rope_head(int32_t* row, int D, const int16_t* g, int64_t eps_q60, int64_t p,
                               const int16_t* cos, const int16_t* sin, int32_t* y, int64_t* red) {
  if (!cos) {  // a NoPE layer (SmolLM3): only the norm, if any
    if (g) {
      norm_row(row, g, D, eps_q60, 16, y, red);
      for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = y[i];
    }
    return;
  }
  if (g) {
    norm_row(row, g, D, eps_q60, 16, y, red);
  } else {
    for (int i = threadIdx.x; i < D; i += blockDim.x) y[i] = row[i];
    __syncthreads();
  }
  const int half = D >> 1;
  const int16_t* c = cos + p * half;
  const int16_t* s = sin + p * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int64_t x1 = y[i], x2 = y[i + half];
    row[i] = (int32_t)sat32(round_shift(x1 * c[i] - x2 * s[i], kRopeFrac));
    row[i + half] = (int32_t)sat32(round_shift(x2 * c[i] + x1 * s[i], kRopeFrac));
  }
}

// ---------------------------------------------------------------- KV cache append (norm_rope, attention)

// quant8_row of x [D] into q [D] by the block; returns the absmax.
__device__ int32_t quant8_block(const int32_t* x, int D, int8_t* q, int64_t* red) {
  int64_t a = 0;
  for (int i = threadIdx.x; i < D; i += blockDim.x) a = imax(a, iabs(x[i]));
  a = block_max(a, 0, red);
  const DivBy d = div_by(imax(a, 1));  // the row's divisor: its reciprocal once
  for (int i = threadIdx.x; i < D; i += blockDim.x)
    q[i] = (int8_t)clamp(round_div(127 * (int64_t)x[i], d), -kInt8QMax, kInt8QMax);
  return (int32_t)a;
}

// ---------------------------------------------------------------- positions and lanes (attention, attention_decode)

// Positions of a row: lo..lo+n-1 (lo > 0 only in a sliding window).
__device__ __forceinline__ void attn_range(int64_t p, int64_t window, int64_t* lo, int64_t* n) {
  *lo = window && p + 1 > window ? p + 1 - window : 0;
  *n = p + 1 - *lo;
}

// Lanes per position: D/16 16-byte chunks rounded up to a power of two (vec),
// or a whole warp over scalar dims (D % 16 != 0).
__device__ __forceinline__ int attn_lanes_log2(int D, bool vec) {
  if (!vec) return 5;
  int lg = 0;
  while ((16 << lg) < D) ++lg;
  return lg;
}

// Sum over the L lanes of a position (lanes sub = 0..L-1 of an aligned group);
// every lane of the warp calls it.
__device__ __forceinline__ int32_t group_sum32(int32_t v, int L) {
  for (int o = L >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// ---------------------------------------------------------------- SwiGLU (elementwise, linear)

// swiglu_row / geglu_row for one element (Q16 gate and up, Q32 int64 out).
__device__ __forceinline__ int64_t glu_one(int64_t g, int64_t u, bool gelu) {
  const int64_t w = gelu ? gelu_exp2_arg(g) : round_shift(iabs(g) * kLog2eQ30, 30);  // |y| log2(e), Q16
  const int64_t d = exp2_neg_q30(w);  // exp(-|y|), Q30
  const int64_t den = ((int64_t)1 << 30) + d;
  const DivBy dv = div_by(den);  // a divisor per element: one Newton reciprocal, one product
  const int64_t sig = g >= 0 ? round_div((int64_t)1 << 60, dv) : round_div(d << 30, dv);  // sign(y) = sign(g)
  return round_shift(g * sig, 30) * u;
}

// ---------------------------------------------------------------- linear layers (linear, moe, attention)

__device__ __forceinline__ void store_out(int32_t* o, int64_t v, bool residual) {
  *o = (int32_t)(residual ? sat32((int64_t)*o + v) : v);
}

// 16-byte load; p must be 16-byte aligned (the emulator checks it).
__device__ __forceinline__ int4 load16(const void* p) {
#if defined(INTDET_CUDA_EMU)
  return ::emu::load16_checked(p);
#else
  return __ldg(reinterpret_cast<const int4*>(p));
#endif
}

// 16-byte load from shared memory. Never load16 there: __ldg is
// ld.global.nc, and a shared address used as a global one faults.
__device__ __forceinline__ int4 load16_shared(const void* p) {
#if defined(INTDET_CUDA_EMU)
  return ::emu::load16_checked(p);
#else
  return *reinterpret_cast<const int4*>(p);
#endif
}

// Sixteen int16 x int8 products in int32 (|sum| < 2^26): __dp2a_lo/hi take two
// int16 from the first operand and two int8 (low/high half) from the second.
__device__ __forceinline__ int32_t dot16(const int4 a0, const int4 a1, const int4 w) {
  int32_t p = __dp2a_lo(a0.x, w.x, 0);
  p = __dp2a_hi(a0.y, w.x, p);
  p = __dp2a_lo(a0.z, w.y, p);
  p = __dp2a_hi(a0.w, w.y, p);
  p = __dp2a_lo(a1.x, w.z, p);
  p = __dp2a_hi(a1.y, w.z, p);
  p = __dp2a_lo(a1.z, w.w, p);
  p = __dp2a_hi(a1.w, w.w, p);
  return p;
}

// ---------------------------------------------------------------- mma.sync (linear, attention)

// D += A B for one m16n8k32 tile: A s8 (kUnsigned false: the high bytes of
// int16 values) or u8 (true: the low bytes), B s8, C/D s32. One definition
// for both forms: only the A type differs.
template <bool kUnsigned>
__device__ __forceinline__ void mma_m16n8k32(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(INTDET_CUDA_EMU)
  ::emu::mma_m16n8k32(d, a, b, d, kUnsigned);
#else
#define INTDET_MMA_M16N8K32(AT)                                                                                    \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT ".s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "     \
               "{%0,%1,%2,%3};\n"                                                                                 \
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (kUnsigned)
    INTDET_MMA_M16N8K32("u8");
  else
    INTDET_MMA_M16N8K32("s8");
#undef INTDET_MMA_M16N8K32
#endif
}
__device__ __forceinline__ void mma_s8s8(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_m16n8k32<false>(d, a, b);
}
__device__ __forceinline__ void mma_u8s8(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_m16n8k32<true>(d, a, b);
}

__device__ __forceinline__ uint32_t smem_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// quant16_row of one query row qr [D] (null: a row of zeros) by one warp,
// split exactly into the A operands of the hi / lo mma: hi[d] = x >> 8 (s8),
// lo[d] = x & 255 (u8) for d < Dp (zeros past D). Returns e_q. The tensor-
// core attentions (kernels_attention.cu, kernels_attention_flash.cu).
__device__ int quant16_split_row(const int32_t* qr, int D, int Dp, uint8_t* hi, uint8_t* lo) {
  const int lane = threadIdx.x & 31;
  int64_t m = 0;
  if (qr)
    for (int d = lane; d < D; d += 32) m = imax(m, iabs((int64_t)qr[d]));
  m = warp_max(m);
  const int e_q = (int)imax(bitlen(m) - 15, 0);
  for (int d = lane; d < Dp; d += 32) {
    const int32_t x = qr && d < D ? (int32_t)clamp(round_shift((int64_t)qr[d], e_q), -kInt16QMax, kInt16QMax) : 0;
    hi[d] = (uint8_t)((x >> 8) & 0xff);
    lo[d] = (uint8_t)(x & 0xff);
  }
  return e_q;
}

// ---------------------------------------------------------------- cp.async (linear)

// 16-byte asynchronous copy global -> shared (sm_80+ cp.async.cg: it
// bypasses L1, the weights are read once); both addresses 16-byte aligned
// (the emulator checks). The copies a thread issued since its last
// cp_async_commit form a group; cp_async_wait<n> waits until at most n of
// its groups are still in flight (a __syncthreads after it makes every
// thread's copies visible to the block). The emulator copies at once.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(INTDET_CUDA_EMU)
  const int4 v = ::emu::load16_checked(gmem);
  (void)::emu::load16_checked(smem);
  *reinterpret_cast<int4*>(smem) = v;
#else
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(INTDET_CUDA_EMU)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kInFlight>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(INTDET_CUDA_EMU)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

// ---------------------------------------------------------------- int4 codes (linear, moe)

constexpr int kOnes8 = 0x01010101;  // four int8 ones: dot16 with them sums 16 activations

// Sixteen codes as bytes in input order, from two words of packed codes
// (input 2i in the low nibble of byte i): the low nibbles are inputs 0,2,4,6
// and the high ones 1,3,5,7; __byte_perm interleaves them (one PRMT each)
// so that __dp2a pairs each code with its activation.
__device__ __forceinline__ int4 codes16(int x, int y) {
  const unsigned xl = (unsigned)x & 0x0F0F0F0Fu, xh = ((unsigned)x >> 4) & 0x0F0F0F0Fu;
  const unsigned yl = (unsigned)y & 0x0F0F0F0Fu, yh = ((unsigned)y >> 4) & 0x0F0F0F0Fu;
  return make_int4((int)__byte_perm(xl, xh, 0x5140), (int)__byte_perm(xl, xh, 0x7362),
                   (int)__byte_perm(yl, yh, 0x5140), (int)__byte_perm(yl, yh, 0x7362));
}

// One group: a = 32 int16 activations (16-byte aligned), u0/u1 = its 32 codes.
__device__ __forceinline__ int64_t group_dot_w4(const int16_t* a, const int4 u0, const int4 u1, int32_t gd,
                                                int32_t gm) {
  const int4 a0 = load16(a), a1 = load16(a + 8), a2 = load16(a + 16), a3 = load16(a + 24);
  const int4 ones = make_int4(kOnes8, kOnes8, kOnes8, kOnes8);
  const int32_t s = dot16(a0, a1, u0) + dot16(a2, a3, u1);
  const int32_t sq = dot16(a0, a1, ones) + dot16(a2, a3, ones);
  return (int64_t)gd * s + (int64_t)gm * sq;
}

}  // namespace
}  // namespace cuda
}  // namespace intdet
