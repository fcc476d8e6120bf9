// CUDA kernels: attention, split over positions (flash-decoding: scores,
// then P.V) and the prefill tiles on the tensor cores. Same bits as
// attend_head (kernels_elementwise.cu says why).
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

constexpr int kMaxGroupDim = 4096;  // grp * D: the group's int16 queries in shared memory
constexpr int kMaxGroup = 16;

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
      const int e_q = quant16_split_row(qr, D, Dp, Qh + r * kAmQRow, Ql + r * kAmQRow);
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

}  // namespace

int g_attn_path = kAttnAuto;  // tests and the device check: force kAttnAuto's choice
void set_attn_path_override(int path) {
  g_attn_path = path == kAttnSplit || path == kAttnMma || path == kAttnFused || path == kAttnFlash ? path : kAttnAuto;
}

int attn_path_for(int path, int nrows, int grp, int64_t npos, bool rope, int D) {
  const bool fits = npos <= attn_fused_max_pos(grp);
  const bool tiles = g_attn_path == kAttnMma || g_attn_path == kAttnFlash;  // prefill paths: no RopeFold
  if (path == kAttnAuto && g_attn_path != kAttnAuto && !(rope && tiles) &&
      !(g_attn_path == kAttnFlash && !attn_flash_fits(D)) && !(!fits && g_attn_path == kAttnFused))
    path = g_attn_path;
  if (path == kAttnAuto)
    return !rope && nrows > kGemvMaxRows ? (attn_flash_fits(D) ? kAttnFlash : kAttnMma) : fits ? kAttnFused : kAttnSplit;
  if (rope && (path == kAttnMma || path == kAttnFlash))
    throw std::invalid_argument("attention: rope_append folds into the split and one-kernel paths only");
  if (path == kAttnFused && !fits) throw std::invalid_argument("attention: more positions than the one-kernel path holds");
  if (path == kAttnFlash && !attn_flash_fits(D))
    throw std::invalid_argument("attention: the flash tiles do not fit in this device's shared memory");
  if (path != kAttnSplit && path != kAttnMma && path != kAttnFused && path != kAttnFlash)
    throw std::invalid_argument("attention: unknown path");
  return path;
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
  const int64_t npos = std::min(sc.npos > 0 ? sc.npos : sc.sstride, window > 0 ? window : sc.sstride);
  path = attn_path_for(path, nrows, grp, npos, rope.on, D);
  if (path == kAttnFused) {  // decode up to attn_fused_max_pos positions: one launch
    launch_attention_fused(q, row0, nrows, nh, nkv, D, layer, seq, pos, kvs, score_mant, score_shift, sc, npos, out,
                           act, act_e, st, window, rope, cap);
    return;
  }
  if (path == kAttnFlash) {  // prefill: FA2-shaped tiles, then quant16 of the rows
    launch_attention_flash(q, row0, nrows, nh, nkv, D, layer, seq, pos, kvs, score_mant, score_shift, out, st, window,
                           cap);
    const int64_t HD = (int64_t)nh * D;
    launch_quant16_i64(out + row0 * HD, nrows, (int)HD, act + row0 * HD, act_e + row0, st);
    return;
  }
  if (path == kAttnMma) {  // prefill: tiles on the tensor cores, then quant16 of the rows
    const int P = kAmRows / grp;  // rows per tile (grp <= kMaxGroup = kAmRows; host-side division)
    const unsigned tiles = (unsigned)((nrows + P - 1) / P);
    if (nrows > sc.rows) throw std::invalid_argument("attention: scratch too small");
    INTDET_LAUNCH_AT(attn_mma_kernel, shape_attn_mma(tiles, nkv), st, q, row0, nrows, nh, nkv, grp, P, D,
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
  const LaunchShape grid = shape_attn_split(nsplit, nkv, nrows);
  INTDET_LAUNCH_AT(attn_scores_kernel, grid, st, q, row0, nh, nkv, grp, D, layer, seq, pos, kvs,
                score_mant, score_shift, sc.scores, sc.sstride, sc.zpart, chunk, sc.counters, sc.shifts, window,
                rope, cap);
  check_launch("attention (scores)");
  INTDET_LAUNCH_AT(attn_pv_kernel, grid, st, row0, nh, nkv, grp, D, layer, seq, pos, kvs, sc.scores,
                sc.sstride, sc.shifts, chunk, sc.oacc, sc.counters + (int64_t)nrows * nkv, out, act, act_e, window);
  check_launch("attention (P.V)");
}

}  // namespace cuda
}  // namespace intdet
