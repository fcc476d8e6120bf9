// CUDA kernels: mixture of experts (routing, the experts' linear layers on
// gathered rows, the weighted combine). Same bits as the CPU's moe_* steps
// (kernels_elementwise.cu says why).
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

}  // namespace

void launch_moe_route(const int32_t* z, int T, int E, int k, bool norm_topk, int32_t* sel, int64_t* wts,
                      cudaStream_t st) {
  if (T <= 0) return;
  if (k < 1 || k > E) throw std::invalid_argument("moe_route: experts per token outside [1, experts]");
  INTDET_LAUNCH_AT(moe_route_kernel, shape_moe_route(T), st, z, T, E, k, norm_topk ? 1 : 0, sel, wts);
  check_launch("moe_route");
}

void launch_moe_linear(const int16_t* q, const int32_t* e, int rows, int in_div, const MoeLinear& L,
                       const int32_t* sel, int32_t* out, cudaStream_t st) {
  if (L.w4 && L.K % 32) throw std::invalid_argument("moe_linear: int4 input size is not a multiple of 32");
  for (int r0 = 0; r0 < rows; r0 += 65535) {  // grid.y's limit
    const LaunchShape sh = shape_moe_linear(L.N, std::min(rows - r0, 65535));
    if (L.w4)
      INTDET_LAUNCH_AT(moe_linear_kernel<true>, sh, st, q, e, r0, rows, in_div, L, sel, out, 1);
    else
      INTDET_LAUNCH_AT(moe_linear_kernel<false>, sh, st, q, e, r0, rows, in_div, L, sel, out,
                    L.K % 16 == 0 ? 1 : 0);
    check_launch("moe_linear");
  }
}

void launch_moe_combine(const int32_t* d, const int64_t* wts, int T, int k, int H, int32_t* x, int64_t* comb,
                        cudaStream_t st) {
  if (T <= 0) return;
  INTDET_LAUNCH_AT(moe_combine_kernel, shape_moe_combine(T), st, d, wts, T, k, H, x, comb);
  check_launch("moe_combine");
}

}  // namespace cuda
}  // namespace intdet
