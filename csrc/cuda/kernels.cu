// CUDA kernels of the integer forward pass. Each one is the scalar C++
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
// those through MUFU.RCP; floor_div uses udiv_u64 on the device), no float
// intrinsics. scripts/check_sass.py disassembles the result to prove it.
#include "kernels.cuh"  // first: cuda_runtime.h, or the host emulator (emu.h)

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace cuda {
namespace {

constexpr int64_t kI64Min = -9223372036854775807LL - 1;
constexpr unsigned kFull = 0xffffffffu;

int64_t g_launches = 0;  // kernel launches enqueued (launch_count)

void check_launch(const char* what) {
  ++g_launches;
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(err));
}

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

// ---------------------------------------------------------------- RMSNorm

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
  const int64_t r = imax(isqrt(s), 1);
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

constexpr int kNormThreads = 256;

// One block per row; dynamic shared memory holds the normed row (n int32),
// also stored to normed [R, n] when that is not null (the trace only).
__global__ void __launch_bounds__(kNormThreads)
    norm_quant16_kernel(const int32_t* __restrict__ x, const int32_t* __restrict__ idx, const int16_t* __restrict__ g,
                        int n, int64_t eps_q60, int in_frac, int16_t* __restrict__ q, int32_t* __restrict__ e,
                        int32_t* __restrict__ normed) {
  INTDET_DYN_SMEM(int32_t, y_s);
  __shared__ int64_t red[33];
  const int64_t r = blockIdx.x;
  const int64_t src = idx ? idx[r] : r;
  norm_row(x + src * n, g, n, eps_q60, in_frac, y_s, red);
  if (normed)  // grid-uniform
    for (int i = threadIdx.x; i < n; i += blockDim.x) normed[r * n + i] = y_s[i];
  const int ex = quant16_block(y_s, n, q + r * n, red);
  if (threadIdx.x == 0) e[r] = ex;
}

// One block per row: the post-norm of y's row straight into the residual x.
__global__ void __launch_bounds__(kNormThreads)
    post_norm_add_kernel(const int32_t* __restrict__ y, const int16_t* __restrict__ g, int n, int64_t eps_q60,
                         int32_t shift, int32_t* __restrict__ x) {
  INTDET_DYN_SMEM(int32_t, y_s);
  __shared__ int64_t red[33];
  const int64_t r = blockIdx.x;
  norm_row(y + r * n, g, n, eps_q60, 16, y_s, red);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    x[r * n + i] = (int32_t)sat32((int64_t)x[r * n + i] + shift_round_sat32(y_s[i], shift));
}

__global__ void __launch_bounds__(kNormThreads)
    quant16_i64_kernel(const int64_t* __restrict__ x, int n, int16_t* __restrict__ q, int32_t* __restrict__ e) {
  __shared__ int64_t red[33];
  const int64_t r = blockIdx.x;
  const int ex = quant16_block(x + r * n, n, q + r * n, red);
  if (threadIdx.x == 0) e[r] = ex;
}

// quant16 of int32 rows (the residual itself where a block has no pre-norm: OLMo 2).
__global__ void __launch_bounds__(kNormThreads)
    quant16_i32_kernel(const int32_t* __restrict__ x, int n, int16_t* __restrict__ q, int32_t* __restrict__ e) {
  __shared__ int64_t red[33];
  const int64_t r = blockIdx.x;
  const int ex = quant16_block(x + r * n, n, q + r * n, red);
  if (threadIdx.x == 0) e[r] = ex;
}

// One block per row: RMSNorm of x's Q16 row in place (a projection-wide q/k
// norm, OLMo 2). norm_row reads all of a row before its first write (the
// reductions' barriers), then each thread writes only the elements it reads.
__global__ void __launch_bounds__(kNormThreads)
    norm_rows_kernel(int32_t* __restrict__ x, const int16_t* __restrict__ g, int n, int64_t eps_q60) {
  __shared__ int64_t red[33];
  const int64_t r = blockIdx.x;
  norm_row(x + r * n, g, n, eps_q60, 16, x + r * n, red);
}

// ---------------------------------------------------------------- q/k norm + RoPE

constexpr int kHeadThreads = 128;
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

// grid (T, nheads): one block per (row, head) of x [T, nheads, D], in place.
__global__ void __launch_bounds__(kHeadThreads)
    norm_rope_kernel(int32_t* __restrict__ x, int nheads, int D, const int16_t* __restrict__ g, int64_t eps_q60,
                     const int32_t* __restrict__ pos, const int16_t* __restrict__ cos,
                     const int16_t* __restrict__ sin) {
  __shared__ int32_t y[kMaxHeadDim];
  __shared__ int64_t red[33];
  const int64_t t = blockIdx.x;
  norm_rope_head(x + (t * nheads + blockIdx.y) * D, D, g, eps_q60, pos[t], cos, sin, y, red);
}

// ---------------------------------------------------------------- KV cache append

// quant8_row of x [D] into q [D] by the block; returns the absmax.
__device__ int32_t quant8_block(const int32_t* x, int D, int8_t* q, int64_t* red) {
  int64_t a = 0;
  for (int i = threadIdx.x; i < D; i += blockDim.x) a = imax(a, iabs(x[i]));
  a = block_max(a, 0, red);
  const int64_t d = imax(a, 1);
  for (int i = threadIdx.x; i < D; i += blockDim.x)
    q[i] = (int8_t)clamp(round_div(127 * (int64_t)x[i], d), -kInt8QMax, kInt8QMax);
  return (int32_t)a;
}

// grid (T, nkv): quantize row t, kv head h of k and v into the row's cache.
__global__ void __launch_bounds__(kHeadThreads)
    kv_append_kernel(const int32_t* __restrict__ k, const int32_t* __restrict__ v, int nkv, int D, int layer,
                     const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, const DevKV* __restrict__ kvs) {
  __shared__ int64_t red[33];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const DevKV kv = kvs[seq[t]];
  const int64_t base = ((int64_t)layer * kv.max_len + pos[t]) * nkv + h;  // [L, P, nkv] index
  const int64_t src = (t * nkv + h) * D;
  const int32_t ak = quant8_block(k + src, D, kv.k + base * D, red);
  const int32_t av = quant8_block(v + src, D, kv.v + base * D, red);
  if (threadIdx.x == 0) {
    kv.ka[base] = ak;
    kv.va[base] = av;
  }
}

// ---------------------------------------------------------------- SwiGLU

// swiglu_row / geglu_row for one element (Q16 gate and up, Q32 int64 out).
__device__ __forceinline__ int64_t glu_one(int64_t g, int64_t u, bool gelu) {
  const int64_t w = gelu ? gelu_exp2_arg(g) : round_shift(iabs(g) * kLog2eQ30, 30);  // |y| log2(e), Q16
  const int64_t d = exp2_neg_q30(w);  // exp(-|y|), Q30
  const int64_t den = ((int64_t)1 << 30) + d;
  const int64_t sig = g >= 0 ? round_div((int64_t)1 << 60, den) : round_div(d << 30, den);  // sign(y) = sign(g)
  return round_shift(g * sig, 30) * u;
}

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

// ---------------------------------------------------------------- greedy token choice

// The host Sampler's greedy pick (np.argmax: the largest logit, the lowest
// id among equal ones) as one order-free int64 maximum: key = v 2^32 +
// (2^32 - 1 - id) is larger exactly when v is larger, or v is equal and the
// id smaller (|v| <= 2^31, so the key fits int64). Blocks reduce their
// stride of the row, combine with atomicMax (on key ^ 2^63, the unsigned
// order of signed keys), and the last block to arrive writes the token and
// resets best (atomicExch) and the counter for the next launch.
constexpr int kArgmaxThreads = 256, kArgmaxBlocks = 64;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const int32_t* __restrict__ logits, int V, unsigned long long* best, int* counter,
                  int32_t* token) {
  __shared__ int64_t red[33];
  __shared__ int flag;
  int64_t k = kI64Min;
  // unroll 1: no trip count, which nvcc would compute with a float reciprocal
#pragma unroll 1
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V; i += (int64_t)gridDim.x * blockDim.x)
    k = imax(k, (int64_t)logits[i] * 4294967296LL + (4294967295LL - i));
  k = block_max(k, kI64Min, red);
  if (threadIdx.x == 0) atomicMax(best, (unsigned long long)k ^ (1ULL << 63));
  if (last_block_arrives(counter, (int)gridDim.x, &flag) && threadIdx.x == 0) {
    const int64_t key = (int64_t)(atomicExch(best, 0ULL) ^ (1ULL << 63));
    *token = (int32_t)(4294967295LL - (key & 0xffffffffLL));
  }
}

// Temperature sampling with top-k, top-p and min-p (python/intdet/
// sampling.py Sampler.pick): w_i = exp2_neg_q30(round_div(round_shift(
// min(top - l_i, 2^26) * log2(e) Q30, 30) * t_den, t_num)) (zero exactly for
// the tokens the host's "live" filter drops), the order is logit descending
// then id ascending, and the pick is the first token of that order whose
// running sum of w exceeds target = (draw * total) >> 64, total being the sum
// over the prefix the cuts keep. No sort: with S(v) = sum of w over l >= v
// and C(v) = the live tokens with l >= v (both non-increasing in v), each
// question about the order is a binary search over the int32 range, one
// block pass (S and C together) per step:
// - the running sum at rank n (cum(n), n >= 1): the rank's logit is
//   v = max{v : C(v) >= n}, cum(n) = S(v + 1) + (n - C(v + 1)) w(v) (the ties
//   of logit v have equal weights);
// - top-k: the prefix of min(k, live) ranks, total_k = cum of it;
// - top-p: the shortest prefix with cum(n) p_den >= total_k p_num (128-bit
//   products, the host's cross-multiplication): v_p = max{v : S(v) p_den >=
//   total_k p_num}, then the fewest m of its ties that reach it (a search
//   over m, no pass); n_p <= the top-k prefix since p <= 1;
// - min-p: the live tokens with w_i m_den >= m_num 2^30 form a prefix of the
//   order (one counting pass); the host keeps min(prefix, that count), at
//   least 1;
// - the pick: the chosen token's logit is v* = max{v : S(v) > target}; since
//   target < total = cum(n), the first rank whose cum exceeds it lies inside
//   the kept prefix, so the same search over the whole order finds it; its
//   place among the tokens of logit v* is j = (target - S(v* + 1)) / w*, and
//   the j-th smallest such id is a binary search over ids.
// One block; w goes to wbuf [V] once. Every sum is an exact int64 (total <=
// V 2^30), so the result is the host's for any thread order.
constexpr int kSampleThreads = 1024;
constexpr int64_t kLog2eQ30 = 1549082005;  // round(log2(e) 2^30): sampling.py's LOG2E_Q30
constexpr int64_t kDiffCap = (int64_t)1 << 26;  // sampling.py's DIFF_CAP

__device__ __forceinline__ int64_t sample_weight(int64_t top, int64_t l, int64_t t_num, int64_t t_den) {
  const int64_t d = top - l < kDiffCap ? top - l : kDiffCap;
  return exp2_neg_q30(round_div(round_shift(d * kLog2eQ30, 30) * t_den, t_num));
}

__device__ __forceinline__ uint64_t mul_hi64(uint64_t a, uint64_t b) {
#if defined(INTDET_CUDA_EMU)
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
  return __umul64hi(a, b);
#endif
}

// a b >= c d for non-negative int64 (exact 128-bit products).
__device__ __forceinline__ bool mul_ge(int64_t a, int64_t b, int64_t c, int64_t d) {
  const uint64_t h1 = mul_hi64((uint64_t)a, (uint64_t)b), h2 = mul_hi64((uint64_t)c, (uint64_t)d);
  return h1 != h2 ? h1 > h2 : (uint64_t)a * (uint64_t)b >= (uint64_t)c * (uint64_t)d;
}

// S(v) and C(v) of the block's row in one pass (every thread gets both).
__device__ __forceinline__ void sample_pass(const int32_t* logits, const int32_t* wbuf, int V, int64_t v, int64_t* S,
                                            int64_t* Cn, int64_t* red) {
  int64_t sm = 0, c = 0;
  for (int i = threadIdx.x; i < V; i += kSampleThreads)
    if (logits[i] >= v) sm += wbuf[i], c += wbuf[i] > 0 ? 1 : 0;
  *S = block_sum(sm, red);
  *Cn = block_sum(c, red);
}

// cum(n) for 1 <= n <= the live count.
__device__ int64_t sample_cum(const int32_t* logits, const int32_t* wbuf, int V, int64_t bot, int64_t top, int64_t n,
                              int64_t t_num, int64_t t_den, int64_t* red) {
  int64_t lo = bot, hi = top + 1, s_hi = 0, c_hi = 0;  // C(lo) >= n > C(hi)
  while (hi - lo > 1) {  // block-uniform
    const int64_t mid = lo + ((hi - lo) >> 1);
    int64_t sm, c;
    sample_pass(logits, wbuf, V, mid, &sm, &c, red);
    if (c >= n)
      lo = mid;
    else
      hi = mid, s_hi = sm, c_hi = c;
  }
  return s_hi + (n - c_hi) * sample_weight(top, lo, t_num, t_den);
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const int32_t* __restrict__ logits, int V, int64_t t_num, int64_t t_den, unsigned long long draw,
                  int64_t top_k, int64_t p_num, int64_t p_den, int64_t m_num, int64_t m_den,
                  int32_t* __restrict__ wbuf, int32_t* __restrict__ token) {
  __shared__ int64_t red[33];
  const int tid = threadIdx.x;
  int64_t top = kI64Min, bot = INT64_MAX;
  for (int i = tid; i < V; i += kSampleThreads) top = imax(top, logits[i]), bot = imin(bot, logits[i]);
  top = block_max(top, kI64Min, red);
  bot = -block_max(-bot, kI64Min, red);
  int64_t total = 0, live = 0, keep_m = 0;
  for (int i = tid; i < V; i += kSampleThreads) {
    const int64_t w = sample_weight(top, logits[i], t_num, t_den);  // <= 2^30
    wbuf[i] = (int32_t)w;
    total += w;
    live += w > 0 ? 1 : 0;
    keep_m += w > 0 && w * m_den >= (m_num << 30) ? 1 : 0;  // min-p (w m_den < 2^50)
  }
  total = block_sum(total, red);  // >= 2^30 (the top token)
  live = block_sum(live, red);
  keep_m = block_sum(keep_m, red);
  // The cuts: n ranks of the order kept, total their weight.
  int64_t n = top_k > 0 && top_k < live ? top_k : live;
  if (n < live) total = sample_cum(logits, wbuf, V, bot, top, n, t_num, t_den, red);
  if (p_num != p_den) {  // S(bot) p_den >= total p_num > S(top + 1) p_den = 0
    int64_t lo = bot, hi = top + 1, s_hi = 0, c_hi = 0, c_lo = live;
    while (hi - lo > 1) {  // block-uniform
      const int64_t mid = lo + ((hi - lo) >> 1);
      int64_t sm, c;
      sample_pass(logits, wbuf, V, mid, &sm, &c, red);
      if (mul_ge(sm, p_den, total, p_num))
        lo = mid, c_lo = c;
      else
        hi = mid, s_hi = sm, c_hi = c;
    }
    const int64_t wp = sample_weight(top, lo, t_num, t_den);
    int64_t a = 0, b = c_lo - c_hi;  // the fewest m in (a, b] of logit lo's ties: (s_hi + m wp) p_den >= X
    while (b - a > 1) {
      const int64_t mid = a + ((b - a) >> 1);
      if (mul_ge(s_hi + mid * wp, p_den, total, p_num))
        b = mid;
      else
        a = mid;
    }
    const int64_t np = c_hi + b;
    if (np < n) n = np, total = s_hi + b * wp;
  }
  if (m_num) {
    const int64_t nm = keep_m > 1 ? keep_m : 1;
    if (nm < n) n = nm, total = sample_cum(logits, wbuf, V, bot, top, n, t_num, t_den, red);
  }
  const int64_t target = (int64_t)mul_hi64(draw, (unsigned long long)total);
  // v* in [bot, top]: S(bot) >= total > target, S(top + 1) = 0 <= target.
  int64_t lo = bot, hi = top + 1, s_hi = 0;
  while (hi - lo > 1) {  // block-uniform
    const int64_t mid = lo + ((hi - lo) >> 1);
    int64_t sm = 0;
    for (int i = tid; i < V; i += kSampleThreads)
      if (logits[i] >= mid) sm += wbuf[i];
    sm = block_sum(sm, red);
    if (sm > target)
      lo = mid;
    else
      hi = mid, s_hi = sm;
  }
  const int64_t ws = sample_weight(top, lo, t_num, t_den);  // > 0: S(v*) > target >= S(v* + 1)
  const int64_t j = floor_div(target - s_hi, ws);  // the j-th (from 0) id of logit v*
  // The smallest x with #{i < x : l_i = v*} > j; that token is x - 1.
  int64_t a = 0, b = V;  // count(a) <= j < count(b)
  while (b - a > 1) {
    const int64_t mid = a + ((b - a) >> 1);
    int64_t c = 0;
    for (int i = tid; i < mid; i += kSampleThreads) c += logits[i] == lo ? 1 : 0;
    c = block_sum(c, red);
    if (c > j)
      b = mid;
    else
      a = mid;
  }
  if (tid == 0) *token = (int32_t)a;
}

// ---------------------------------------------------------------- linear layers

__device__ __forceinline__ void store_out(int32_t* o, int64_t v, bool residual) {
  *o = (int32_t)(residual ? sat32((int64_t)*o + v) : v);
}

// End of a GEMV warp (one output channel j, rows t0..t0+nt-1): the lanes'
// partial dots summed, then lane 0 applies the epilogue.
template <int TT>
__device__ __forceinline__ void gemv_store(int64_t (&acc)[TT], int lane, int nt, int t0, int64_t j,
                                           const int32_t* __restrict__ e, const int32_t* __restrict__ mant,
                                           const int32_t* __restrict__ shift, const int32_t* __restrict__ bias,
                                           int32_t* __restrict__ out, int64_t ldo, int residual) {
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = warp_sum(acc[tt]);
  if (lane == 0) {
    const int32_t mj = mant[j], sj = shift[j];
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      if (tt < nt) {
        const int64_t t = t0 + tt;
        store_out(out + t * ldo + j, linear_epilogue(acc[tt], mj, sj, e[t], bias, j), residual);
      }
    }
  }
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

constexpr int kGemvWarps = 4;

// Decode GEMV: each output channel j is served by wpc = 1 << wlg warps of one
// block (split-K inside the block: warp part p takes 16-byte chunks
// [p cpw, (p + 1) cpw) of the row), rows t0..t0+TT-1 (blockIdx.y). Each lane
// issues kGemvUnroll independent 16-byte weight loads before it uses any, so
// a warp keeps 32 * kGemvUnroll loads in flight. Every dot16 is exact in
// int32 (16 products < 2^26) and goes straight into an int64 accumulator;
// the split parts are added in int64 through shared memory, so any split
// gives the same sum. vec: K % 16 == 0 (aligned 16-byte loads of w and q
// rows); otherwise scalar loads and wlg = 0.
constexpr int kGemvUnroll = 4;

// The fields of segment si of a GemvSegs (no dynamic index into the kernel
// parameters: that would copy them to local memory).
__device__ __forceinline__ GemvSeg seg_at(const GemvSegs& s, int si) {
  return si == 0 ? s.s[0] : si == 1 ? s.s[1] : s.s[2];
}

// Several linear layers on the same input in one launch (segments: q, k, v;
// or gate and up): blocks 0..s[0].blocks-1 serve segment 0, and so on. In
// GLU mode (two segments of the same N: gate and up) every block serves the
// same channels of both, warps (slots) alternating gate / up, and the gate's
// lane applies SwiGLU or GeGLU to the pair: glu_out[t, j] (Q32 int64).
template <int TT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K, const GemvSegs segs,
                int residual, int vec, int wlg, int cpw, const NormAfter na) {
  __shared__ int64_t part[kGemvWarps][TT];
  __shared__ int32_t gluv[kGemvWarps][TT];
  __shared__ int64_t red[33];
  __shared__ int flag;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int p = warp & ((1 << wlg) - 1), slot = warp >> wlg, nslot = kGemvWarps >> wlg;
  int si = 0, b = blockIdx.x;
  int64_t j;
  if (segs.glu) {
    si = slot & 1;
    j = (int64_t)b * (nslot >> 1) + (slot >> 1);
  } else {
    while (si + 1 < segs.n && b >= seg_at(segs, si).blocks) b -= seg_at(segs, si++).blocks;  // block-uniform
    j = (int64_t)b * nslot + slot;
  }
  const GemvSeg S = seg_at(segs, si);
  const int N = S.N;
  const bool valid = j < N;
  const int t0 = blockIdx.y * TT;
  const int nt = T - t0 < TT ? T - t0 : TT;
  const int8_t* wj = S.w + (valid ? j : 0) * K;
  const int16_t* q0 = q + (int64_t)t0 * K;
  int64_t acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0;
  if (valid && vec) {
    const int C = K >> 4;
    const int c0 = p * cpw, c1 = c0 + cpw < C ? c0 + cpw : C;
    for (int c = c0 + lane; c < c1; c += 32 * kGemvUnroll) {
      int4 wv[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u)
        wv[u] = c + 32 * u < c1 ? load16(wj + 16 * (int64_t)(c + 32 * u)) : make_int4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        if (c + 32 * u < c1) {
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) {
            if (tt < nt) {
              const int16_t* ap = q0 + (int64_t)tt * K + 16 * (c + 32 * u);
              acc[tt] += dot16(load16(ap), load16(ap + 8), wv[u]);
            }
          }
        }
      }
    }
  } else if (valid) {
    for (int k = lane; k < K; k += 32) {
      const int32_t wk = wj[k];
#pragma unroll
      for (int tt = 0; tt < TT; ++tt)
        if (tt < nt) acc[tt] += (int32_t)q0[(int64_t)tt * K + k] * wk;
    }
  }
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = warp_sum(acc[tt]);
  if (wlg) {  // grid-uniform: add the K parts of each channel in int64
    if (lane == 0)
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) part[warp][tt] = acc[tt];
    __syncthreads();
    if (p == 0)
      for (int q2 = 1; q2 < (1 << wlg); ++q2)
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) acc[tt] += part[warp + q2][tt];
  }
  const bool head = valid && p == 0 && lane == 0;  // the lane that owns channel j's result
  if (head) {
    const int32_t mj = S.mant[j], sj = S.shift[j];
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      if (tt < nt) {
        const int64_t t = t0 + tt;
        const int64_t v = linear_epilogue(acc[tt], mj, sj, e[t], S.bias, j);
        store_out(S.out + t * S.ldo + j, v, residual);
        gluv[warp][tt] = (int32_t)v;
      }
    }
  }
  if (na.counter) {  // grid-uniform: the next RMSNorm + quant16 of the rows just written, by the last block
    if (!last_block_arrives(na.counter + blockIdx.y, gridDim.x, &flag)) return;
    INTDET_DYN_SMEM(int32_t, y_s);
    for (int tt = 0; tt < nt; ++tt) {
      const int64_t t = t0 + tt;
      const int32_t* xr = S.out + t * S.ldo;  // the residual row (other blocks wrote it: read from L2)
      for (int i = threadIdx.x; i < na.n; i += blockDim.x) y_s[i] = load_cg(xr + i);
      __syncthreads();
      norm_row(y_s, na.g, na.n, na.eps_q60, na.in_frac, y_s, red);  // in place: each thread reads x[i], then writes y[i]
      if (na.normed)
        for (int i = threadIdx.x; i < na.n; i += blockDim.x) na.normed[t * na.n + i] = y_s[i];
      const int ex = quant16_block(y_s, na.n, na.q + t * na.n, red);
      if (threadIdx.x == 0) na.e[t] = ex;
      __syncthreads();  // y_s and red are reused by the next row
    }
    return;
  }
  if (!segs.glu) return;  // grid-uniform
  __syncthreads();
  if (head && si == 0) {  // the gate's slot; the up slot of the same channel is the next one
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
      if (tt < nt)
        segs.glu_out[(t0 + tt) * segs.glu_ldo + j] =
            glu_one(gluv[warp][tt], gluv[warp + (1 << wlg)][tt], segs.glu == 2);
  }
  if constexpr (TT <= kNormFoldRows) {  // the launcher folds quant16 for <= 2 rows only (no code, no spills, in TT 4, 8)
    if (!segs.quant_counter) return;  // grid-uniform: quant16 of the GLU rows by the last block
    if (!last_block_arrives(segs.quant_counter + blockIdx.y, gridDim.x, &flag)) return;
    INTDET_DYN_SMEM(int64_t, a_s);
    for (int tt = 0; tt < nt; ++tt) {
      const int64_t t = t0 + tt;
      const int64_t* ar = segs.glu_out + t * segs.glu_ldo;  // other blocks wrote it: read from L2
      for (int i = threadIdx.x; i < N; i += blockDim.x) a_s[i] = load_cg(ar + i);
      __syncthreads();
      const int ex = quant16_block(a_s, N, segs.quant_q + t * N, red);
      if (threadIdx.x == 0) segs.quant_e[t] = ex;
      __syncthreads();  // a_s and red are reused by the next row
    }
  }
}

// Prefill GEMM: 64 rows x 64 channels per block of 256 threads, K in tiles of
// 32; each thread owns a 4 x 4 micro-tile (rows ty + 16 r, channels tx + 16 c).
// int32 partials over 8 tiles (256 products), then int64.
constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kTilesPerPart = 8;

__global__ void __launch_bounds__(256)
    gemm_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K,
                const int8_t* __restrict__ w, const int32_t* __restrict__ mant, const int32_t* __restrict__ shift,
                const int32_t* __restrict__ bias, int N, int32_t* __restrict__ out, int64_t ldo, int residual,
                int vec) {
  __shared__ __align__(16) int32_t As[kTileM][kTileK / 2 + 1];  // int16 pairs (+1 word pad)
  __shared__ __align__(16) int32_t Bs[kTileN][kTileK / 4 + 1];  // int8 quads (+1 word pad)
  int16_t* As16 = reinterpret_cast<int16_t*>(&As[0][0]);
  int8_t* Bs8 = reinterpret_cast<int8_t*>(&Bs[0][0]);
  constexpr int kAStride16 = 2 * (kTileK / 2 + 1), kBStride8 = 4 * (kTileK / 4 + 1);
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t t0 = (int64_t)blockIdx.y * kTileM, j0 = (int64_t)blockIdx.x * kTileN;
  int64_t acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0;
  for (int64_t kb = 0; kb < K; kb += (int64_t)kTileK * kTilesPerPart) {
    int32_t part[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) part[r][c] = 0;
    for (int kt = 0; kt < kTilesPerPart; ++kt) {
      const int64_t k0 = kb + (int64_t)kt * kTileK;
      if (k0 >= K) break;  // block-uniform
      if (vec) {  // K % 16 == 0: whole 8- and 16-element chunks are in or out
        {
          const int r = tid >> 2, c = (tid & 3) * 8;
          const int64_t t = t0 + r;
          int4 v = make_int4(0, 0, 0, 0);
          if (t < T && k0 + c < K) v = load16(q + t * K + k0 + c);
          int32_t* dst = &As[r][c >> 1];
          dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
        }
        if (tid < 128) {
          const int r = tid >> 1, c = (tid & 1) * 16;
          const int64_t j = j0 + r;
          int4 u = make_int4(0, 0, 0, 0);
          if (j < N && k0 + c < K) u = load16(w + j * K + k0 + c);
          int32_t* dst = &Bs[r][c >> 2];
          dst[0] = u.x, dst[1] = u.y, dst[2] = u.z, dst[3] = u.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < (kTileM * kTileK) / 256; ++i) {
          const int idx = tid + 256 * i, r = idx >> 5, c = idx & 31;
          const int64_t k = k0 + c, t = t0 + r, j = j0 + r;
          As16[r * kAStride16 + c] = (t < T && k < K) ? q[t * K + k] : (int16_t)0;
          Bs8[r * kBStride8 + c] = (j < N && k < K) ? w[j * K + k] : (int8_t)0;
        }
      }
      __syncthreads();
#pragma unroll
      for (int kw = 0; kw < kTileK / 4; ++kw) {
        int32_t alo[4], ahi[4], b[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) alo[r] = As[ty + 16 * r][2 * kw], ahi[r] = As[ty + 16 * r][2 * kw + 1];
#pragma unroll
        for (int c = 0; c < 4; ++c) b[c] = Bs[tx + 16 * c][kw];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) part[r][c] = __dp2a_hi(ahi[r], b[c], __dp2a_lo(alo[r], b[c], part[r][c]));
      }
      __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] += part[r][c];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t t = t0 + ty + 16 * r;
    if (t >= T) continue;
    const int32_t et = e[t];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t j = j0 + tx + 16 * c;
      if (j < N) store_out(out + t * ldo + j, linear_epilogue(acc[r][c], mant[j], shift[j], et, bias, j), residual);
    }
  }
}

// ---------------------------------------------------------------- tensor-core (IMMA) prefill GEMM
//
// Each int16 activation is split exactly as x = 256 hi + lo, hi = x >> 8 (s8,
// -128..127) and lo = x & 255 (u8): mma.sync m16n8k32 s8 x s8 and u8 x s8
// give two s32 sums per output, and 256 * hi_sum + lo_sum in int64 is the
// exact sum of x * w, the CPU's. K-chunk bound: one product is at most
// 128 * 128 = 2^14 (hi) or 255 * 128 < 2^15 (lo) in magnitude, so 65536
// products stay below 2^31 in s32; the s32 sums are added into int64 every
// kMmaFlushK = 32768 inputs (and at the end).
//
// Block: 64 rows x 64 channels, 4 warps of 32 x 32 (2 m16 x 4 n8 tiles each),
// K tiles of 64 in shared memory (hi, lo and w bytes, rows of 80 bytes so the
// fragment reads of a warp hit 32 different banks). The fragment layout is
// the PTX ISA's for m16n8k32 .s8/.u8 (emu.h emulates it lane by lane).
constexpr int kMmaM = 64, kMmaN = 64, kMmaK = 64, kMmaThreads = 128, kMmaRow = kMmaK + 16;
constexpr int64_t kMmaFlushK = 32768;

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

__global__ void __launch_bounds__(kMmaThreads)
    mma_gemm_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K,
                    const int8_t* __restrict__ w, const int32_t* __restrict__ mant, const int32_t* __restrict__ shift,
                    const int32_t* __restrict__ bias, int N, int32_t* __restrict__ out, int64_t ldo, int residual,
                    int vec) {
  __shared__ __align__(16) uint8_t Ah[kMmaM * kMmaRow];  // hi bytes of the activations [row][k]
  __shared__ __align__(16) uint8_t Al[kMmaM * kMmaRow];  // lo bytes
  __shared__ __align__(16) uint8_t Bs[kMmaN * kMmaRow];  // weights [channel][k]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
  const int64_t t0 = (int64_t)blockIdx.y * kMmaM, j0 = (int64_t)blockIdx.x * kMmaN;
  int64_t acc[2][4][4];
  int32_t ph[2][4][4], pl[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0, ph[mt][nt][r] = 0, pl[mt][nt][r] = 0;
  int64_t since = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kMmaK) {
    if (vec) {  // K % 16 == 0: whole 8-element activation and 16-byte weight chunks are in or out
#pragma unroll
      for (int i = 0; i < (kMmaM * kMmaK / 8) / kMmaThreads; ++i) {
        const int idx = tid + kMmaThreads * i, r = idx >> 3, c = (idx & 7) * 8;
        const int64_t t = t0 + r;
        int4 v = make_int4(0, 0, 0, 0);
        if (t < T && k0 + c < K) v = load16(q + t * K + k0 + c);
        // bytes of (v.x, v.y): lo(x0) hi(x0) lo(x1) hi(x1) lo(x2) ...: lo = bytes 0 2 4 6, hi = 1 3 5 7
        uint32_t* lo = reinterpret_cast<uint32_t*>(Al + r * kMmaRow + c);
        uint32_t* hi = reinterpret_cast<uint32_t*>(Ah + r * kMmaRow + c);
        lo[0] = __byte_perm((unsigned)v.x, (unsigned)v.y, 0x6420);
        lo[1] = __byte_perm((unsigned)v.z, (unsigned)v.w, 0x6420);
        hi[0] = __byte_perm((unsigned)v.x, (unsigned)v.y, 0x7531);
        hi[1] = __byte_perm((unsigned)v.z, (unsigned)v.w, 0x7531);
      }
#pragma unroll
      for (int i = 0; i < (kMmaN * kMmaK / 16) / kMmaThreads; ++i) {
        const int idx = tid + kMmaThreads * i, r = idx >> 2, c = (idx & 3) * 16;
        const int64_t j = j0 + r;
        int4 u = make_int4(0, 0, 0, 0);
        if (j < N && k0 + c < K) u = load16(w + j * K + k0 + c);
        *reinterpret_cast<int4*>(Bs + r * kMmaRow + c) = u;
      }
    } else {
      for (int idx = tid; idx < kMmaM * kMmaK; idx += kMmaThreads) {
        const int r = idx / kMmaK, c = idx % kMmaK;  // constant divisor: shifts
        const int64_t k = k0 + c, t = t0 + r, j = j0 + r;
        const int32_t x = (t < T && k < K) ? q[t * K + k] : 0;
        Ah[r * kMmaRow + c] = (uint8_t)((x >> 8) & 0xff);
        Al[r * kMmaRow + c] = (uint8_t)(x & 0xff);
        Bs[r * kMmaRow + c] = (uint8_t)((j < N && k < K) ? w[j * K + k] : 0);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 32) {
      uint32_t b[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint8_t* p = Bs + (wn + nt * 8 + g) * kMmaRow + kk + 4 * tq;
        b[nt][0] = smem_u32(p);
        b[nt][1] = smem_u32(p + 16);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int o0 = (wm + mt * 16 + g) * kMmaRow + kk + 4 * tq, o8 = o0 + 8 * kMmaRow;
        const uint32_t ahi[4] = {smem_u32(Ah + o0), smem_u32(Ah + o8), smem_u32(Ah + o0 + 16), smem_u32(Ah + o8 + 16)};
        const uint32_t alo[4] = {smem_u32(Al + o0), smem_u32(Al + o8), smem_u32(Al + o0 + 16), smem_u32(Al + o8 + 16)};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          mma_s8s8(ph[mt][nt], ahi, b[nt]);
          mma_u8s8(pl[mt][nt], alo, b[nt]);
        }
      }
    }
    __syncthreads();
    since += kMmaK;
    if (since >= kMmaFlushK || k0 + kMmaK >= K) {  // block-uniform
      since = 0;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[mt][nt][r] += (int64_t)ph[mt][nt][r] * 256 + pl[mt][nt][r];
            ph[mt][nt][r] = 0, pl[mt][nt][r] = 0;
          }
    }
  }
  // C fragment: c[r] at row g (+ 8 for r >= 2), column 2 tq + (r & 1).
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t t = t0 + wm + mt * 16 + g + (r >= 2 ? 8 : 0);
      if (t >= T) continue;
      const int32_t et = e[t];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t j = j0 + wn + nt * 8 + 2 * tq + (r & 1);
        if (j < N)
          store_out(out + t * ldo + j, linear_epilogue(acc[mt][nt][r], mant[j], shift[j], et, bias, j), residual);
      }
    }
}

// ---------------------------------------------------------------- int4 (W4A16) linear layers
//
// Weights w = gd * u + gm per group of 32 inputs (docs/format.md), so
// sum_k a_k w_k = gd * S + gm * Q with S = sum a_k u_k, Q = sum a_k over the
// group: the same exact integer as the CPU's dot_i16_w4. S and Q are int32
// over one group only (|S| <= 32 * 32767 * 15 < 2^24, |Q| <= 32 * 32768 =
// 2^20), then gd * S + gm * Q goes into int64 (32 x 32 -> 64-bit products).

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

// Decode GEMV with int4 weights: one warp per output channel j, a lane per
// group of 32 inputs (one 16-byte load of codes, four of activations per row).
// K % 32 == 0 (the loader checks), so every load is aligned.
template <int TT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_w4_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K,
                   const uint8_t* __restrict__ w4, const int16_t* __restrict__ gd, const int16_t* __restrict__ gm,
                   const int32_t* __restrict__ mant, const int32_t* __restrict__ shift,
                   const int32_t* __restrict__ bias, int N, int32_t* __restrict__ out, int64_t ldo, int residual) {
  const int lane = threadIdx.x & 31;
  const int64_t j = (int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (j >= N) return;  // whole warps only; no block barrier below
  const int t0 = blockIdx.y * TT;
  const int nt = T - t0 < TT ? T - t0 : TT;
  const int G = K >> 5;
  const uint8_t* wj = w4 + j * (K >> 1);
  const int16_t* gdj = gd + j * G;
  const int16_t* gmj = gm + j * G;
  const int16_t* q0 = q + (int64_t)t0 * K;
  int64_t acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0;
  for (int g = lane; g < G; g += 32) {
    const int4 cv = load16(wj + 16 * g);
    const int4 u0 = codes16(cv.x, cv.y), u1 = codes16(cv.z, cv.w);
    const int32_t d = gdj[g], m = gmj[g];
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
      if (tt < nt) acc[tt] += group_dot_w4(q0 + (int64_t)tt * K + 32 * g, u0, u1, d, m);
  }
  gemv_store<TT>(acc, lane, nt, t0, j, e, mant, shift, bias, out, ldo, residual);
}

// ---------------------------------------------------------------- mixture of experts

// One thread per row: selection sort by (z descending, id ascending), each
// pick the best of the entries ordered after the previous pick (no scratch),
// then moe_route's softmax_q16 (softmax_q16_row's steps: exp2_neg_q30 of the
// distance to the max, 2^62 / total, round_shift by 62 - 16).
__global__ void moe_route_kernel(const int32_t* __restrict__ z, int T, int E, int k, int norm_topk,
                                 int32_t* __restrict__ sel, int64_t* __restrict__ wts) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int32_t* zt = z + (int64_t)t * E;
  int32_t* st = sel + (int64_t)t * k;
  int64_t* wt = wts + (int64_t)t * k;
  int prev = -1;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int x = 0; x < E; ++x) {
      const bool after = prev < 0 || zt[x] < zt[prev] || (zt[x] == zt[prev] && x > prev);
      if (after && (best < 0 || zt[x] > zt[best])) best = x;  // ascending x: the lowest id among equals
    }
    st[j] = best;
    prev = best;
  }
  const int64_t zmax = zt[st[0]];
  int64_t tot = 0;
  if (norm_topk)
    for (int j = 0; j < k; ++j) tot += exp2_neg_q30(zmax - zt[st[j]]);
  else
    for (int x = 0; x < E; ++x) tot += exp2_neg_q30(zmax - zt[x]);
  const int64_t r = floor_div((int64_t)1 << 62, tot);  // tot >= 2^30 - 4: the max term
  for (int j = 0; j < k; ++j) wt[j] = round_shift(exp2_neg_q30(zmax - zt[st[j]]) * r, 62 - kProbFrac);
}

// One warp per (gathered row i, output channel j): expert sel[i]'s weight
// row j against input row i / in_div; the lanes' int64 partials are summed
// exactly (warp_sum), so the value is launch_linear's for any split.
template <bool kW4>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_linear_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int row0, int rows, int in_div,
                      const MoeLinear L, const int32_t* __restrict__ sel, int32_t* __restrict__ out, int vec) {
  const int lane = threadIdx.x & 31;
  const int64_t j = (int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int i = row0 + (int)blockIdx.y;
  if (j >= L.N || i >= rows) return;  // whole warps only; no block barrier below
  const int K = L.K;
  const int64_t row = (int64_t)sel[i] * L.N + j;  // the expert's channel j
  const int64_t src = (int64_t)udiv_u64((uint64_t)i, (uint64_t)in_div);  // no '/' by a variable (file comment)
  const int16_t* a = q + src * K;
  int64_t acc = 0;
  if constexpr (kW4) {  // K % 32 == 0 (the loader checks): aligned group loads
    const int G = K >> 5;
    const uint8_t* wj = L.w4 + row * (K >> 1);
    for (int g = lane; g < G; g += 32) {
      const int4 cv = load16(wj + 16 * g);
      acc += group_dot_w4(a + 32 * g, codes16(cv.x, cv.y), codes16(cv.z, cv.w), L.gd[row * G + g], L.gm[row * G + g]);
    }
  } else if (vec) {  // K % 16 == 0: 16-byte loads of weights and activations
    const int8_t* wj = L.w + row * K;
    for (int c = lane; c < (K >> 4); c += 32) acc += dot16(load16(a + 16 * c), load16(a + 16 * c + 8), load16(wj + 16 * c));
  } else {
    const int8_t* wj = L.w + row * K;
    for (int c = lane; c < K; c += 32) acc += (int32_t)a[c] * wj[c];
  }
  acc = warp_sum(acc);
  if (lane == 0)
    out[(int64_t)i * L.N + j] =
        (int32_t)linear_epilogue(acc, L.mant[row], L.shift[row], e[src], nullptr, j);
}

__global__ void moe_combine_kernel(const int32_t* __restrict__ d, const int64_t* __restrict__ wts, int T, int k, int H,
                                   int32_t* __restrict__ x, int64_t* __restrict__ comb) {
  // a block per row t (strided), threads over h: no division by H
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      const int64_t idx = t * H + h;
      int64_t s = 0;  // |w| <= 2^16, |d| < 2^31, k small: exact in int64
      for (int j = 0; j < k; ++j) s += wts[t * k + j] * d[(t * k + j) * H + h];
      const int64_t v = round_shift(s, kProbFrac);
      if (comb) comb[idx] = v;
      x[idx] = (int32_t)sat32((int64_t)x[idx] + v);
    }
  }
}

// Prefill GEMM with int4 weights: gemm_kernel's 64 x 64 tiles and 4 x 4
// micro-tiles, one K tile = one group of 32. Codes are unpacked to int8 in
// shared memory, so the inner loop is gemm_kernel's __dp2a loop; per group
// each thread also sums its rows' activations (Q) and folds gd * S + gm * Q
// into int64.
__global__ void __launch_bounds__(256)
    gemm_w4_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K,
                   const uint8_t* __restrict__ w4, const int16_t* __restrict__ gd, const int16_t* __restrict__ gm,
                   const int32_t* __restrict__ mant, const int32_t* __restrict__ shift,
                   const int32_t* __restrict__ bias, int N, int32_t* __restrict__ out, int64_t ldo, int residual) {
  static_assert(kTileK == 32, "one K tile is one int4 group");
  __shared__ __align__(16) int32_t As[kTileM][kTileK / 2 + 1];  // int16 pairs (+1 word pad)
  __shared__ __align__(16) int32_t Bs[kTileN][kTileK / 4 + 1];  // codes as int8 quads (+1 word pad)
  __shared__ int32_t Gd[kTileN], Gm[kTileN];
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t t0 = (int64_t)blockIdx.y * kTileM, j0 = (int64_t)blockIdx.x * kTileN;
  const int G = K >> 5;
  const int64_t K2 = K >> 1;
  int64_t acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0;
  for (int g = 0; g < G; ++g) {
    const int64_t k0 = (int64_t)g * kTileK;
    {  // activations: 64 rows x 32 int16, 16 bytes per thread
      const int r = tid >> 2, c = (tid & 3) * 8;
      const int64_t t = t0 + r;
      int4 v = make_int4(0, 0, 0, 0);
      if (t < T) v = load16(q + t * K + k0 + c);
      int32_t* dst = &As[r][c >> 1];
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
    if (tid < kTileN) {  // codes of channel j0 + tid: 16 bytes -> 32 int8
      const int64_t j = j0 + tid;
      int4 cv = make_int4(0, 0, 0, 0);
      if (j < N) cv = load16(w4 + j * K2 + 16 * g);
      const int4 u0 = codes16(cv.x, cv.y), u1 = codes16(cv.z, cv.w);
      int32_t* dst = &Bs[tid][0];
      dst[0] = u0.x, dst[1] = u0.y, dst[2] = u0.z, dst[3] = u0.w;
      dst[4] = u1.x, dst[5] = u1.y, dst[6] = u1.z, dst[7] = u1.w;
    } else if (tid < 2 * kTileN) {  // the group's step and offset of channel j0 + tid - 64
      const int r = tid - kTileN;
      const int64_t j = j0 + r;
      Gd[r] = j < N ? gd[j * G + g] : 0;
      Gm[r] = j < N ? gm[j * G + g] : 0;
    }
    __syncthreads();
    int32_t s[4][4], sq[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      sq[r] = 0;
#pragma unroll
      for (int c = 0; c < 4; ++c) s[r][c] = 0;
    }
#pragma unroll
    for (int kw = 0; kw < kTileK / 4; ++kw) {
      int32_t alo[4], ahi[4], b[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) alo[r] = As[ty + 16 * r][2 * kw], ahi[r] = As[ty + 16 * r][2 * kw + 1];
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = Bs[tx + 16 * c][kw];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sq[r] = __dp2a_hi(ahi[r], kOnes8, __dp2a_lo(alo[r], kOnes8, sq[r]));
#pragma unroll
        for (int c = 0; c < 4; ++c) s[r][c] = __dp2a_hi(ahi[r], b[c], __dp2a_lo(alo[r], b[c], s[r][c]));
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t d = Gd[tx + 16 * c], m = Gm[tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r][c] += d * s[r][c] + m * sq[r];
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t t = t0 + ty + 16 * r;
    if (t >= T) continue;
    const int32_t et = e[t];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t j = j0 + tx + 16 * c;
      if (j < N) store_out(out + t * ldo + j, linear_epilogue(acc[r][c], mant[j], shift[j], et, bias, j), residual);
    }
  }
}

// grid (T, nh + 2 nkv): the q/k norm + RoPE of every q and k head and the KV
// append in one launch. Blocks y < nh: q head y in place; nh <= y < nh + nkv:
// k head y - nh in place, then quant8 into the cache; the rest: v heads'
// quant8 into the cache. The same per-head steps as norm_rope_kernel and
// kv_append_kernel (the k row is quantized after its RoPE, as there).
__global__ void __launch_bounds__(kHeadThreads)
    rope_append_kernel(int32_t* __restrict__ qb, int32_t* __restrict__ kb, const int32_t* __restrict__ vb, int nh,
                       int nkv, int D, const int16_t* __restrict__ q_norm, const int16_t* __restrict__ k_norm,
                       int64_t eps_q60, const int32_t* __restrict__ pos, const int16_t* __restrict__ cos,
                       const int16_t* __restrict__ sin, int layer, const int32_t* __restrict__ seq,
                       const DevKV* __restrict__ kvs) {
  __shared__ int32_t y[kMaxHeadDim];
  __shared__ int64_t red[33];
  const int64_t t = blockIdx.x;
  const int hy = blockIdx.y;
  if (hy < nh) {
    norm_rope_head(qb + (t * nh + hy) * D, D, q_norm, eps_q60, pos[t], cos, sin, y, red);
    return;
  }
  const DevKV kv = kvs[seq[t]];
  const int h = hy < nh + nkv ? hy - nh : hy - nh - nkv;
  const int64_t base = ((int64_t)layer * kv.max_len + pos[t]) * nkv + h;  // [L, P, nkv] index
  const int64_t src = (t * nkv + h) * D;
  if (hy < nh + nkv) {
    norm_rope_head(kb + src, D, k_norm, eps_q60, pos[t], cos, sin, y, red);
    __syncthreads();  // the rotated row, written by other threads, is quant8's input
    const int32_t a = quant8_block(kb + src, D, kv.k + base * D, red);
    if (threadIdx.x == 0) kv.ka[base] = a;
  } else {
    const int32_t a = quant8_block(vb + src, D, kv.v + base * D, red);
    if (threadIdx.x == 0) kv.va[base] = a;
  }
}

// ---------------------------------------------------------------- attention (flash-decoding)
//
// attend_head's steps, split over positions: the positions lo..pos of a row
// are cut into nsplit chunks of `chunk` positions, and one block serves one
// (chunk, kv head, row) for all grp query heads that share the kv head (GQA:
// each K and V row is read once for the group). Two kernels:
//
//  1. attn_scores_kernel: per chunk, z = attn_score(q . k) (16-byte K loads;
//     the group's int16 queries in shared memory) into the int32 scratch, and
//     the chunk's max per head into zpart. The last block of a (row, kv head)
//     to finish (an atomic counter, the threadFenceReduction pattern) runs
//     softmax_q16_row and the value weights for every position of the group's
//     heads: zmax = max of the chunk maxima; e = exp2(-(zmax - z)), tot =
//     sum e (int64); R = 2^62 / tot; p = round_shift(e R, 46); wmax = max p a_v;
//     s = bitlen(wmax) - 15; w16 = round_shift(p a_v, s), left in the scratch.
//  2. attn_pv_kernel: per chunk, sum_i w16_i v_i for the group's heads (16-byte
//     V loads), added into oacc (int64) with atomicAdd; the last block of a row
//     computes out = oacc << s for all heads (attn_out, int64) and quant16 of
//     the row (the o-projection's input), and zeroes oacc for the next use.
//
// Why this is exact and order-free: the three reductions that cross blocks are
// an int64 max (zmax, of int32 scores), an int64 sum (tot <= n 2^30 < 2^63)
// and int64 sums of P.V partials (|sum| <= n 32767 127 < 2^63); max and
// integer addition are associative and commutative, and no partial sum can
// overflow, so any order of blocks, lanes and atomics gives the same integer.
// Everything in between (exp2, R, p, w16) is the CPU's per-position formula on
// those exact values. Inside a block, int32 sums: q . k has D <= 256 products
// (< 2^31 for every subset), and one chunk's P.V for a dimension at most
// chunk <= kPvBlock = 512 products (512 * 32767 * 127 < 2^31), so the chunk's
// int32 sums are exact before they go into int64.

constexpr int kAttnThreads = 128;
constexpr int kMaxGroupDim = 4096;  // grp * D: the group's int16 queries in shared memory
constexpr int kMaxGroup = 16;

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

// grid (nsplit, nkv, nrows).
// What one block of attn_scores_kernel / attn_pv_kernel serves (grid:
// chunks x kv heads x rows): row t = row0 + blockIdx.z, kv head blockIdx.y
// and its grp query heads from h0, positions [i0, i1) of the row's n
// (counted from lo, the window's first position), and the cache offset lay
// of (layer, lo, kvh) in [L, P, nkv] rows (rs int8 elements between positions).
struct AttnBlock {
  int nsplit, split, kvh, h0;
  int64_t tl, t, lo, n, i0, i1, lay, rs;
  DevKV kv;
};

__device__ __forceinline__ AttnBlock attn_block(int row0, int nkv, int grp, int D, int layer,
                                                const int32_t* __restrict__ seq, const int32_t* __restrict__ pos,
                                                const DevKV* __restrict__ kvs, int chunk, int64_t window) {
  AttnBlock b;
  b.nsplit = gridDim.x, b.split = blockIdx.x, b.kvh = blockIdx.y, b.h0 = b.kvh * grp;
  b.tl = blockIdx.z, b.t = row0 + b.tl;
  b.kv = kvs[seq[b.t]];
  attn_range(pos[b.t], window, &b.lo, &b.n);
  b.i0 = (int64_t)b.split * chunk;
  b.i1 = b.i0 + chunk < b.n ? b.i0 + chunk : b.n;
  b.lay = ((int64_t)layer * b.kv.max_len + b.lo) * nkv + b.kvh;
  b.rs = (int64_t)nkv * D;
  return b;
}

// softmax_q16_row and the value weights of one (row, head), by the whole
// block: sc [n] holds the row's int32 scores (written by any block of this
// kernel: read through L2) and is left holding the int16 value weights w16;
// va [i * vstride] is position i's value scale, zmax the scores' maximum.
// Returns the weights' shift s (out = (sum w16 v) << s). Every thread
// touches the same positions i = tid + k blockDim.x in every pass.
__device__ int softmax_value_weights(int32_t* sc, int64_t n, const int32_t* __restrict__ va, int64_t vstride,
                                     int64_t zmax, int64_t* red) {
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t tot = 0;
  for (int64_t i = tid; i < n; i += nt) {
    const int64_t ev = exp2_neg_q30(zmax - load_cg(sc + i));  // <= 2^30
    sc[i] = (int32_t)ev;
    tot += ev;
  }
  tot = block_sum(tot, red);  // >= 2^30 - 4: the max term
  const int64_t R = floor_div((int64_t)1 << 62, tot);
  int64_t wmax = 0;
  for (int64_t i = tid; i < n; i += nt) {
    const int64_t p = round_shift((int64_t)sc[i] * R, 62 - kProbFrac);  // <= 2^16
    sc[i] = (int32_t)p;
    wmax = imax(wmax, p * va[i * vstride]);  // < 2^47
  }
  wmax = block_max(wmax, 0, red);
  const int s = (int)imax(bitlen(wmax) - 15, 0);
  for (int64_t i = tid; i < n; i += nt)
    sc[i] = (int32_t)clamp(round_shift((int64_t)sc[i] * va[i * vstride], s), -kInt16QMax, kInt16QMax);
  return s;
}

__global__ void __launch_bounds__(kAttnThreads)
    attn_scores_kernel(const int32_t* __restrict__ qbuf, int row0, int nh, int nkv, int grp, int D, int layer,
                       const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, const DevKV* __restrict__ kvs,
                       int64_t score_mant, int64_t score_shift, int32_t* __restrict__ scratch, int64_t sstride,
                       int64_t* __restrict__ zpart, int chunk, int* __restrict__ cnt, int32_t* __restrict__ sarr,
                       int64_t window, RopeFold rf, Softcap cap) {
  __shared__ __align__(16) int16_t qq[kMaxGroupDim];
  __shared__ int eq[kMaxGroup];
  __shared__ int64_t red[33];
  __shared__ int flag;
  __shared__ int32_t hrow[kMaxHeadDim], hy[kMaxHeadDim];  // rf.on: a head after q/k norm + RoPE; norm_rope's y
  __shared__ __align__(16) int8_t k8[kMaxHeadDim];  // rf.on: the appended K row (this block's own position)
  __shared__ int32_t k8a;
  const int tid = threadIdx.x, lane = tid & 31;
  const AttnBlock ab = attn_block(row0, nkv, grp, D, layer, seq, pos, kvs, chunk, window);
  const int nsplit = ab.nsplit, split = ab.split, kvh = ab.kvh, h0 = ab.h0;
  const int64_t tl = ab.tl, t = ab.t, n = ab.n, i0 = ab.i0, i1 = ab.i1, lay = ab.lay, rs = ab.rs;
  const DevKV kv = ab.kv;
  const int8_t* kb = kv.k + lay * D;
  // rope_append folded in (decode, one row per sequence): the block whose
  // chunk holds the row's own position appends K and V there first, and
  // reads that K row from shared memory (never through __ldg: it wrote it).
  const bool own = rf.on && i0 <= n - 1 && n - 1 < i1;  // block-uniform

  if (own) {
    const int64_t base = ((int64_t)layer * kv.max_len + pos[t]) * nkv + kvh;  // [L, P, nkv] index
    const int64_t src = (t * nkv + kvh) * D;
    for (int d = tid; d < D; d += blockDim.x) hrow[d] = rf.kb[src + d];
    __syncthreads();
    norm_rope_head(hrow, D, rf.k_norm, rf.eps_q60, pos[t], rf.cos, rf.sin, hy, red);
    __syncthreads();
    const int32_t a = quant8_block(hrow, D, k8, red);
    __syncthreads();
    for (int d = tid; d < D; d += blockDim.x) kv.k[base * D + d] = k8[d];
    const int32_t av = quant8_block(rf.vb + src, D, kv.v + base * D, red);
    if (tid == 0) kv.ka[base] = a, kv.va[base] = av, k8a = a;
    __syncthreads();
  }
  if (i0 < n) {  // block-uniform
    // 1. The group's query heads to int16 (quant16_row of each; rf.on: after q norm + RoPE).
    for (int g = 0; g < grp; ++g) {
      const int32_t* qr = qbuf + (t * nh + h0 + g) * D;
      if (rf.on) {
        __syncthreads();  // the previous head's reads of hrow are done
        for (int d = tid; d < D; d += blockDim.x) hrow[d] = qr[d];
        __syncthreads();
        norm_rope_head(hrow, D, rf.q_norm, rf.eps_q60, pos[t], rf.cos, rf.sin, hy, red);
        __syncthreads();
        qr = hrow;
      }
      int64_t m = 0;
      for (int d = tid; d < D; d += blockDim.x) m = imax(m, iabs(qr[d]));
      m = block_max(m, 0, red);
      const int e_q = (int)imax(bitlen(m) - 15, 0);
      for (int d = tid; d < D; d += blockDim.x) qq[g * D + d] = (int16_t)clamp(round_shift(qr[d], e_q), -kInt16QMax, kInt16QMax);
      if (tid == 0) eq[g] = e_q;
    }
    __syncthreads();
    // 2. Scores: L lanes per position, slots positions per pass of the block.
    const bool vec = D % 16 == 0;
    const int lg = attn_lanes_log2(D, vec), L = 1 << lg, sub = lane & (L - 1), slots = kAttnThreads >> lg, slot = tid >> lg;
    for (int64_t ib = i0; ib < i1; ib += slots) {  // block-uniform bounds: every lane shuffles
      const int64_t i = ib + slot;
      const bool ok = i < i1;
      const bool mine = own && i == n - 1;  // the K row this block appended: from shared memory
      const int8_t* kr = mine ? k8 : kb + (ok ? i : i0) * rs;
      int4 kv16 = make_int4(0, 0, 0, 0);
      if (vec && ok && sub * 16 < D) kv16 = mine ? load16_shared(kr + sub * 16) : load16(kr + sub * 16);
      for (int g = 0; g < grp; ++g) {
        int32_t raw = 0;
        if (vec) {
          if (ok && sub * 16 < D) {
            const int16_t* qp = qq + g * D + sub * 16;
            raw = dot16(load16_shared(qp), load16_shared(qp + 8), kv16);
          }
        } else if (ok) {
          for (int d = sub; d < D; d += 32) raw += (int32_t)qq[g * D + d] * (int32_t)kr[d];
        }
        raw = group_sum32(raw, L);  // |q . k| <= 2^15 * 127 * 256 < 2^31
        if (ok && sub == 0) {
          const int64_t z = attn_score(raw, mine ? k8a : kv.ka[lay + i * nkv], eq[g], score_mant, score_shift);  // sat32
          scratch[(tl * nh + h0 + g) * sstride + i] = (int32_t)(cap.cap ? softcap(z, cap) : z);  // Gemma 2
        }
      }
    }
    __syncthreads();  // the block's scores are visible to the block
    for (int g = 0; g < grp; ++g) {
      const int32_t* sc = scratch + (tl * nh + h0 + g) * sstride;
      int64_t m = kI64Min;
      for (int64_t i = i0 + tid; i < i1; i += kAttnThreads) m = imax(m, (int64_t)sc[i]);
      m = block_max(m, kI64Min, red);
      if (tid == 0) zpart[(tl * nh + h0 + g) * nsplit + split] = m;
    }
  }
  if (!last_block_arrives(cnt + tl * nkv + kvh, nsplit, &flag)) return;

  // 3. The last block: softmax_q16_row and the value weights, per head of the group.
  const int32_t* vab = kv.va + lay;
  for (int g = 0; g < grp; ++g) {
    const int64_t hr = tl * nh + h0 + g;
    int32_t* sc = scratch + hr * sstride;
    int64_t zmax = kI64Min;
    for (int b = tid; b < nsplit; b += kAttnThreads)
      if ((int64_t)b * chunk < n) zmax = imax(zmax, load_cg(zpart + hr * nsplit + b));
    zmax = block_max(zmax, kI64Min, red);
    const int s = softmax_value_weights(sc, n, vab, nkv, zmax, red);
    if (tid == 0) sarr[hr] = s;
    __syncthreads();  // before red and the next head's loops reuse shared state
  }
}

// grid (nsplit, nkv, nrows). oacc [nrows, nh, D] int64 is zero on entry (and
// is left zero); out [T, nh, D] int64 and (act, act_e) = quant16 of each row.
__global__ void __launch_bounds__(kAttnThreads)
    attn_pv_kernel(int row0, int nh, int nkv, int grp, int D, int layer, const int32_t* __restrict__ seq,
                   const int32_t* __restrict__ pos, const DevKV* __restrict__ kvs,
                   const int32_t* __restrict__ scratch, int64_t sstride, const int32_t* __restrict__ sarr, int chunk,
                   unsigned long long* __restrict__ oacc, int* __restrict__ cnt, int64_t* __restrict__ out,
                   int16_t* __restrict__ act, int32_t* __restrict__ act_e, int64_t window) {
  __shared__ int32_t pvs[kAttnThreads * 16];  // slots x D partials (slots * D <= 16 * kAttnThreads)
  __shared__ int64_t red[33];
  __shared__ int flag;
  const int tid = threadIdx.x, lane = tid & 31;
  const AttnBlock ab = attn_block(row0, nkv, grp, D, layer, seq, pos, kvs, chunk, window);
  const int nsplit = ab.nsplit, split = ab.split, kvh = ab.kvh, h0 = ab.h0;
  const int64_t tl = ab.tl, t = ab.t, n = ab.n, i0 = ab.i0, i1 = ab.i1, lay = ab.lay, rs = ab.rs;
  const DevKV kv = ab.kv;
  const int8_t* vb = kv.v + lay * D;
  const bool vec = D % 16 == 0;
  const int lg = attn_lanes_log2(D, vec), L = 1 << lg, sub = lane & (L - 1), slots = kAttnThreads >> lg, slot = tid >> lg;

  if (i0 < n) {  // block-uniform
    for (int g = 0; g < grp; ++g) {
      const int32_t* w16 = scratch + (tl * nh + h0 + g) * sstride;
      int32_t acc[16];  // vec: dims 16 sub + j; scalar: dims sub + 32 j (j < 8)
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = 0;
      for (int64_t i = i0 + slot; i < i1; i += slots) {  // at most chunk <= 512 products per dim
        const int32_t wi = w16[i];
        const int8_t* vr = vb + i * rs;
        if (vec) {
          if (sub * 16 < D) {
            const int4 v = load16(vr + sub * 16);
            const int32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 16; ++j) acc[j] += wi * (int32_t)(int8_t)(wd[j >> 2] >> (8 * (j & 3)));
          }
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (sub + 32 * j < D) acc[j] += wi * (int32_t)vr[sub + 32 * j];
        }
      }
      // The chunk's sum per dim over the slots: int32, at most chunk products.
      if (vec) {
        if (sub * 16 < D)
#pragma unroll
          for (int j = 0; j < 16; ++j) pvs[slot * D + sub * 16 + j] = acc[j];
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (sub + 32 * j < D) pvs[slot * D + sub + 32 * j] = acc[j];
      }
      __syncthreads();
      for (int d = tid; d < D; d += kAttnThreads) {
        int32_t sum = 0;
        for (int k = 0; k < slots; ++k) sum += pvs[k * D + d];
        atomicAdd(oacc + (tl * nh + h0 + g) * D + d, (unsigned long long)(int64_t)sum);  // two's complement: exact
      }
      __syncthreads();
    }
  }
  if (!last_block_arrives(cnt + tl, nsplit * nkv, &flag)) return;

  // The last block of the row: out = oacc << s per head, then quant16 of the row.
  const int HD = nh * D;
  int64_t* o = out + t * HD;
  unsigned long long* oa = oacc + tl * HD;
  for (int h = 0; h < nh; ++h) {  // (no '/' by a variable: nvcc lowers it through float hardware)
    const int s = sarr[tl * nh + h];
    for (int d = tid; d < D; d += kAttnThreads) {
      o[h * D + d] = shl((int64_t)load_cg(oa + h * D + d), s);
      oa[h * D + d] = 0;
    }
  }
  __syncthreads();
  const int ex = quant16_block(o, HD, act + t * HD, red);
  if (tid == 0) act_e[t] = ex;
}

// ---------------------------------------------------------------- prefill attention on the tensor cores
//
// attn_mma_kernel: grid (tiles, nkv), one block per tile of the CPU's form
// (csrc/model/attention.cpp): P consecutive rows of the launch times the grp
// query heads of one KV head, tile row r = i grp + j (row i, head h0 + j),
// at most kAmRows = 16 (the mma's M). Rows of different sequences in one
// tile are served one run of equal sequence after another. Per run:
//  1. each tile row's query quant16 (quant16_row) into shared memory, split
//     exactly into hi = q >> 8 (s8) and lo = q & 255 (u8);
//  2. QK^T: keys in steps of kAmKeys; mma.m16n8k32 hi x K (s8.s8) and lo x K
//     (u8.s8) over D (padded to 32 with zeros), raw = 256 hi + lo, then
//     attn_score, stored for the row's own positions [lo, pos] in the
//     scratch (the split kernels' layout);
//  3. per tile row, softmax_value_weights (the same function as the split
//     kernels): the int16 value weights w16 in the scratch, the shift s;
//  4. P.V: w16 split the same way (hi s8, lo u8; zero outside the row's
//     positions) against V^T (s8, staged transposed in shared memory so a B
//     fragment is 4 consecutive bytes), into s32, 256 hi + lo into int64;
//  5. out = acc << s (attn_out). quant16 of each row follows in its own launch.
//
// Exact: q . k = 256 sum hi k + sum lo k, with |sum| <= 256 * 255 * 128 in
// s32 for D <= 256; the P.V products are at most 128 * 128 (hi) and
// 255 * 128 < 2^15 (lo) in magnitude, so 65536 keys keep each s32 sum below
// 2^31 (65536 * 255 * 128 < 2^31); the kernel adds 256 hi + lo into int64
// every kAmFlush = 32768 keys and after the last step, half the bound.
// Scores, the softmax and the weights are the split kernels' per-position
// formulas, so the bits are attend_head's (tests: test_attend_rows_*).
constexpr int kAmRows = 16;                     // tile rows (mma M)
constexpr int kAmKeys = 64;                     // keys per step (two k32 of P.V, eight n8 of QK^T)
constexpr int kAmQRow = kMaxHeadDim + 16;       // bytes per query / key row in shared memory
constexpr int kAmVRow = kAmKeys + 16;           // bytes per V^T row (one dimension's keys)
constexpr int kAmKvBytes = kMaxHeadDim * kAmVRow > kAmKeys * kAmQRow ? kMaxHeadDim * kAmVRow : kAmKeys * kAmQRow;
constexpr int64_t kAmFlush = 32768;             // P.V keys per s32 flush (65536 keep it exact)
constexpr int kAmMaxNt = kMaxHeadDim / 32;      // P.V n8 tiles per warp (4 warps over D)

__global__ void __launch_bounds__(kAttnThreads)
    attn_mma_kernel(const int32_t* __restrict__ qbuf, int row0, int nrows, int nh, int nkv, int grp, int P, int D,
                    int layer, const int32_t* __restrict__ seq, const int32_t* __restrict__ pos,
                    const DevKV* __restrict__ kvs, int64_t score_mant, int64_t score_shift,
                    int32_t* __restrict__ scratch, int64_t sstride, int64_t* __restrict__ out, int64_t window,
                    Softcap cap) {
  __shared__ __align__(16) uint8_t Qh[kAmRows * kAmQRow];  // hi bytes of the queries [tile row][d]
  __shared__ __align__(16) uint8_t Ql[kAmRows * kAmQRow];  // lo bytes
  __shared__ __align__(16) uint8_t KV[kAmKvBytes];         // K [key][d], then V^T [d][key]
  __shared__ __align__(16) uint8_t Wh[kAmRows * kAmVRow];  // hi bytes of the value weights [tile row][key]
  __shared__ __align__(16) uint8_t Wl[kAmRows * kAmVRow];
  __shared__ int64_t rlo[kAmRows], rhi[kAmRows], rbase[kAmRows], red[33];
  __shared__ int rtl[kAmRows], rh[kAmRows], eq[kAmRows], sh[kAmRows], nR;
  __shared__ int64_t s01[2];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kvh = blockIdx.y, h0 = kvh * grp;
  const int tl0 = blockIdx.x * P;
  const int np = nrows - tl0 < P ? nrows - tl0 : P;
  const int Dp = (D + 31) & ~31;
  const bool vec = D % 16 == 0;
  const int HD = nh * D;
  for (int i0 = 0; i0 < np;) {  // one run of rows of the same sequence
    const int sq = seq[row0 + tl0 + i0];
    int i1 = i0 + 1;
    while (i1 < np && seq[row0 + tl0 + i1] == sq) ++i1;
    const DevKV kv = kvs[sq];
    const int64_t lay0 = (int64_t)layer * kv.max_len;  // cache row of (layer, position 0)
    if (tid == 0) {
      int r = 0;
      int64_t a = INT64_MAX, b = 0;
      for (int i = i0; i < i1; ++i)
        for (int j = 0; j < grp; ++j, ++r) {
          const int tl = tl0 + i;
          int64_t lo, n;
          attn_range(pos[row0 + tl], window, &lo, &n);
          rtl[r] = tl, rh[r] = h0 + j, rlo[r] = lo, rhi[r] = lo + n;
          rbase[r] = ((int64_t)tl * nh + h0 + j) * sstride;
          a = lo < a ? lo : a, b = lo + n > b ? lo + n : b;
        }
      nR = r, s01[0] = a, s01[1] = b;
    }
    __syncthreads();
    const int R = nR;
    const int64_t s0 = s01[0], s1 = s01[1];
    // 1. quant16 of each tile row's query (a warp per row), split into bytes.
    for (int r = warp; r < kAmRows; r += kAttnThreads / 32) {
      const int32_t* qr = r < R ? qbuf + ((int64_t)(row0 + rtl[r]) * nh + rh[r]) * D : nullptr;
      int64_t m = 0;
      if (qr)
        for (int d = lane; d < D; d += 32) m = imax(m, iabs((int64_t)qr[d]));
      m = warp_max(m);
      const int e_q = (int)imax(bitlen(m) - 15, 0);
      for (int d = lane; d < Dp; d += 32) {
        const int32_t x = qr && d < D ? (int32_t)clamp(round_shift((int64_t)qr[d], e_q), -kInt16QMax, kInt16QMax) : 0;
        Qh[r * kAmQRow + d] = (uint8_t)((x >> 8) & 0xff);
        Ql[r * kAmQRow + d] = (uint8_t)(x & 0xff);
      }
      if (lane == 0) eq[r] = e_q;
    }
    // 2. QK^T: eight n8 tiles (keys) per step, two per warp.
    for (int64_t k0 = s0; k0 < s1; k0 += kAmKeys) {
      __syncthreads();  // the queries are in (first step); the last step's K reads are done
      if (vec) {
        for (int idx = tid; idx < kAmKeys * (kMaxHeadDim / 16); idx += kAttnThreads) {
          const int pp = idx >> 4, c = (idx & 15) * 16;
          if (c >= Dp) continue;
          int4 v = make_int4(0, 0, 0, 0);
          if (k0 + pp < s1 && c < D) v = load16(kv.k + ((lay0 + k0 + pp) * nkv + kvh) * D + c);
          *reinterpret_cast<int4*>(KV + pp * kAmQRow + c) = v;
        }
      } else {
        for (int idx = tid; idx < kAmKeys * kMaxHeadDim; idx += kAttnThreads) {
          const int pp = idx >> 8, d = idx & 255;
          if (d >= Dp) continue;
          KV[pp * kAmQRow + d] =
              (uint8_t)(k0 + pp < s1 && d < D ? kv.k[((lay0 + k0 + pp) * nkv + kvh) * D + d] : 0);
        }
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int nt = warp * 2 + u;
        int32_t ph[4] = {0, 0, 0, 0}, pl[4] = {0, 0, 0, 0};
        for (int kk = 0; kk < Dp; kk += 32) {
          const int o0 = g * kAmQRow + kk + 4 * tq, o8 = o0 + 8 * kAmQRow;
          const uint32_t ahi[4] = {smem_u32(Qh + o0), smem_u32(Qh + o8), smem_u32(Qh + o0 + 16), smem_u32(Qh + o8 + 16)};
          const uint32_t alo[4] = {smem_u32(Ql + o0), smem_u32(Ql + o8), smem_u32(Ql + o0 + 16), smem_u32(Ql + o8 + 16)};
          const uint8_t* bp = KV + (nt * 8 + g) * kAmQRow + kk + 4 * tq;
          const uint32_t b[2] = {smem_u32(bp), smem_u32(bp + 16)};
          mma_s8s8(ph, ahi, b);
          mma_u8s8(pl, alo, b);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = g + (c >= 2 ? 8 : 0);
          const int64_t p = k0 + nt * 8 + 2 * tq + (c & 1);
          if (r < R && p >= rlo[r] && p < rhi[r]) {
            const int64_t raw = (int64_t)ph[c] * 256 + pl[c];  // |q . k| < 2^31
            const int64_t z = attn_score(raw, kv.ka[(lay0 + p) * nkv + kvh], eq[r], score_mant, score_shift);
            scratch[rbase[r] + p - rlo[r]] = (int32_t)(cap.cap ? softcap(z, cap) : z);  // Gemma 2
          }
        }
      }
    }
    __syncthreads();  // the scores are visible to the block
    // 3. Softmax and value weights per tile row (the split kernels' function).
    for (int r = 0; r < R; ++r) {
      int32_t* sc = scratch + rbase[r];
      const int64_t n = rhi[r] - rlo[r];
      int64_t m = kI64Min;
      for (int64_t i = tid; i < n; i += kAttnThreads) m = imax(m, (int64_t)sc[i]);
      m = block_max(m, kI64Min, red);
      const int s = softmax_value_weights(sc, n, kv.va + (lay0 + rlo[r]) * nkv + kvh, nkv, m, red);
      if (tid == 0) sh[r] = s;
      __syncthreads();
    }
    // 4. P.V: warp w takes the n8 tiles (dimensions) w, w + 4, ...
    const int ntw = Dp >> 5;  // n8 tiles per warp
    int64_t acc[kAmMaxNt][4];
    int32_t ph[kAmMaxNt][4], pl[kAmMaxNt][4];
#pragma unroll
    for (int i = 0; i < kAmMaxNt; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0, ph[i][c] = 0, pl[i][c] = 0;
    int64_t since = 0;
    for (int64_t k0 = s0; k0 < s1; k0 += kAmKeys) {
      for (int idx = tid; idx < kAmRows * kAmKeys; idx += kAttnThreads) {
        const int r = idx >> 6, pp = idx & (kAmKeys - 1);
        const int64_t p = k0 + pp;
        const int32_t w = r < R && p >= rlo[r] && p < rhi[r] ? load_cg(scratch + rbase[r] + p - rlo[r]) : 0;
        Wh[r * kAmVRow + pp] = (uint8_t)((w >> 8) & 0xff);
        Wl[r * kAmVRow + pp] = (uint8_t)(w & 0xff);
      }
      if (vec) {
        for (int idx = tid; idx < kAmKeys * (kMaxHeadDim / 16); idx += kAttnThreads) {
          const int pp = idx >> 4, c = (idx & 15) * 16;
          if (c >= Dp) continue;
          int4 v = make_int4(0, 0, 0, 0);
          if (k0 + pp < s1 && c < D) v = load16(kv.v + ((lay0 + k0 + pp) * nkv + kvh) * D + c);
          const uint32_t wd[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
          for (int b = 0; b < 16; ++b) KV[(c + b) * kAmVRow + pp] = (uint8_t)(wd[b >> 2] >> (8 * (b & 3)));
        }
      } else {
        for (int idx = tid; idx < kAmKeys * kMaxHeadDim; idx += kAttnThreads) {
          const int pp = idx >> 8, d = idx & 255;
          if (d >= Dp) continue;
          KV[d * kAmVRow + pp] = (uint8_t)(k0 + pp < s1 && d < D ? kv.v[((lay0 + k0 + pp) * nkv + kvh) * D + d] : 0);
        }
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kAmKeys; kk += 32) {
        const int o0 = g * kAmVRow + kk + 4 * tq, o8 = o0 + 8 * kAmVRow;
        const uint32_t ahi[4] = {smem_u32(Wh + o0), smem_u32(Wh + o8), smem_u32(Wh + o0 + 16), smem_u32(Wh + o8 + 16)};
        const uint32_t alo[4] = {smem_u32(Wl + o0), smem_u32(Wl + o8), smem_u32(Wl + o0 + 16), smem_u32(Wl + o8 + 16)};
#pragma unroll
        for (int i = 0; i < kAmMaxNt; ++i)
          if (i < ntw) {  // warp-uniform
            const uint8_t* bp = KV + ((warp + 4 * i) * 8 + g) * kAmVRow + kk + 4 * tq;
            const uint32_t b[2] = {smem_u32(bp), smem_u32(bp + 16)};
            mma_s8s8(ph[i], ahi, b);
            mma_u8s8(pl[i], alo, b);
          }
      }
      __syncthreads();  // before the next step overwrites W and V^T
      since += kAmKeys;
      if (since >= kAmFlush || k0 + kAmKeys >= s1) {  // block-uniform
        since = 0;
#pragma unroll
        for (int i = 0; i < kAmMaxNt; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[i][c] += (int64_t)ph[i][c] * 256 + pl[i][c];
            ph[i][c] = 0, pl[i][c] = 0;
          }
      }
    }
    // 5. out = acc << s; C fragment c at row g (+ 8 for c >= 2), dimension 2 tq + (c & 1).
#pragma unroll
    for (int i = 0; i < kAmMaxNt; ++i)
      if (i < ntw)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = g + (c >= 2 ? 8 : 0), d = (warp + 4 * i) * 8 + 2 * tq + (c & 1);
          if (r < R && d < D) out[(int64_t)(row0 + rtl[r]) * HD + (int64_t)rh[r] * D + d] = shl(acc[i][c], sh[r]);
        }
    __syncthreads();  // before the next run rewrites the tile's shared state
    i0 = i1;
  }
}

unsigned grid_1d(int64_t count, int threads) {
  int64_t b = (count + threads - 1) / threads;
  if (b > 65535) b = 65535;  // grid-stride loops cover the rest
  return (unsigned)(b < 1 ? 1 : b);
}

}  // namespace

void launch_embed(const int32_t* tokens, const int8_t* emb, const int32_t* mant, const int32_t* shift, int T, int H,
                  int32_t* x, cudaStream_t st) {
  INTDET_LAUNCH(embed_kernel, T, 256, 0, st, tokens, emb, mant, shift, H, x);
  check_launch("embed");
}

int64_t launch_count() { return g_launches; }

void launch_norm_quant16(const int32_t* x, const int32_t* idx, const int16_t* g, int R, int n, int64_t eps_q60,
                         int in_frac, int16_t* q, int32_t* e, cudaStream_t st, int32_t* normed) {
  if (R <= 0) return;
  INTDET_LAUNCH(norm_quant16_kernel, R, kNormThreads, (size_t)n * sizeof(int32_t), st, x, idx, g, n, eps_q60, in_frac,
                q, e, normed);
  check_launch("norm_quant16");
}

void launch_post_norm_add(const int32_t* y, const int16_t* g, int R, int n, int64_t eps_q60, int32_t shift, int32_t* x,
                          cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH(post_norm_add_kernel, R, kNormThreads, (size_t)n * sizeof(int32_t), st, y, g, n, eps_q60, shift, x);
  check_launch("post_norm_add");
}

void launch_quant16_i64(const int64_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH(quant16_i64_kernel, R, kNormThreads, 0, st, x, n, q, e);
  check_launch("quant16_i64");
}

void launch_quant16_i32(const int32_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH(quant16_i32_kernel, R, kNormThreads, 0, st, x, n, q, e);
  check_launch("quant16_i32");
}

void launch_norm_rows(int32_t* x, const int16_t* g, int R, int n, int64_t eps_q60, cudaStream_t st) {
  if (R <= 0) return;
  if (n > 8192) throw std::invalid_argument("norm_rows: more than 8192 features");
  INTDET_LAUNCH(norm_rows_kernel, R, kNormThreads, 0, st, x, g, n, eps_q60);
  check_launch("norm_rows");
}

int g_gemv_split = -1;  // tests: force the split
void set_gemv_split_override(int wlg) { g_gemv_split = wlg < 0 ? -1 : wlg > 2 ? 2 : wlg; }

int g_attn_path = kAttnAuto;  // tests and the device check: force kAttnAuto's choice
void set_attn_path_override(int path) { g_attn_path = path == kAttnSplit || path == kAttnMma ? path : kAttnAuto; }

int gemv_split_log2(int K, int N) {
  // Warps per output channel (1, 2 or 4; split-K inside a block): enough
  // that a lane makes at most two passes of kGemvUnroll loads, and one pass
  // when N is small (the N = 1024 projections: more warps in flight).
  const int64_t C = K / 16, per = (N < 4096 ? 32 : 64) * kGemvUnroll;
  return C > 2 * per ? 2 : C > per ? 1 : 0;
}

void launch_gemv(const int16_t* q, const int32_t* e, int T, int K, GemvSegs segs, bool residual, cudaStream_t st,
                 const NormAfter& na) {
  if (T <= 0 || segs.n <= 0) return;
  if (na.counter && (segs.n != 1 || segs.glu || T > kNormFoldRows || segs.s[0].N != na.n || segs.s[0].ldo != na.n))
    throw std::invalid_argument("linear (GEMV): a folded norm needs one segment of N = n and at most 2 rows");
  if (segs.n > 3 || (segs.glu && (segs.n != 2 || segs.s[0].N != segs.s[1].N)))
    throw std::invalid_argument("linear (GEMV): bad segments");
  if (segs.quant_counter && (!segs.glu || na.counter || T > kNormFoldRows || segs.s[0].N > kQuantFoldN))
    throw std::invalid_argument("linear (GEMV): a folded quant16 needs GLU mode, N <= 6144 and at most 2 rows");
  const size_t smem = na.counter ? (size_t)na.n * sizeof(int32_t)
                      : segs.quant_counter ? (size_t)segs.s[0].N * sizeof(int64_t) : 0;
  const int vec = K % 16 == 0;
  int maxN = 0;
  for (int i = 0; i < segs.n; ++i) maxN = std::max(maxN, segs.s[i].N);
  int wlg = !vec ? 0 : g_gemv_split >= 0 ? g_gemv_split : gemv_split_log2(K, maxN);
  if (segs.glu && wlg > 1) wlg = 1;  // two slots (gate, up) per block at least
  const int C = K / 16, cpw = (C + (1 << wlg) - 1) >> wlg;
  const int nslot = kGemvWarps >> wlg;
  int64_t gx = 0;
  for (int i = 0; i < segs.n; ++i) {
    const int per = segs.glu ? nslot / 2 : nslot;
    segs.s[i].blocks = (segs.s[i].N + per - 1) / per;
    gx += segs.s[i].blocks;
  }
  if (segs.glu) gx = segs.s[0].blocks;
  if (gx > 0x7fffffff) throw std::invalid_argument("linear (GEMV): too many channels");
  const int threads = kGemvWarps * 32;
  if (T == 1) {
    INTDET_LAUNCH(gemv_kernel<1>, dim3((unsigned)gx, 1), threads, smem, st, q, e, T, K, segs, residual, vec, wlg, cpw, na);
  } else if (T <= 2) {
    INTDET_LAUNCH(gemv_kernel<2>, dim3((unsigned)gx, 1), threads, smem, st, q, e, T, K, segs, residual, vec, wlg, cpw, na);
  } else if (T <= 4) {
    INTDET_LAUNCH(gemv_kernel<4>, dim3((unsigned)gx, 1), threads, smem, st, q, e, T, K, segs, residual, vec, wlg, cpw, na);
  } else {
    const unsigned gy = (unsigned)((T + 7) / 8);
    if (gy > 65535) throw std::invalid_argument("linear (GEMV): too many rows");
    INTDET_LAUNCH(gemv_kernel<8>, dim3((unsigned)gx, gy), threads, smem, st, q, e, T, K, segs, residual, vec, wlg, cpw, na);
  }
  check_launch("linear (GEMV)");
}

void launch_linear(const int16_t* q, const int32_t* e, int T, int K, const int8_t* w, const int32_t* mant,
                   const int32_t* shift, const int32_t* bias, int N, int32_t* out, int64_t ldo, bool residual,
                   int path, cudaStream_t st) {
  if (T <= 0 || N <= 0) return;
  const int vec = K % 16 == 0;
  if (path == kLinearAuto) path = T <= kGemvMaxRows ? kLinearGemv : kLinearGemm;
  if (path == kLinearGemv) {
    GemvSegs segs{};
    segs.s[0] = GemvSeg{w, mant, shift, bias, out, ldo, N, 0};
    segs.n = 1;
    launch_gemv(q, e, T, K, segs, residual, st, NormAfter{});
    return;
  } else if (path == kLinearGemm) {
    const unsigned gy = (unsigned)((T + kMmaM - 1) / kMmaM);
    if (gy > 65535) throw std::invalid_argument("linear (GEMM): too many rows");
    INTDET_LAUNCH(mma_gemm_kernel, dim3((unsigned)((N + kMmaN - 1) / kMmaN), gy), kMmaThreads, 0, st, q, e, T, K, w,
                  mant, shift, bias, N, out, ldo, residual, vec);
  } else {
    const unsigned gy = (unsigned)((T + kTileM - 1) / kTileM);
    if (gy > 65535) throw std::invalid_argument("linear (GEMM): too many rows");
    INTDET_LAUNCH(gemm_kernel, dim3((unsigned)((N + kTileN - 1) / kTileN), gy), 256, 0, st, q, e, T, K, w, mant, shift, bias,
                                                                                 N, out, ldo, residual, vec);
  }
  check_launch("linear");
}

void launch_linear_w4(const int16_t* q, const int32_t* e, int T, int K, const uint8_t* w4, const int16_t* gd,
                      const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int N,
                      int32_t* out, int64_t ldo, bool residual, int path, cudaStream_t st) {
  if (T <= 0 || N <= 0) return;
  if (K <= 0 || K % 32) throw std::invalid_argument("linear (int4): input size must be a positive multiple of 32");
  if (path == kLinearAuto) path = T <= kGemvMaxRows ? kLinearGemv : kLinearGemm;
  if (path == kLinearGemv) {
    const unsigned gx = (unsigned)((N + kGemvWarps - 1) / kGemvWarps);
    const int threads = kGemvWarps * 32;
    if (T == 1) {
      INTDET_LAUNCH(gemv_w4_kernel<1>, dim3(gx, 1), threads, 0, st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else if (T <= 2) {
      INTDET_LAUNCH(gemv_w4_kernel<2>, dim3(gx, 1), threads, 0, st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else if (T <= 4) {
      INTDET_LAUNCH(gemv_w4_kernel<4>, dim3(gx, 1), threads, 0, st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else {
      const unsigned gy = (unsigned)((T + 7) / 8);
      if (gy > 65535) throw std::invalid_argument("linear (int4 GEMV): too many rows");
      INTDET_LAUNCH(gemv_w4_kernel<8>, dim3(gx, gy), threads, 0, st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    }
  } else {
    const unsigned gy = (unsigned)((T + kTileM - 1) / kTileM);
    if (gy > 65535) throw std::invalid_argument("linear (int4 GEMM): too many rows");
    INTDET_LAUNCH(gemm_w4_kernel, dim3((unsigned)((N + kTileN - 1) / kTileN), gy), 256, 0, st, q, e, T, K, w4, gd, gm,
                  mant, shift, bias, N, out, ldo, residual);
  }
  check_launch("linear (int4)");
}

void launch_norm_rope(int32_t* x, int T, int nheads, int D, const int16_t* g, int64_t eps_q60, const int32_t* pos,
                      const int16_t* cos, const int16_t* sin, cudaStream_t st) {
  if (T <= 0) return;
  if (D > kMaxHeadDim || nheads > 65535) throw std::invalid_argument("norm_rope: head_dim > 256 or too many heads");
  INTDET_LAUNCH(norm_rope_kernel, dim3(T, nheads), kHeadThreads, 0, st, x, nheads, D, g, eps_q60, pos, cos, sin);
  check_launch("norm_rope");
}

void launch_rope_append(int32_t* q, int32_t* k, const int32_t* v, int T, int nh, int nkv, int D,
                        const int16_t* q_norm, const int16_t* k_norm, int64_t eps_q60, const int32_t* pos,
                        const int16_t* cos, const int16_t* sin, int layer, const int32_t* seq, const DevKV* kvs,
                        cudaStream_t st) {
  if (T <= 0) return;
  if (D > kMaxHeadDim || nh + 2 * nkv > 65535) throw std::invalid_argument("rope_append: head_dim > 256 or too many heads");
  INTDET_LAUNCH(rope_append_kernel, dim3(T, nh + 2 * nkv), kHeadThreads, 0, st, q, k, v, nh, nkv, D, q_norm, k_norm,
                eps_q60, pos, cos, sin, layer, seq, kvs);
  check_launch("rope_append");
}

void launch_kv_append(const int32_t* k, const int32_t* v, int T, int nkv, int D, int layer, const int32_t* seq,
                      const int32_t* pos, const DevKV* kvs, cudaStream_t st) {
  if (T <= 0) return;
  if (nkv > 65535) throw std::invalid_argument("kv_append: too many kv heads");
  INTDET_LAUNCH(kv_append_kernel, dim3(T, nkv), kHeadThreads, 0, st, k, v, nkv, D, layer, seq, pos, kvs);
  check_launch("kv_append");
}

int attn_chunk(int64_t sstride, int nkv, int nrows) {
  // About 256 blocks per launch (two per SM of an H100/H200) where the
  // positions allow; chunks of 32..512 positions (512 = kPvBlock keeps the
  // chunk's P.V sums in int32). Only the split changes with it, never a bit.
  const int64_t blocks = (int64_t)nkv * nrows;
  const int64_t want = blocks >= 256 ? 1 : (256 + blocks - 1) / blocks;
  int64_t c = (sstride + want - 1) / want;
  c = (c + 31) / 32 * 32;
  return (int)std::min<int64_t>(std::max<int64_t>(c, 32), kPvBlock);
}

void launch_attention(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer, const int32_t* seq,
                      const int32_t* pos, const DevKV* kvs, int64_t score_mant, int64_t score_shift,
                      const AttnScratch& sc, int64_t* out, int16_t* act, int32_t* act_e, cudaStream_t st,
                      int64_t window, int chunk, int path, const RopeFold& rope, const Softcap& cap) {
  if (nrows <= 0) return;
  if (D > kMaxHeadDim || nrows > 65535 || nkv > 65535 || nkv <= 0 || nh % nkv)
    throw std::invalid_argument("attention: shape out of range");
  const int grp = nh / nkv;  // host-side division
  if (grp > kMaxGroup || grp * D > kMaxGroupDim) throw std::invalid_argument("attention: more than 16 query heads per kv head");
  if (path == kAttnAuto) path = rope.on ? kAttnSplit : g_attn_path != kAttnAuto ? g_attn_path
                                                    : nrows > kGemvMaxRows ? kAttnMma : kAttnSplit;
  if (rope.on && path == kAttnMma) throw std::invalid_argument("attention: rope_append folds into the split path only");
  if (path == kAttnMma) {  // prefill: tiles on the tensor cores, then quant16 of the rows
    const int P = kAmRows / grp;  // rows per tile (grp <= kMaxGroup = kAmRows; host-side division)
    const unsigned tiles = (unsigned)((nrows + P - 1) / P);
    if (nrows > sc.rows) throw std::invalid_argument("attention: scratch too small");
    INTDET_LAUNCH(attn_mma_kernel, dim3(tiles, (unsigned)nkv), kAttnThreads, 0, st, q, row0, nrows, nh, nkv, grp, P, D,
                  layer, seq, pos, kvs, score_mant, score_shift, sc.scores, sc.sstride, out, window, cap);
    check_launch("attention (tensor cores)");
    const int64_t HD = (int64_t)nh * D;
    launch_quant16_i64(out + row0 * HD, nrows, (int)HD, act + row0 * HD, act_e + row0, st);
    return;
  }
  if (rope.on && (D > kMaxHeadDim)) throw std::invalid_argument("attention: head_dim > 256");
  if (chunk <= 0) chunk = attn_chunk(sc.sstride, nkv, nrows);
  if (chunk > kPvBlock) throw std::invalid_argument("attention: chunk over 512 positions");
  const int64_t nsplit = (sc.sstride + chunk - 1) / chunk;
  if (nrows > sc.rows || nsplit > sc.max_splits) throw std::invalid_argument("attention: scratch too small");
  const dim3 grid((unsigned)nsplit, (unsigned)nkv, (unsigned)nrows);
  INTDET_LAUNCH(attn_scores_kernel, grid, kAttnThreads, 0, st, q, row0, nh, nkv, grp, D, layer, seq, pos, kvs,
                score_mant, score_shift, sc.scores, sc.sstride, sc.zpart, chunk, sc.counters, sc.shifts, window,
                rope, cap);
  check_launch("attention (scores)");
  INTDET_LAUNCH(attn_pv_kernel, grid, kAttnThreads, 0, st, row0, nh, nkv, grp, D, layer, seq, pos, kvs, sc.scores,
                sc.sstride, sc.shifts, chunk, sc.oacc, sc.counters + (int64_t)nrows * nkv, out, act, act_e, window);
  check_launch("attention (P.V)");
}

void launch_moe_route(const int32_t* z, int T, int E, int k, bool norm_topk, int32_t* sel, int64_t* wts,
                      cudaStream_t st) {
  if (T <= 0) return;
  if (k < 1 || k > E) throw std::invalid_argument("moe_route: experts per token outside [1, experts]");
  INTDET_LAUNCH(moe_route_kernel, grid_1d(T, 64), 64, 0, st, z, T, E, k, norm_topk ? 1 : 0, sel, wts);
  check_launch("moe_route");
}

void launch_moe_linear(const int16_t* q, const int32_t* e, int rows, int in_div, const MoeLinear& L,
                       const int32_t* sel, int32_t* out, cudaStream_t st) {
  if (L.w4 && L.K % 32) throw std::invalid_argument("moe_linear: int4 input size is not a multiple of 32");
  for (int r0 = 0; r0 < rows; r0 += 65535) {  // grid.y's limit
    const dim3 grid((unsigned)((L.N + kGemvWarps - 1) / kGemvWarps), (unsigned)std::min(rows - r0, 65535));
    if (L.w4)
      INTDET_LAUNCH(moe_linear_kernel<true>, grid, kGemvWarps * 32, 0, st, q, e, r0, rows, in_div, L, sel, out, 1);
    else
      INTDET_LAUNCH(moe_linear_kernel<false>, grid, kGemvWarps * 32, 0, st, q, e, r0, rows, in_div, L, sel, out,
                    L.K % 16 == 0 ? 1 : 0);
    check_launch("moe_linear");
  }
}

void launch_moe_combine(const int32_t* d, const int64_t* wts, int T, int k, int H, int32_t* x, int64_t* comb,
                        cudaStream_t st) {
  if (T <= 0) return;
  INTDET_LAUNCH(moe_combine_kernel, dim3((unsigned)std::min(T, 65535)), 256, 0, st, d, wts, T, k, H, x, comb);
  check_launch("moe_combine");
}

void launch_softcap(int32_t* x, int64_t count, const Softcap& cap, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH(softcap_kernel, grid_1d(count, 256), 256, 0, st, x, count, cap);
  check_launch("softcap");
}

void launch_swiglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH(swiglu_kernel, grid_1d(count, 256), 256, 0, st, g, u, count, a);
  check_launch("swiglu");
}

void launch_geglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH(geglu_kernel, grid_1d(count, 256), 256, 0, st, g, u, count, a);
  check_launch("geglu");
}

void launch_argmax(const int32_t* logits, int V, unsigned long long* best, int* counter, int32_t* token,
                   cudaStream_t st) {
  if (V <= 0) throw std::invalid_argument("argmax: empty row");
  const int blocks = (int)std::min<int64_t>(kArgmaxBlocks, ((int64_t)V + kArgmaxThreads - 1) / kArgmaxThreads);
  INTDET_LAUNCH(argmax_kernel, blocks, kArgmaxThreads, 0, st, logits, V, best, counter, token);
  check_launch("argmax");
}

void launch_sample(const int32_t* logits, int V, int64_t t_num, int64_t t_den, uint64_t draw, int32_t* wbuf,
                   int32_t* token, cudaStream_t st, const SampleCuts& cuts) {
  if (V <= 0 || t_num <= 0 || t_den <= 0) throw std::invalid_argument("sample: empty row or temperature <= 0");
  if (cuts.top_k < 0 || cuts.p_num <= 0 || cuts.p_den <= 0 || cuts.p_num > cuts.p_den || cuts.m_num < 0 ||
      cuts.m_den <= 0 || cuts.m_num > cuts.m_den || cuts.m_den > 1000000)
    throw std::invalid_argument("sample: top-k < 0, top-p outside (0, 1] or min-p outside [0, 1] (denominator <= 1e6)");
  INTDET_LAUNCH(sample_kernel, 1, kSampleThreads, 0, st, logits, V, t_num, t_den, (unsigned long long)draw, cuts.top_k,
                cuts.p_num, cuts.p_den, cuts.m_num, cuts.m_den, wbuf, token);
  check_launch("sample");
}

void launch_round_div(const int64_t* a, const int64_t* b, int64_t count, int64_t* out, cudaStream_t st) {
  if (count <= 0) return;
  INTDET_LAUNCH(round_div_kernel, grid_1d(count, 256), 256, 0, st, a, b, count, out);
  check_launch("round_div");
}

}  // namespace cuda
}  // namespace intdet
