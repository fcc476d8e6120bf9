// CUDA kernels: RMSNorm and quant16 of rows, the per-head q/k norm + RoPE,
// the KV cache append (and rope_append, the three in one launch). Same bits
// as the scalar C++ reference (kernels_elementwise.cu says why).
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

// ---------------------------------------------------------------- RMSNorm

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

// grid (T, nh + 2 nkv): the q/k norm + RoPE of every q and k head and the KV
// append in one launch. Blocks y < nh: q head y in place; nh <= y < nh + nkv:
// k head y - nh in place, then quant8_row into the cache; the rest: v heads'
// quant8_row into the cache. The same per-head steps as norm_rope_kernel and
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
    __syncthreads();  // the rotated row, written by other threads, is quant8_row's input
    const int32_t a = quant8_block(kb + src, D, kv.k + base * D, red);
    if (threadIdx.x == 0) kv.ka[base] = a;
  } else {
    const int32_t a = quant8_block(vb + src, D, kv.v + base * D, red);
    if (threadIdx.x == 0) kv.va[base] = a;
  }
}

}  // namespace

void launch_norm_quant16(const int32_t* x, const int32_t* idx, const int16_t* g, int R, int n, int64_t eps_q60,
                         int in_frac, int16_t* q, int32_t* e, cudaStream_t st, int32_t* normed) {
  if (R <= 0) return;
  INTDET_LAUNCH_AT(norm_quant16_kernel, shape_row(R, (size_t)n * sizeof(int32_t)), st, x, idx, g, n, eps_q60, in_frac,
                q, e, normed);
  check_launch("norm_quant16");
}

void launch_post_norm_add(const int32_t* y, const int16_t* g, int R, int n, int64_t eps_q60, int32_t shift, int32_t* x,
                          cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH_AT(post_norm_add_kernel, shape_row(R, (size_t)n * sizeof(int32_t)), st, y, g, n, eps_q60, shift, x);
  check_launch("post_norm_add");
}

void launch_quant16_i64(const int64_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH_AT(quant16_i64_kernel, shape_row(R), st, x, n, q, e);
  check_launch("quant16_i64");
}

void launch_quant16_i32(const int32_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st) {
  if (R <= 0) return;
  INTDET_LAUNCH_AT(quant16_i32_kernel, shape_row(R), st, x, n, q, e);
  check_launch("quant16_i32");
}

void launch_norm_rows(int32_t* x, const int16_t* g, int R, int n, int64_t eps_q60, cudaStream_t st) {
  if (R <= 0) return;
  if (n > 8192) throw std::invalid_argument("norm_rows: more than 8192 features");
  INTDET_LAUNCH_AT(norm_rows_kernel, shape_row(R), st, x, g, n, eps_q60);
  check_launch("norm_rows");
}

void launch_norm_rope(int32_t* x, int T, int nheads, int D, const int16_t* g, int64_t eps_q60, const int32_t* pos,
                      const int16_t* cos, const int16_t* sin, cudaStream_t st) {
  if (T <= 0) return;
  if (D > kMaxHeadDim || nheads > 65535) throw std::invalid_argument("norm_rope: head_dim > 256 or too many heads");
  INTDET_LAUNCH_AT(norm_rope_kernel, shape_heads(T, nheads), st, x, nheads, D, g, eps_q60, pos, cos, sin);
  check_launch("norm_rope");
}

void launch_rope_append(int32_t* q, int32_t* k, const int32_t* v, int T, int nh, int nkv, int D,
                        const int16_t* q_norm, const int16_t* k_norm, int64_t eps_q60, const int32_t* pos,
                        const int16_t* cos, const int16_t* sin, int layer, const int32_t* seq, const DevKV* kvs,
                        cudaStream_t st) {
  if (T <= 0) return;
  if (D > kMaxHeadDim || nh + 2 * nkv > 65535) throw std::invalid_argument("rope_append: head_dim > 256 or too many heads");
  INTDET_LAUNCH_AT(rope_append_kernel, shape_heads(T, nh + 2 * nkv), st, q, k, v, nh, nkv, D, q_norm, k_norm,
                eps_q60, pos, cos, sin, layer, seq, kvs);
  check_launch("rope_append");
}

void launch_kv_append(const int32_t* k, const int32_t* v, int T, int nkv, int D, int layer, const int32_t* seq,
                      const int32_t* pos, const DevKV* kvs, cudaStream_t st) {
  if (T <= 0) return;
  if (nkv > 65535) throw std::invalid_argument("kv_append: too many kv heads");
  INTDET_LAUNCH_AT(kv_append_kernel, shape_heads(T, nkv), st, k, v, nkv, D, layer, seq, pos, kvs);
  check_launch("kv_append");
}

}  // namespace cuda
}  // namespace intdet
