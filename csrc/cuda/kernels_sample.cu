// CUDA kernels: the greedy token choice (argmax) and sampling at a
// temperature with top-k / top-p / min-p cuts. Same bits as the host
// Sampler (python/intdet/sampling.py; kernels_elementwise.cu says why).
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

// ---------------------------------------------------------------- greedy token choice

// The host Sampler's greedy pick (np.argmax: the largest logit, the lowest
// id among equal ones) as one order-free int64 maximum: key = v 2^32 +
// (2^32 - 1 - id) is larger exactly when v is larger, or v is equal and the
// id smaller (|v| <= 2^31, so the key fits int64). Blocks reduce their
// stride of the row, combine with atomicMax (on key ^ 2^63, the unsigned
// order of signed keys), and the last block to arrive writes the token and
// resets best (atomicExch) and the counter for the next launch.

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

}  // namespace

void launch_argmax(const int32_t* logits, int V, unsigned long long* best, int* counter, int32_t* token,
                   cudaStream_t st) {
  if (V <= 0) throw std::invalid_argument("argmax: empty row");
  INTDET_LAUNCH_AT(argmax_kernel, shape_argmax(V), st, logits, V, best, counter, token);
  check_launch("argmax");
}

void launch_sample(const int32_t* logits, int V, int64_t t_num, int64_t t_den, uint64_t draw, int32_t* wbuf,
                   int32_t* token, cudaStream_t st, const SampleCuts& cuts) {
  if (V <= 0 || t_num <= 0 || t_den <= 0) throw std::invalid_argument("sample: empty row or temperature <= 0");
  if (cuts.top_k < 0 || cuts.p_num <= 0 || cuts.p_den <= 0 || cuts.p_num > cuts.p_den || cuts.m_num < 0 ||
      cuts.m_den <= 0 || cuts.m_num > cuts.m_den || cuts.m_den > 1000000)
    throw std::invalid_argument("sample: top-k < 0, top-p outside (0, 1] or min-p outside [0, 1] (denominator <= 1e6)");
  INTDET_LAUNCH_AT(sample_kernel, shape_sample(), st, logits, V, t_num, t_den, (unsigned long long)draw, cuts.top_k,
                cuts.p_num, cuts.p_den, cuts.m_num, cuts.m_den, wbuf, token);
  check_launch("sample");
}

}  // namespace cuda
}  // namespace intdet
