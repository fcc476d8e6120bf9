// CUDA kernels: the linear layers (int8 GEMV, __dp2a GEMM, tensor-core
// IMMA GEMM; int4 GEMV and GEMM). Same bits as the CPU's linear layers
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

// ---------------------------------------------------------------- linear layers

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

// Decode GEMV: each output channel j is served by wpc = 1 << wlg warps of one
// block (split-K inside the block: warp part p takes 16-byte chunks
// [p cpw, (p + 1) cpw) of the row), rows t0..t0+TT-1 (blockIdx.y). Each lane
// keeps kGemvUnroll independent 16-byte weight loads in flight: the next
// group is issued before the current one is used, and the first before the
// block waits for the previous launch (grid_dep_wait) and runs its prologue.
// Every dot16 is exact in int32 (16 products < 2^26) and goes straight into
// an int64 accumulator; the split parts are added in int64 through shared
// memory, so any split gives the same sum. vec: K % 16 == 0 (aligned 16-byte
// loads of w and q rows); otherwise scalar loads and wlg = 0.
constexpr int kGemvUnroll = 4;

// The fields of segment si of a GemvSegs (no dynamic index into the kernel
// parameters: that would copy them to local memory).
__device__ __forceinline__ GemvSeg seg_at(const GemvSegs& s, int si) {
  return si == 0 ? s.s[0] : si == 1 ? s.s[1] : s.s[2];
}

// The GEMV prologue (GemvIn, kind kGemvNorm or kGemvQuant): rows 0..nt-1 of
// the input into act [nt, K] int16 and es [nt] (shared), by the whole block,
// with launch_norm_quant16's or launch_quant16_i64's steps. y: shared int32
// [K] (the normed row). Ends with a barrier.
__device__ void gemv_prologue(const GemvIn& in, int nt, int K, int16_t* act, int32_t* es, int32_t* y, int64_t* red) {
  for (int t = 0; t < nt; ++t) {
    int ex;
    if (in.kind == kGemvNorm) {  // block-uniform
      norm_row(in.x + (int64_t)t * K, in.g, K, in.eps_q60, in.in_frac, y, red);
      ex = quant16_block(y, K, act + (int64_t)t * K, red);
    } else {
      ex = quant16_block(in.a + (int64_t)t * K, K, act + (int64_t)t * K, red);
    }
    if (threadIdx.x == 0) es[t] = ex;
    __syncthreads();  // y and red are reused by the next row; act and es complete
  }
}

// Several linear layers on the same input in one launch (segments: q, k, v;
// or gate and up): blocks 0..s[0].blocks-1 serve segment 0, and so on. In
// GLU mode (two segments of the same N: gate and up) every block serves the
// same channels of both, warps (slots) alternating gate / up, and the gate's
// lane applies SwiGLU or GeGLU to the pair: glu_out[t, j] (Q32 int64).
// kStaged (TT <= kPrologueRows, one grid row): the input comes from the
// prologue in dynamic shared memory (gemv_prologue_smem), not q and e.
template <int TT, bool kStaged>
__global__ void __launch_bounds__(kGemv8Threads)
    gemv_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K, const GemvSegs segs,
                int residual, int vec, int wlg, int cpw, const GemvIn in) {
  __shared__ int64_t part[kGemv8Warps][TT];
  __shared__ int32_t gluv[kGemv8Warps][TT];
  __shared__ int64_t red[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int p = warp & ((1 << wlg) - 1), slot = warp >> wlg, nslot = kGemv8Warps >> wlg;
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
  const bool run = valid && vec;
  const int C = K >> 4;
  const int c0 = p * cpw, c1 = c0 + cpw < C ? c0 + cpw : C;
  int c = c0 + lane;
  int4 wv[kGemvUnroll];  // the weights do not depend on earlier launches: issued before the wait
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u)
    wv[u] = run && c + 32 * u < c1 ? load16(wj + 16 * (int64_t)(c + 32 * u)) : make_int4(0, 0, 0, 0);
  grid_dep_wait();
  const int16_t* q0;  // the block's input rows [nt, K]
  const int32_t* ev;  // their exponents, by row t (t0 is 0 when staged)
  if constexpr (kStaged) {
    INTDET_DYN_SMEM(int4, smem);
    int32_t* es = reinterpret_cast<int32_t*>(smem);
    int16_t* act = reinterpret_cast<int16_t*>(smem + 1);
    int32_t* y = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(act) + gemv_prologue_act_bytes(TT, K));
    gemv_prologue(in, nt, K, act, es, y, red);
    q0 = act;
    ev = es;
  } else {
    q0 = q + (int64_t)t0 * K;
    ev = e;
  }
  int64_t acc[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) acc[tt] = 0;
  if (run) {
    for (; c < c1; c += 32 * kGemvUnroll) {
      int4 cur[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) cur[u] = wv[u];
      const int cn = c + 32 * kGemvUnroll;
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u)
        wv[u] = cn + 32 * u < c1 ? load16(wj + 16 * (int64_t)(cn + 32 * u)) : make_int4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        if (c + 32 * u < c1) {
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) {
            if (tt < nt) {
              const int16_t* ap = q0 + (int64_t)tt * K + 16 * (c + 32 * u);
              if constexpr (kStaged)
                acc[tt] += dot16(load16_shared(ap), load16_shared(ap + 8), cur[u]);
              else
                acc[tt] += dot16(load16(ap), load16(ap + 8), cur[u]);
            }
          }
        }
      }
    }
  } else if (valid && !vec) {
    for (int k = lane; k < K; k += 32) {
      const int32_t wk = wj[k];
#pragma unroll
      for (int tt = 0; tt < TT; ++tt)
        if (tt < nt) acc[tt] += (int32_t)q0[(int64_t)tt * K + k] * wk;
    }
  }
  grid_dep_launch();  // the next launch may start its weight loads now
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
        const int64_t v = linear_epilogue(acc[tt], mj, sj, ev[t], S.bias, j);
        store_out(S.out + t * S.ldo + j, v, residual);
        gluv[warp][tt] = (int32_t)v;
      }
    }
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
}

// Prefill GEMM: 64 rows x 64 channels per block of 256 threads, K in tiles of
// 32; each thread owns a 4 x 4 micro-tile (rows ty + 16 r, channels tx + 16 c).
// int32 partials over 8 tiles (256 products), then int64.
constexpr int kTileK = 32, kTilesPerPart = 8;  // kTileM x kTileN: launch_shapes.cuh

__global__ void __launch_bounds__(kTileThreads)
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
constexpr int kMmaK = 64, kMmaRow = kMmaK + 16;  // kMmaM, kMmaN, kMmaThreads: launch_shapes.cuh
constexpr int64_t kMmaFlushK = 32768;

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

// ---------------------------------------------------------------- skinny tensor-core GEMM (decode batches)
//
// mma_gemm_kernel's exact arithmetic (the hi / lo byte split, s32 sums into
// int64 every kMmaFlushK inputs) for T = kGemvDecodeRows + 1 ..
// kSkinnyMaxRows rows (and every prefill since the 3-stage pipeline and
// the fused segments), shaped for decode: a block is 16 MT rows (MT = 1, 2,
// 4: no 64-row tile three quarters empty at 16 rows) times kSkN = 64
// channels; warp w takes channels 16 w .. 16 w + 15 (two n8 tiles) of every
// row, so the block's A fragments are shared through shared memory and its
// weight tile is read from global memory once. K tiles of kSkK = 64 go
// through a kSkStages = 3 stage cp.async pipeline (tiles i + 1 and i + 2 are
// in flight while tile i feeds the tensor cores); the activations are staged as raw int16 and
// split into hi / lo bytes by two PRMT per fragment register. Grid: row
// tiles fastest (launch_shapes.cuh shape_skinny), so the row tiles of one
// weight slice run together and DRAM streams each weight byte once; then
// channel tiles; then K splits (blockIdx.z: K tiles [z kper, (z + 1) kper)),
// so small N still fills the SMs. A split's int64 sums are added into the
// tile's slots of part (int64 atomics: integer sums do not depend on their
// order) and the last split to arrive (last_block_arrives) takes the totals
// with atomicExch (which leaves the slots zero for the next launch) and runs
// the epilogue. vec: K % 16 == 0 (16-byte cp.async of activation and weight
// chunks); otherwise element loads into the same staging.
constexpr int kSkRow = kSkK + 16;  // staging row: int16 for activations (160 bytes), bytes for weights (80)

// The channel tile's two halves: rows 0..31 are channels jb0.. of w0, rows
// 32..63 channels jb1.. of w1 (one segment: w0 = w1, jb1 = jb0 + 32; GLU
// mode: gate and up of the same channels), N channels in each.
struct SkinnyHalves {
  const int8_t* w0;
  const int8_t* w1;
  int64_t jb0, jb1;
  __device__ __forceinline__ const int8_t* row(int r, int K, int N) const {  // null: beyond N
    const int64_t j = (r < kSkN / 2 ? jb0 : jb1) + (r & (kSkN / 2 - 1));
    return j < N ? (r < kSkN / 2 ? w0 : w1) + j * K : nullptr;
  }
};

template <int BM>
__device__ __forceinline__ void skinny_stage(int16_t* A, uint8_t* B, const int16_t* __restrict__ q, int64_t t0, int T,
                                             const SkinnyHalves& wh, int N, int K, int64_t k0, int vec) {
  const int tid = threadIdx.x;
  if (vec) {
#pragma unroll
    for (int i = 0; i < BM * (kSkK / 8) / kSkThreads; ++i) {  // BM rows x 8 chunks of 8 int16
      const int idx = tid + kSkThreads * i, r = idx >> 3, c = (idx & 7) * 8;
      const int64_t t = t0 + r;
      int16_t* dst = A + r * kSkRow + c;
      if (t < T && k0 + c < K)
        cp_async16(dst, q + t * K + k0 + c);
      else
        *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kSkN * (kSkK / 16) / kSkThreads; ++i) {  // 64 channels x 4 chunks of 16 bytes
      const int idx = tid + kSkThreads * i, r = idx >> 2, c = (idx & 3) * 16;
      const int8_t* wr = wh.row(r, K, N);
      uint8_t* dst = B + r * kSkRow + c;
      if (wr && k0 + c < K)
        cp_async16(dst, wr + k0 + c);
      else
        *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
    }
  } else {
    for (int idx = tid; idx < BM * kSkK; idx += kSkThreads) {
      const int r = idx / kSkK, c = idx % kSkK;  // constant divisor: shifts
      const int64_t t = t0 + r, k = k0 + c;
      A[r * kSkRow + c] = (t < T && k < K) ? q[t * K + k] : (int16_t)0;
    }
    for (int idx = tid; idx < kSkN * kSkK; idx += kSkThreads) {
      const int r = idx / kSkK, c = idx % kSkK;
      const int8_t* wr = wh.row(r, K, N);
      const int64_t k = k0 + c;
      B[r * kSkRow + c] = (uint8_t)((wr && k < K) ? wr[k] : 0);
    }
  }
}

// One A fragment register pair from raw int16 staging: columns c..c+3 of a
// row (8 bytes) as their hi bytes (s8) and lo bytes (u8).
__device__ __forceinline__ void split_hi_lo(const int16_t* p, uint32_t& hi, uint32_t& lo) {
  const uint32_t x = *reinterpret_cast<const uint32_t*>(p), y = *reinterpret_cast<const uint32_t*>(p + 2);
  hi = __byte_perm(x, y, 0x7531);
  lo = __byte_perm(x, y, 0x6420);
}

// Segments (q, k, v on the same input: one launch): the channel tiles of
// segment 0 come first in blockIdx.y, then segment 1's, and so on (blocks:
// a segment's channel tiles). GLU mode (segs.glu: gate and up of the same
// N): a block takes 32 channels of both, warps 0-1 the gate's and 2-3 the
// up's; after both are stored, the up warps hand their values to the gate
// warps through shared memory and those store glu_one(gate, up) (SwiGLU or
// GeGLU, the GEMV's epilogue) into glu_out.
template <int MT>
__global__ void __launch_bounds__(kSkThreads)
    skinny_gemm_kernel(const int16_t* __restrict__ q, const int32_t* __restrict__ e, int T, int K, const GemvSegs segs,
                       int residual, int vec, int kper, unsigned long long* __restrict__ part,
                       int* __restrict__ counters) {
  constexpr int BM = 16 * MT;
  __shared__ __align__(16) int16_t As[kSkStages][BM * kSkRow];
  __shared__ __align__(16) uint8_t Bs[kSkStages][kSkN * kSkRow];
  __shared__ int flag;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wn = warp * 16;
  int si = 0, by = (int)blockIdx.y;
  if (!segs.glu)
    while (si + 1 < segs.n && by >= seg_at(segs, si).blocks) by -= seg_at(segs, si++).blocks;  // block-uniform
  const GemvSeg S = seg_at(segs, si);
  const GemvSeg Sw = segs.glu ? seg_at(segs, warp >> 1) : S;  // this warp's segment
  const int N = S.N;
  const int64_t t0 = (int64_t)blockIdx.x * BM;
  SkinnyHalves wh{S.w, S.w, (int64_t)by * kSkN, (int64_t)by * kSkN + kSkN / 2};
  if (segs.glu) wh = SkinnyHalves{segs.s[0].w, segs.s[1].w, (int64_t)by * (kSkN / 2), (int64_t)by * (kSkN / 2)};
  const int64_t jw = (wn < kSkN / 2 ? wh.jb0 : wh.jb1) + (wn & (kSkN / 2 - 1));  // this warp's first channel
  const int KT = (K + kSkK - 1) / kSkK;
  const int kt0 = (int)blockIdx.z * kper, kt1 = kt0 + kper < KT ? kt0 + kper : KT;
  int64_t acc[MT][2][4];
  int32_t ph[MT][2][4], pl[MT][2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0, ph[mt][nt][r] = 0, pl[mt][nt][r] = 0;
  // The pipeline: kSkStages - 1 tiles in flight while one feeds the tensor cores.
#pragma unroll
  for (int i = 0; i < kSkStages - 1; ++i) {
    if (kt0 + i < kt1) skinny_stage<BM>(As[i], Bs[i], q, t0, T, wh, N, K, (int64_t)(kt0 + i) * kSkK, vec);
    cp_async_commit();  // (an empty group where there is no tile: the waits count the same)
  }
  int64_t since = 0;
  int s = 0;  // the stage of tile kt
  for (int kt = kt0; kt < kt1; ++kt) {
    const int sn = s == 0 ? kSkStages - 1 : s - 1;  // tile kt - 1's stage, free since the last barrier
    if (kt + kSkStages - 1 < kt1)
      skinny_stage<BM>(As[sn], Bs[sn], q, t0, T, wh, N, K, (int64_t)(kt + kSkStages - 1) * kSkK, vec);
    cp_async_commit();
    cp_async_wait<kSkStages - 1>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();  // ... and every thread's
    const int16_t* A = As[s];
    const uint8_t* B = Bs[s];
#pragma unroll
    for (int kk = 0; kk < kSkK; kk += 32) {
      uint32_t b[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint8_t* p = B + (wn + nt * 8 + g) * kSkRow + kk + 4 * tq;
        b[nt][0] = smem_u32(p);
        b[nt][1] = smem_u32(p + 16);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int16_t* a0 = A + (mt * 16 + g) * kSkRow + kk + 4 * tq;
        const int16_t* a8 = a0 + 8 * kSkRow;
        uint32_t ahi[4], alo[4];
        split_hi_lo(a0, ahi[0], alo[0]);
        split_hi_lo(a8, ahi[1], alo[1]);
        split_hi_lo(a0 + 16, ahi[2], alo[2]);
        split_hi_lo(a8 + 16, ahi[3], alo[3]);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          mma_s8s8(ph[mt][nt], ahi, b[nt]);
          mma_u8s8(pl[mt][nt], alo, b[nt]);
        }
      }
    }
    __syncthreads();  // stage s is refilled by the next iteration's copies
    s = s + 1 == kSkStages ? 0 : s + 1;
    since += kSkK;
    if (since >= kMmaFlushK || kt + 1 == kt1) {  // block-uniform
      since = 0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[mt][nt][r] += (int64_t)ph[mt][nt][r] * 256 + pl[mt][nt][r];
            ph[mt][nt][r] = 0, pl[mt][nt][r] = 0;
          }
    }
  }
  // C fragment: c[r] at row g (+ 8 for r >= 2), column 2 tq + (r & 1).
  if (gridDim.z > 1) {  // split-K: int64 partials into the tile's slots; the last split takes the totals
    unsigned long long* P = part + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * (BM * kSkN);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          atomicAdd(P + (mt * 16 + g + (r >= 2 ? 8 : 0)) * kSkN + wn + nt * 8 + 2 * tq + (r & 1),
                    (unsigned long long)acc[mt][nt][r]);
    if (!last_block_arrives(counters + blockIdx.y * gridDim.x + blockIdx.x, (int)gridDim.z, &flag)) return;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          acc[mt][nt][r] =
              (int64_t)atomicExch(P + (mt * 16 + g + (r >= 2 ? 8 : 0)) * kSkN + wn + nt * 8 + 2 * tq + (r & 1), 0ull);
  }
  // GLU: the up warps' values for the gate warps, [BM][32] int32 over the
  // activation staging (no longer read: the loop ended with a barrier)
  int32_t* upv = reinterpret_cast<int32_t*>(&As[0][0]);
  static_assert(sizeof(As) >= sizeof(int32_t) * BM * (kSkN / 2), "GLU exchange fits the staging");
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int rt = mt * 16 + g + (r >= 2 ? 8 : 0);
      const int64_t t = t0 + rt;
      if (t >= T) continue;
      const int32_t et = e[t];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int c = nt * 8 + 2 * tq + (r & 1);
        const int64_t j = jw + c;
        if (j < N) {
          const int64_t v = linear_epilogue(acc[mt][nt][r], Sw.mant[j], Sw.shift[j], et, Sw.bias, j);
          store_out(Sw.out + t * Sw.ldo + j, v, residual);
          acc[mt][nt][r] = v;
          if (segs.glu && wn >= kSkN / 2) upv[rt * (kSkN / 2) + (wn & (kSkN / 2 - 1)) + c] = (int32_t)v;
        }
      }
    }
  if (!segs.glu) return;  // grid-uniform
  __syncthreads();
  if (wn >= kSkN / 2) return;  // the gate warps pair each value with its up value
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int rt = mt * 16 + g + (r >= 2 ? 8 : 0);
      const int64_t t = t0 + rt;
      if (t >= T) continue;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int c = nt * 8 + 2 * tq + (r & 1);
        const int64_t j = jw + c;
        if (j < N)
          segs.glu_out[t * segs.glu_ldo + j] =
              glu_one(acc[mt][nt][r], upv[rt * (kSkN / 2) + wn + c], segs.glu == 2);
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

// Prefill GEMM with int4 weights: gemm_kernel's 64 x 64 tiles and 4 x 4
// micro-tiles, one K tile = one group of 32. Codes are unpacked to int8 in
// shared memory, so the inner loop is gemm_kernel's __dp2a loop; per group
// each thread also sums its rows' activations (Q) and folds gd * S + gm * Q
// into int64.
__global__ void __launch_bounds__(kTileThreads)
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

}  // namespace

int g_gemv_split = -1;  // tests: force the split
void set_gemv_split_override(int wlg) { g_gemv_split = wlg < 0 ? -1 : wlg > 2 ? 2 : wlg; }

int gemv_split_log2(int K, int N) {
  // Warps per output channel (1, 2 or 4; split-K inside a block): enough
  // that a lane makes at most two passes of kGemvUnroll loads, and one pass
  // when N is small (the N = 1024 projections: more warps in flight).
  const int64_t C = K / 16, per = (N < 4096 ? 32 : 64) * kGemvUnroll;
  return C > 2 * per ? 2 : C > per ? 1 : 0;
}

bool g_gemv_pdl = false;
void set_gemv_pdl(bool on) { g_gemv_pdl = on; }
bool pdl_enabled() { return g_gemv_pdl; }

bool gemv_prologue_fits(int kind, int T, int K) {
  return kind != kGemvQ && T >= 1 && T <= kPrologueRows && K > 0 &&
         gemv_prologue_smem(kind == kGemvNorm, T, K) <= kGemvPrologueSmem;
}

void launch_gemv(const int16_t* q, const int32_t* e, int T, int K, GemvSegs segs, bool residual, cudaStream_t st,
                 const GemvIn& in) {
  if (T <= 0 || segs.n <= 0) return;
  if (segs.n > 3 || (segs.glu && (segs.n != 2 || segs.s[0].N != segs.s[1].N)))
    throw std::invalid_argument("linear (GEMV): bad segments");
  const bool staged = in.kind != kGemvQ;
  if (staged && !gemv_prologue_fits(in.kind, T, K))
    throw std::invalid_argument("linear (GEMV): a prologue needs at most 2 rows that fit in shared memory");
  if ((in.kind == kGemvNorm && (!in.x || !in.g)) || (in.kind == kGemvQuant && !in.a))
    throw std::invalid_argument("linear (GEMV): prologue input missing");
  const size_t smem = staged ? gemv_prologue_smem(in.kind == kGemvNorm, T, K) : 0;
  const int vec = K % 16 == 0;
  int maxN = 0;
  for (int i = 0; i < segs.n; ++i) maxN = std::max(maxN, segs.s[i].N);
  int wlg = !vec ? 0 : g_gemv_split >= 0 ? g_gemv_split : gemv_split_log2(K, maxN);
  if (segs.glu && wlg > 1) wlg = 1;  // two slots (gate, up) per block at least
  const int C = K / 16, cpw = (C + (1 << wlg) - 1) >> wlg;
  const int nslot = kGemv8Warps >> wlg;
  int64_t gx = 0;
  for (int i = 0; i < segs.n; ++i) {
    const int per = segs.glu ? nslot / 2 : nslot;
    segs.s[i].blocks = (segs.s[i].N + per - 1) / per;
    gx += segs.s[i].blocks;
  }
  if (segs.glu) gx = segs.s[0].blocks;
  if (gx > 0x7fffffff) throw std::invalid_argument("linear (GEMV): too many channels");
  const bool pdl = g_gemv_pdl;
  if (T == 1 && staged) {
    launch_at(gemv_kernel<1, true>, shape_gemv(gx, 1, smem), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  } else if (T == 2 && staged) {
    launch_at(gemv_kernel<2, true>, shape_gemv(gx, 1, smem), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  } else if (T == 1) {
    launch_at(gemv_kernel<1, false>, shape_gemv(gx, 1, 0), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  } else if (T <= 2) {
    launch_at(gemv_kernel<2, false>, shape_gemv(gx, 1, 0), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  } else if (T <= 4) {
    launch_at(gemv_kernel<4, false>, shape_gemv(gx, 1, 0), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  } else {
    const unsigned gy = (unsigned)((T + 7) / 8);
    if (gy > 65535) throw std::invalid_argument("linear (GEMV): too many rows");
    launch_at(gemv_kernel<8, false>, shape_gemv(gx, gy, 0), pdl, st, q, e, T, K, segs, (int)residual, vec, wlg, cpw, in);
  }
  check_launch("linear (GEMV)");
}

int g_prefill_gemm = kLinearSkinny;  // set_prefill_gemm_override
void set_prefill_gemm_override(int path) { g_prefill_gemm = path == kLinearGemm ? kLinearGemm : kLinearSkinny; }
int prefill_gemm() { return g_prefill_gemm; }

int g_skinny_split = 0;  // tests: force the K splits
void set_skinny_split_override(int splits) { g_skinny_split = splits < 0 ? 0 : splits; }

void launch_skinny(const int16_t* q, const int32_t* e, int T, int K, GemvSegs segs, bool residual, cudaStream_t st,
                   const GemmScratch* sc) {
  if (T <= 0 || segs.n <= 0) return;
  if (segs.n > 3 || (segs.glu && (segs.n != 2 || segs.s[0].N != segs.s[1].N || !segs.glu_out)))
    throw std::invalid_argument("linear (skinny GEMM): bad segments");
  const int vec = K % 16 == 0;
  int64_t cols = 0;
  for (int i = 0; i < segs.n; ++i) {
    segs.s[i].blocks = (int)skinny_col_tiles(segs.s[i].N);
    cols += segs.s[i].blocks;
  }
  if (segs.glu) cols = (segs.s[0].N + kSkN / 2 - 1) / (kSkN / 2);  // 32 channels of gate and up per tile
  const int64_t rows = skinny_row_tiles(T), tiles = rows * cols;
  if (cols > 65535) throw std::invalid_argument("linear (skinny GEMM): too many output channels");
  const int KT = (K + kSkK - 1) / kSkK;
  int splits = g_skinny_split > 0 ? g_skinny_split : skinny_splits(tiles, KT);
  if (!sc || tiles > kSkinnyPartTiles || KT < 2) splits = 1;  // no scratch for the partial sums: unsplit
  const int kper = (std::max(KT, 1) + splits - 1) / splits;
  splits = std::max(1, (KT + kper - 1) / kper);  // no empty split
  unsigned long long* part = splits > 1 ? sc->part : nullptr;
  int* counters = splits > 1 ? sc->counters : nullptr;
  const LaunchShape sh = shape_skinny(T, (int)cols * kSkN, splits);
  const int mt = skinny_mt(T);
  if (mt == 1) {
    INTDET_LAUNCH_AT(skinny_gemm_kernel<1>, sh, st, q, e, T, K, segs, (int)residual, vec, kper, part, counters);
  } else if (mt == 2) {
    INTDET_LAUNCH_AT(skinny_gemm_kernel<2>, sh, st, q, e, T, K, segs, (int)residual, vec, kper, part, counters);
  } else {
    INTDET_LAUNCH_AT(skinny_gemm_kernel<4>, sh, st, q, e, T, K, segs, (int)residual, vec, kper, part, counters);
  }
  check_launch("linear (skinny GEMM)");
}

void launch_linear(const int16_t* q, const int32_t* e, int T, int K, const int8_t* w, const int32_t* mant,
                   const int32_t* shift, const int32_t* bias, int N, int32_t* out, int64_t ldo, bool residual,
                   int path, cudaStream_t st, const GemmScratch* sc) {
  if (T <= 0 || N <= 0) return;
  const int vec = K % 16 == 0;
  if (path == kLinearAuto)
    path = T <= kGemvDecodeRows ? kLinearGemv : T <= kSkinnyMaxRows ? kLinearSkinny : g_prefill_gemm;
  if (path == kLinearGemv) {
    GemvSegs segs{};
    segs.s[0] = GemvSeg{w, mant, shift, bias, out, ldo, N, 0};
    segs.n = 1;
    launch_gemv(q, e, T, K, segs, residual, st);
    return;
  } else if (path == kLinearSkinny) {
    GemvSegs segs{};
    segs.s[0] = GemvSeg{w, mant, shift, bias, out, ldo, N, 0};
    segs.n = 1;
    launch_skinny(q, e, T, K, segs, residual, st, sc);
    return;
  } else if (path == kLinearGemm) {
    if (gemm_mma_rows(T) > 65535) throw std::invalid_argument("linear (GEMM): too many rows");
    INTDET_LAUNCH_AT(mma_gemm_kernel, shape_gemm_mma(N, T), st, q, e, T, K, w,
                  mant, shift, bias, N, out, ldo, residual, vec);
  } else {
    if (gemm_tile_rows(T) > 65535) throw std::invalid_argument("linear (GEMM): too many rows");
    INTDET_LAUNCH_AT(gemm_kernel, shape_gemm_tile(N, T), st, q, e, T, K, w, mant, shift, bias,
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
    if (T == 1) {
      INTDET_LAUNCH_AT(gemv_w4_kernel<1>, shape_gemv_w4(N, 1), st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else if (T <= 2) {
      INTDET_LAUNCH_AT(gemv_w4_kernel<2>, shape_gemv_w4(N, 1), st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else if (T <= 4) {
      INTDET_LAUNCH_AT(gemv_w4_kernel<4>, shape_gemv_w4(N, 1), st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    } else {
      const unsigned gy = (unsigned)((T + 7) / 8);
      if (gy > 65535) throw std::invalid_argument("linear (int4 GEMV): too many rows");
      INTDET_LAUNCH_AT(gemv_w4_kernel<8>, shape_gemv_w4(N, gy), st, q, e, T, K, w4, gd, gm, mant, shift, bias, N, out, ldo, residual);
    }
  } else {
    if (gemm_tile_rows(T) > 65535) throw std::invalid_argument("linear (int4 GEMM): too many rows");
    INTDET_LAUNCH_AT(gemm_w4_kernel, shape_gemm_tile(N, T), st, q, e, T, K, w4, gd, gm,
                  mant, shift, bias, N, out, ldo, residual);
  }
  check_launch("linear (int4)");
}

}  // namespace cuda
}  // namespace intdet
