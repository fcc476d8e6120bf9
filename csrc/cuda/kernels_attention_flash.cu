// CUDA kernel: prefill attention in the FlashAttention-2 shape (Dao 2023,
// "FlashAttention-2", Alg. 1: a block per tile of query rows, K and V tiles
// streamed through shared memory, scores kept in registers), made exact.
// Same bits as attend_head (kernels_elementwise.cu says why).
//
// The exact softmax cannot rescale a running sum as FA2 does (exp2 of a
// shifted maximum is not a rescaling of the old terms in integers), so the
// kernel sweeps the keys once per step of attend_head's softmax and
// recomputes QK^T on the tensor cores each time instead of keeping the
// scores in a global scratch (the kAttnMma path's 4-byte score per (row,
// head, key), read and written five times):
//   pass 0: z = attn_score(q . k) (softcap), zmax = max z per row;
//   pass 1: e = exp2(-(zmax - z)), tot = sum e (int64); R = 2^62 / tot;
//   pass 2: p = round_shift(e R, 46), wmax = max p a_v; s = bitlen(wmax) - 15;
//   pass 3: w16 = round_shift(p a_v, s), out = (sum w16 v) << s, the int16
//           weights split into s8 hi and u8 lo bytes as the A operand of
//           mma.m16n8k32 against V^T (once per 128 dimensions).
// Every row's reductions are an int64 max or sum over its keys: order-free,
// so tiles, warps and lanes may meet them in any order.
//
// Shape: grid (tiles, nkv); a block of 8 warps serves a tile of
// kFlRows = 128 tile rows, P = 128 / grp consecutive rows of the launch times
// the grp query heads of one kv head (tile row r = i grp + j), warp w the
// tile rows 16 w .. 16 w + 15 (the mma's M). Rows of different sequences in
// one tile are served one run of equal sequence after another. Keys move in
// tiles of 64 through two shared-memory buffers (cp.async: the next tile
// loads while the block computes on this one); a warp skips the tiles that
// none of its rows sees (causal and window skipping).
//
// The scores' fragment order is chosen so that the accumulator (C) fragments
// of QK^T are already the A fragments of P.V: n8 tile j of a 64-key tile
// holds in column n the key 32 (j / 4) + kmap(j % 4, n) (below), so a lane's
// four C values of tiles 4h + 0..3 are, byte for byte, its four A registers
// of the k32 step h. V^T is staged transposed (four 4x4 byte transposes per
// thread: __byte_perm) so that a B fragment is two 32-bit shared loads.
//
// Exact: q . k = 256 sum hi k + sum lo k, |sum| <= 256 * 255 * 128 < 2^31 for
// D <= 256; a P.V s32 sum stays below 2^31 for 65536 keys (255 * 128 per
// product), and is added into int64 every kFlFlush = 32768 keys (through
// `out`, which this block alone writes). Scores, the softmax and the weights
// are attend_head's per-position formulas (the same as the split kernels').
#include "kernels_shared.cuh"  // first: kernels.cuh, then the shared device helpers

#include <cstdint>
#include <stdexcept>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace cuda {
namespace {

constexpr int kFlWarps = kAttnFlashThreads / 32;
constexpr int kFlRows = kFlWarps * 16;  // tile rows: one m16 tile per warp
constexpr int kFlKeys = 64;             // keys per tile: eight n8 tiles of QK^T, two k32 steps of P.V
constexpr int kFlDims = 128;            // P.V dimensions per sweep (the accumulators live in registers)
constexpr int kFlVtRow = kFlKeys + 16;  // bytes per V^T row (one dimension's keys): conflict-free B loads
constexpr int64_t kFlFlush = 32768;     // P.V keys per s32 flush (65536 keep it exact)
// The kernel's static shared memory, with room to spare (ptxas, sm_90: 4,752
// bytes): the opt-in limit covers static and dynamic together.
constexpr int64_t kFlStaticSmem = 8192;
static_assert(kFlRows == 128, "tile rows: 8 warps of 16");

// Bytes of one query / key / value row in shared memory for head size D: D
// rounded up to the k32 step, plus 16 (rows 36 or 68 words apart: the
// A and B fragment loads hit 32 different banks).
__host__ __device__ inline int flash_row_bytes(int D) { return ((D + 31) & ~31) + 16; }

// Key offset (within a k32 step) of column n of n8 tile j' (0..3) of that step:
// C fragment (row, 2 tq + b) of tile j' lands in A byte (j' & 1) * 2 + b of
// register 2 (j' >> 1) (+1 for row + 8), whose key is (j' >> 1) 16 + 4 tq + ...
__device__ __forceinline__ int kmap(int jq, int n) { return (jq >> 1) * 16 + 4 * (n >> 1) + 2 * (jq & 1) + (n & 1); }

__device__ __forceinline__ uint32_t pack4(int32_t a, int32_t b, int32_t c, int32_t d) {
  return (uint32_t)(a & 0xff) | (uint32_t)(b & 0xff) << 8 | (uint32_t)(c & 0xff) << 16 | (uint32_t)(d & 0xff) << 24;
}

__global__ void __launch_bounds__(kAttnFlashThreads, 1)
    attn_flash_kernel(const int32_t* __restrict__ qbuf, int row0, int nrows, int nh, int nkv, int grp, int P, int D,
                      int layer, const int32_t* __restrict__ seq, const int32_t* __restrict__ pos,
                      const DevKV* __restrict__ kvs, int64_t score_mant, int64_t score_shift,
                      int64_t* __restrict__ out, int64_t window, Softcap cap) {
  INTDET_DYN_SMEM(int4, smem);  // 16-byte aligned
  const int Dp = (D + 31) & ~31, QR = flash_row_bytes(D);
  uint8_t* Qh = reinterpret_cast<uint8_t*>(smem);  // hi bytes of the int16 queries [tile row][d]
  uint8_t* Ql = Qh + kFlRows * QR;                  // lo bytes
  uint8_t* Kb = Ql + kFlRows * QR;                  // two K tiles [key][d]
  uint8_t* Vb = Kb + 2 * kFlKeys * QR;              // two V tiles [key][d]
  uint8_t* VT = Vb + 2 * kFlKeys * QR;              // V^T of the current tile [d - dc][key]
  __shared__ int64_t rlo[kFlRows], rhi[kFlRows], rout[kFlRows], wlo[kFlWarps], whi[kFlWarps], s01[2];
  __shared__ int eq[kFlRows];
  __shared__ int32_t kat[2][kFlKeys], vat[2][kFlKeys];  // the tiles' key and value scales
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kvh = blockIdx.y, h0 = kvh * grp;
  const int tl0 = blockIdx.x * P;
  const int np = nrows - tl0 < P ? nrows - tl0 : P;
  const bool vec = D % 16 == 0;
  const int rA = warp * 16 + g, rB = rA + 8;  // this lane's two tile rows (C fragments 0-1 and 2-3)
  for (int i0 = 0; i0 < np;) {  // one run of rows of the same sequence
    const int sq = seq[row0 + tl0 + i0];
    int i1 = i0 + 1;
    while (i1 < np && seq[row0 + tl0 + i1] == sq) ++i1;
    const DevKV kv = kvs[sq];
    const int64_t lay0 = (int64_t)layer * kv.max_len;  // cache row of (layer, position 0)
    if (tid == 0) {
      int r = 0;
      for (int i = i0; i < i1; ++i)
        for (int j = 0; j < grp; ++j, ++r) {
          const int tl = tl0 + i;
          int64_t lo, n;
          attn_range(pos[row0 + tl], window, &lo, &n);
          rlo[r] = lo, rhi[r] = lo + n, eq[r] = 0;
          rout[r] = ((int64_t)(row0 + tl) * nh + h0 + j) * D;
        }
      for (; r < kFlRows; ++r) rlo[r] = 0, rhi[r] = 0, rout[r] = -1;  // no keys: weights 0, nothing written
      int64_t a = INT64_MAX, b = 0;
      for (int w = 0; w < kFlWarps; ++w) {
        int64_t wa = INT64_MAX, wb = 0;
        for (int k = w * 16; k < w * 16 + 16; ++k)
          if (rout[k] >= 0) wa = rlo[k] < wa ? rlo[k] : wa, wb = rhi[k] > wb ? rhi[k] : wb;
        wlo[w] = wb ? wa : 0, whi[w] = wb;
        a = wb && wa < a ? wa : a, b = wb > b ? wb : b;
      }
      s01[0] = a, s01[1] = b;
    }
    __syncthreads();
    // 1. quant16 of each tile row's query (a warp per row), split into bytes.
    for (int r = warp; r < kFlRows; r += kFlWarps) {
      const int e_q = quant16_split_row(rout[r] >= 0 ? qbuf + rout[r] : nullptr, D, Dp, Qh + r * QR, Ql + r * QR);
      if (lane == 0) eq[r] = e_q;
    }
    __syncthreads();
    const int64_t s0 = s01[0], s1 = s01[1], w0 = wlo[warp], w1 = whi[warp];
    const int64_t loA = rlo[rA], hiA = rhi[rA], loB = rlo[rB], hiB = rhi[rB];
    const int eqA = eq[rA], eqB = eq[rB];

    // Loads key tile k0 into buffer b (K, and V when withV): 16-byte cp.async
    // where D % 16 == 0, else byte loads; the tile's key / value scales.
    auto stage = [&](int b, int64_t k0, bool withV) {
      uint8_t* kd = Kb + b * kFlKeys * QR;
      uint8_t* vd = Vb + b * kFlKeys * QR;
      if (vec) {
        for (int idx = tid; idx < kFlKeys * (kMaxHeadDim / 16); idx += kAttnFlashThreads) {
          const int pp = idx >> 4, c = (idx & 15) * 16;
          if (c >= D || k0 + pp >= s1) continue;
          const int64_t off = ((lay0 + k0 + pp) * nkv + kvh) * D + c;
          cp_async16(kd + pp * QR + c, kv.k + off);
          if (withV) cp_async16(vd + pp * QR + c, kv.v + off);
        }
      } else {
        for (int idx = tid; idx < kFlKeys * kMaxHeadDim; idx += kAttnFlashThreads) {
          const int pp = idx >> 8, d = idx & 255;
          if (d >= D || k0 + pp >= s1) continue;
          const int64_t off = ((lay0 + k0 + pp) * nkv + kvh) * D + d;
          kd[pp * QR + d] = (uint8_t)kv.k[off];
          if (withV) vd[pp * QR + d] = (uint8_t)kv.v[off];
        }
      }
      if (tid < kFlKeys) {
        const bool ok = k0 + tid < s1;
        kat[b][tid] = ok ? kv.ka[(lay0 + k0 + tid) * nkv + kvh] : 0;
        vat[b][tid] = ok ? kv.va[(lay0 + k0 + tid) * nkv + kvh] : 0;
      }
      cp_async_commit();
    };

    // The warp's scores of key tile k0 (buffer b): z[j][c] for C fragment c
    // of n8 tile j, key k0 + 32 (j >> 2) + kmap(j & 3, 2 tq + (c & 1)), row
    // rA (c < 2) or rB; ok[j] bit c: the row sees that key.
    int32_t z[8][4];
    unsigned ok[8];
    auto scores = [&](int b, int64_t k0) {
      const uint8_t* kt = Kb + b * kFlKeys * QR;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int32_t ph[4] = {0, 0, 0, 0}, pl[4] = {0, 0, 0, 0};
        const uint8_t* krow = kt + (32 * (j >> 2) + kmap(j & 3, g)) * QR + 4 * tq;  // B column g's key
        for (int kk = 0; kk < Dp; kk += 32) {
          const int o0 = (warp * 16 + g) * QR + kk + 4 * tq, o8 = o0 + 8 * QR;
          const uint32_t ahi[4] = {smem_u32(Qh + o0), smem_u32(Qh + o8), smem_u32(Qh + o0 + 16), smem_u32(Qh + o8 + 16)};
          const uint32_t alo[4] = {smem_u32(Ql + o0), smem_u32(Ql + o8), smem_u32(Ql + o0 + 16), smem_u32(Ql + o8 + 16)};
          const uint32_t bf[2] = {smem_u32(krow + kk), smem_u32(krow + kk + 16)};
          mma_s8s8(ph, ahi, bf);
          mma_u8s8(pl, alo, bf);
        }
        ok[j] = 0;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int ko = 32 * (j >> 2) + kmap(j & 3, 2 * tq + (c & 1));
          const int64_t p = k0 + ko;
          const bool rowB = c >= 2;
          const bool in = rowB ? p >= loB && p < hiB : p >= loA && p < hiA;
          int64_t zz = 0;
          if (in) {
            const int64_t raw = (int64_t)ph[c] * 256 + pl[c];  // |q . k| < 2^31
            zz = attn_score((int32_t)raw, kat[b][ko], rowB ? eqB : eqA, score_mant, score_shift);  // sat32
            if (cap.cap) zz = softcap(zz, cap);  // Gemma 2
          }
          z[j][c] = (int32_t)zz;
          ok[j] |= (unsigned)in << c;
        }
      }
    };
    auto quad_max = [&](int64_t v) {
      v = imax(v, __shfl_xor_sync(kFull, v, 1));
      return imax(v, __shfl_xor_sync(kFull, v, 2));
    };
    auto quad_sum = [&](int64_t v) {
      v += __shfl_xor_sync(kFull, v, 1);
      return v + __shfl_xor_sync(kFull, v, 2);
    };
    // One sweep over the run's keys: tile after tile through the two
    // buffers; body(b, k0) for the tiles the warp's rows see (warp-uniform).
    auto sweep = [&](bool withV, auto&& body, auto&& pre) {
      if (s0 >= s1) return;  // block-uniform
      stage(0, s0, withV);
      int b = 0;
      for (int64_t k0 = s0; k0 < s1; k0 += kFlKeys, b ^= 1) {
        if (k0 + kFlKeys < s1)
          stage(b ^ 1, k0 + kFlKeys, withV);
        else
          cp_async_commit();  // an empty group: the wait below counts the same
        cp_async_wait<1>();
        __syncthreads();  // tile b is in shared memory for every thread
        pre(b, k0);
        if (k0 < w1 && k0 + kFlKeys > w0) body(b, k0);
        __syncthreads();  // every warp is done with tile b before it is refilled
      }
    };
    auto nopre = [](int, int64_t) {};
    // f(j, c) for each C fragment whose row sees its key (after scores).
    auto for_seen = [&](auto&& f) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (ok[j] >> c & 1) f(j, c);
    };

    // Pass 0: the row maxima.
    int64_t mA = kI64Min, mB = kI64Min;
    sweep(false, [&](int b, int64_t k0) {
      scores(b, k0);
      for_seen([&](int j, int c) {
        if (c < 2) mA = imax(mA, (int64_t)z[j][c]);
        else mB = imax(mB, (int64_t)z[j][c]);
      });
    }, nopre);
    mA = quad_max(mA), mB = quad_max(mB);
    // Pass 1: the sums of exp2.
    int64_t tA = 0, tB = 0;
    sweep(false, [&](int b, int64_t k0) {
      scores(b, k0);
      for_seen([&](int j, int c) {
        if (c < 2) tA += exp2_neg_q30(mA - z[j][c]);  // <= 2^30
        else tB += exp2_neg_q30(mB - z[j][c]);
      });
    }, nopre);
    tA = quad_sum(tA), tB = quad_sum(tB);
    const int64_t RA = tA ? floor_div((int64_t)1 << 62, tA) : 0, RB = tB ? floor_div((int64_t)1 << 62, tB) : 0;
    // The probability p and the value weight p a_v of C fragment (j, c).
    auto prob = [&](int j, int c) {
      return round_shift((int64_t)exp2_neg_q30((c < 2 ? mA : mB) - z[j][c]) * (c < 2 ? RA : RB), 62 - kProbFrac);
    };
    // Pass 2: the value weights' maxima, hence their shifts.
    int64_t xA = 0, xB = 0;
    sweep(false, [&](int b, int64_t k0) {
      scores(b, k0);
      for_seen([&](int j, int c) {
        const int64_t wv = prob(j, c) * vat[b][32 * (j >> 2) + kmap(j & 3, 2 * tq + (c & 1))];  // < 2^47
        if (c < 2) xA = imax(xA, wv);
        else xB = imax(xB, wv);
      });
    }, nopre);
    xA = quad_max(xA), xB = quad_max(xB);
    const int sA = (int)imax(bitlen(xA) - 15, 0), sB = (int)imax(bitlen(xB) - 15, 0);

    // Pass 3, per 128 dimensions: w16 as hi / lo A fragments against V^T.
    for (int dc = 0; dc < Dp; dc += kFlDims) {
      const int nd = Dp - dc < kFlDims ? Dp - dc : kFlDims;  // dims of this sweep (a multiple of 32)
      int32_t ch[kFlDims / 8][4], cl[kFlDims / 8][4];
#pragma unroll
      for (int i = 0; i < kFlDims / 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) ch[i][c] = 0, cl[i][c] = 0;
      int64_t since = 0;
      bool flushed = false;  // block-uniform: out holds an earlier part of the sums
      // V^T of tile b, dims dc .. dc + nd: a thread per 4 keys x 4 dims.
      auto transpose = [&](int b, int64_t) {
        const uint8_t* vt = Vb + b * kFlKeys * QR;
        for (int idx = tid; idx < (kFlKeys / 4) * (kFlDims / 4); idx += kAttnFlashThreads) {
          const int kq = idx & (kFlKeys / 4 - 1), dq = idx >> 4;  // 4-key group, 4-dim group
          if (4 * dq >= nd) continue;
          const uint8_t* src = vt + 4 * kq * QR + dc + 4 * dq;
          const uint32_t a0 = smem_u32(src), a1 = smem_u32(src + QR), a2 = smem_u32(src + 2 * QR),
                         a3 = smem_u32(src + 3 * QR);
          const uint32_t x0 = __byte_perm(a0, a1, 0x5140), x1 = __byte_perm(a0, a1, 0x7362);
          const uint32_t y0 = __byte_perm(a2, a3, 0x5140), y1 = __byte_perm(a2, a3, 0x7362);
          uint8_t* dst = VT + 4 * dq * kFlVtRow + 4 * kq;
          *reinterpret_cast<uint32_t*>(dst) = __byte_perm(x0, y0, 0x5410);
          *reinterpret_cast<uint32_t*>(dst + kFlVtRow) = __byte_perm(x0, y0, 0x7632);
          *reinterpret_cast<uint32_t*>(dst + 2 * kFlVtRow) = __byte_perm(x1, y1, 0x5410);
          *reinterpret_cast<uint32_t*>(dst + 3 * kFlVtRow) = __byte_perm(x1, y1, 0x7632);
        }
        __syncthreads();  // V^T is complete before any warp reads it
      };
      auto flush = [&]() {  // out += 256 hi + lo (int64), the s32 sums back to zero
#pragma unroll
        for (int i = 0; i < kFlDims / 8; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int r = c < 2 ? rA : rB, d = dc + i * 8 + 2 * tq + (c & 1);
            const int64_t v = (int64_t)ch[i][c] * 256 + cl[i][c];
            if (i * 8 < nd && rout[r] >= 0 && d < D) out[rout[r] + d] = (flushed ? out[rout[r] + d] : 0) + v;
            ch[i][c] = 0, cl[i][c] = 0;
          }
      };
      sweep(true, [&](int b, int64_t k0) {
        scores(b, k0);
        // z becomes the int16 value weight w16 in place (0 where the row does not see the key).
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t av = vat[b][32 * (j >> 2) + kmap(j & 3, 2 * tq + (c & 1))];
            z[j][c] = ok[j] >> c & 1
                          ? (int32_t)clamp(round_shift(prob(j, c) * av, c < 2 ? sA : sB), -kInt16QMax, kInt16QMax)
                          : 0;
          }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 4 * h;
          const auto& w = z;
          const uint32_t ahi[4] = {pack4(w[j][0] >> 8, w[j][1] >> 8, w[j + 1][0] >> 8, w[j + 1][1] >> 8),
                                   pack4(w[j][2] >> 8, w[j][3] >> 8, w[j + 1][2] >> 8, w[j + 1][3] >> 8),
                                   pack4(w[j + 2][0] >> 8, w[j + 2][1] >> 8, w[j + 3][0] >> 8, w[j + 3][1] >> 8),
                                   pack4(w[j + 2][2] >> 8, w[j + 2][3] >> 8, w[j + 3][2] >> 8, w[j + 3][3] >> 8)};
          const uint32_t alo[4] = {pack4(w[j][0], w[j][1], w[j + 1][0], w[j + 1][1]),
                                   pack4(w[j][2], w[j][3], w[j + 1][2], w[j + 1][3]),
                                   pack4(w[j + 2][0], w[j + 2][1], w[j + 3][0], w[j + 3][1]),
                                   pack4(w[j + 2][2], w[j + 2][3], w[j + 3][2], w[j + 3][3])};
#pragma unroll
          for (int i = 0; i < kFlDims / 8; ++i)
            if (i * 8 < nd) {  // warp-uniform
              const uint8_t* bp = VT + (i * 8 + g) * kFlVtRow + 32 * h + 4 * tq;
              const uint32_t bf[2] = {smem_u32(bp), smem_u32(bp + 16)};
              mma_s8s8(ch[i], ahi, bf);
              mma_u8s8(cl[i], alo, bf);
            }
        }
      }, [&](int b, int64_t k0) {
        transpose(b, k0);
        since += kFlKeys;
        if (since > kFlFlush) {  // block-uniform: this tile would pass the bound; flush the earlier ones
          flush();
          flushed = true;
          since = kFlKeys;
        }
      });
      // out = sums << s (attn_out); C fragment c at row g (+ 8 for c >= 2), dimension 2 tq + (c & 1).
#pragma unroll
      for (int i = 0; i < kFlDims / 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = c < 2 ? rA : rB, d = dc + i * 8 + 2 * tq + (c & 1);
          if (i * 8 < nd && rout[r] >= 0 && d < D) {
            const int64_t v = (flushed ? out[rout[r] + d] : 0) + (int64_t)ch[i][c] * 256 + cl[i][c];
            out[rout[r] + d] = shl(v, c < 2 ? sA : sB);
          }
        }
    }
    __syncthreads();  // before the next run rewrites the tile's shared state
    i0 = i1;
  }
}

}  // namespace

size_t attn_flash_smem(int D) {
  const int QR = flash_row_bytes(D);
  return (size_t)(2 * kFlRows * QR + 4 * kFlKeys * QR + kFlDims * kFlVtRow);
}

bool attn_flash_fits(int D) {
  static int optin = -1;  // the device's opt-in shared memory per block (bytes)
  if (optin < 0) {
    int dev = 0, v = 0;
    optin = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess
                ? v
                : 0;
  }
  return D <= kMaxHeadDim && (int64_t)attn_flash_smem(D) + kFlStaticSmem <= optin;
}

void launch_attention_flash(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer,
                            const int32_t* seq, const int32_t* pos, const DevKV* kvs, int64_t score_mant,
                            int64_t score_shift, int64_t* out, cudaStream_t st, int64_t window, const Softcap& cap) {
  const int grp = nh / nkv;  // host-side division
  if (!attn_flash_fits(D)) throw std::invalid_argument("attention: the flash tiles do not fit in shared memory");
  const int P = kFlRows / grp;  // rows per tile (grp <= 16)
  const unsigned tiles = (unsigned)((nrows + P - 1) / P);
  const size_t smem = attn_flash_smem(D);
  static size_t granted = 0;  // dynamic shared memory above 48 KiB is an opt-in per kernel
  if (smem > granted) {
    if (cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
      throw std::runtime_error("attention: cudaFuncSetAttribute (flash tiles' shared memory) failed");
    granted = smem;
  }
  INTDET_LAUNCH_AT(attn_flash_kernel, shape_attn_flash(tiles, nkv, smem), st, q, row0, nrows, nh, nkv, grp, P, D,
                   layer, seq, pos, kvs, score_mant, score_shift, out, window, cap);
  check_launch("attention (flash tiles)");
}

}  // namespace cuda
}  // namespace intdet
