// CUDA kernel: decode attention in one launch (kAttnFused), one block per
// (row, kv head) over all the row's positions, the softmax in shared memory.
// Same bits as attend_head (kernels_elementwise.cu says why; the comment
// below says why this decomposition keeps them).
#include "kernels_shared.cuh"  // first: kernels.cuh, then the shared device helpers

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace cuda {
namespace {

// attn_fused_kernel: shape_attn_fused (grid (nkv, nrows), kAttnFusedThreads
// threads; launch_shapes.cuh), one block per
// (row t, kv head) serving the grp query heads h0..h0+grp-1 of that kv head
// (GQA: each K and V row is read once for the group), over the row's n
// positions lo..pos (n <= attn_fused_max_pos(grp), the launcher checks):
//
//  0. (RopeFold) k norm + RoPE of the row's K, quant8_row of K and V into
//     the cache at the row's own position (and into shared memory: this block
//     reads them back itself, never through __ldg); then each query head's
//     q norm + RoPE. Each query head's quant16 into shared memory.
//  1. Scores: L = D/16 lanes per position (power of two), kFusedUnroll
//     16-byte K loads in flight per lane, dot16 per head, int32 sum over the
//     L lanes into sc [grp][n] in shared memory; then attn_score (and the
//     softcap) by a thread per position.
//  2. The softmax, attend_head's three passes, each for all heads at once
//     (a warp reduction per head, the warps' results in shared memory, one
//     barrier per pass): zmax = max z; e = exp2_neg_q30(zmax - z), tot = sum e
//     (int64); R = floor_div(2^62, tot) by one thread per head (a DivBy
//     reciprocal: no loop of quotient bits); p = round_shift(e R, 46),
//     wmax = max p va; s = bitlen(wmax) - 15, w16 = round_shift(p va, s).
//     Every pass needs the previous one's complete reduction, so there is no
//     online rescaling: zmax is known before any exp2, as in the spec.
//  3. P.V, two heads at a time: each lane kFusedUnroll 16-byte V loads in
//     flight; two positions' bytes interleaved (__byte_perm) so that one
//     __dp2a_lo / hi adds w_a v_a[d] + w_b v_b[d] per head into int32 (16
//     dims of 2 positions: 8 PRMT and 16 IDP per head); the warp's lanes of
//     the same dims added by shuffles (int32); the warps' sums added in int64; out =
//     sum << s (attn_out).
//  4. quant16 of the row (the o-projection's input) needs every head: each
//     block puts its max |out| into the row's slot (atomicMax), and the last
//     block of the row to arrive (the threadFenceReduction pattern) writes
//     act = round_shift(out, e) for the whole row and resets the slot.
//
// Exact and order-free: every reduction across threads is an integer max or
// sum, associative and commutative, with no partial sum able to overflow:
// q . k at most D <= 256 products (< 2^31 for every subset); tot <= n 2^30;
// a lane's P.V sum covers positions i = slot mod slots, and a warp's sum the
// positions of its 32 / L slots, at most ceil(n / 8) + 32 / L + 1 <= 289 of them
// for n <= kFusedMaxPos (each |w16 v| <= 32767 * 127, so < 2^31: kPvBlock =
// 512 is the bound); the warps' sums go into int64. Everything else is the
// CPU's per-position formula on those exact values.
constexpr int kFusedThreads = kAttnFusedThreads;
constexpr int kFusedWarps = kFusedThreads / 32;
constexpr int64_t kFusedMaxPos = 2048;
constexpr int64_t kFusedScoreInts = 6144;  // grp * n int32 in dynamic shared memory: 24 KiB, static ~21 KiB (48 KiB in all)
constexpr int kFusedMaxGroup = 16;
constexpr int kFusedUnroll = 4;  // K or V rows each lane loads before it uses any (latency: loads in flight)
static_assert(kFusedUnroll % 2 == 0, "P.V takes the V rows in pairs (__dp2a)");
static_assert((kFusedMaxPos + kFusedWarps - 1) / kFusedWarps + 32 + 1 <= kPvBlock,
              "a warp's int32 P.V sum covers at most kPvBlock positions");

__global__ void __launch_bounds__(kFusedThreads)
    attn_fused_kernel(const int32_t* __restrict__ qbuf, int row0, int nh, int nkv, int grp, int D, int layer,
                      const int32_t* __restrict__ seq, const int32_t* __restrict__ pos,
                      const DevKV* __restrict__ kvs, int64_t score_mant, int64_t score_shift, int64_t window,
                      unsigned long long* __restrict__ rmax, int* __restrict__ cnt, int64_t* __restrict__ out,
                      int16_t* __restrict__ act, int32_t* __restrict__ act_e, RopeFold rf, Softcap cap) {
  INTDET_DYN_SMEM(int32_t, sc);  // [grp][n]: score, then exp2, p, the int16 value weight
  // The group's int16 queries [grp][D] (step 1), then the P.V partials
  // [warp][2][D] (step 3): never both at once.
  __shared__ __align__(16) int32_t un[kFusedWarps * 2 * kMaxHeadDim];
  __shared__ int32_t hrow[kMaxHeadDim], hy[kMaxHeadDim];  // rf.on: a head after q/k norm + RoPE; norm_rope's y
  __shared__ __align__(16) int8_t k8[kMaxHeadDim], v8[kMaxHeadDim];  // rf.on: the appended K and V rows
  __shared__ int64_t red[33];
  __shared__ int64_t pmax[kFusedMaxGroup][kFusedWarps], psum[kFusedMaxGroup][kFusedWarps];
  __shared__ int64_t hR[kFusedMaxGroup];
  __shared__ int eq[kFusedMaxGroup], hs[kFusedMaxGroup];
  __shared__ int32_t k8a, v8a;
  __shared__ int flag;
  __shared__ unsigned long long rowmax;
  int16_t* qq = reinterpret_cast<int16_t*>(un);
  int32_t* pv = un;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.x, h0 = kvh * grp;
  const int64_t tl = blockIdx.y, t = row0 + tl;
  // Launched with programmatic dependent launch after the q+k+v GEMV (sm_90):
  // nothing an earlier launch wrote (or still reads: act) is touched before this.
  grid_dep_wait();
  const DevKV kv = kvs[seq[t]];
  int64_t lo, n;
  attn_range(pos[t], window, &lo, &n);
  const int64_t lay = ((int64_t)layer * kv.max_len + lo) * nkv + kvh;  // [L, P, nkv] index of (layer, lo, kvh)
  const int64_t rs = (int64_t)nkv * D;  // int8 elements between positions
  const int8_t* kb = kv.k + lay * D;
  const int8_t* vb = kv.v + lay * D;
  const int32_t* kab = kv.ka + lay;
  const int32_t* vab = kv.va + lay;
  const bool own = rf.on;  // block-uniform: the row's own position n - 1 comes from shared memory

  // 0. The KV append (RopeFold) and the group's queries.
  if (own) {
    const int64_t base = ((int64_t)layer * kv.max_len + pos[t]) * nkv + kvh;
    const int64_t src = (t * nkv + kvh) * D;
    for (int d = tid; d < D; d += kFusedThreads) hrow[d] = rf.kb[src + d];
    __syncthreads();
    norm_rope_head(hrow, D, rf.k_norm, rf.eps_q60, pos[t], rf.cos, rf.sin, hy, red);
    __syncthreads();
    const int32_t a = quant8_block(hrow, D, k8, red);
    const int32_t av = quant8_block(rf.vb + src, D, v8, red);
    __syncthreads();
    for (int d = tid; d < D; d += kFusedThreads) kv.k[base * D + d] = k8[d], kv.v[base * D + d] = v8[d];
    if (tid == 0) kv.ka[base] = a, kv.va[base] = av, k8a = a, v8a = av;
    for (int g = 0; g < grp; ++g) {  // q norm + RoPE per head (left unrotated in qbuf), then quant16
      __syncthreads();  // the previous head's reads of hrow are done
      const int32_t* qr = qbuf + (t * nh + h0 + g) * D;
      for (int d = tid; d < D; d += kFusedThreads) hrow[d] = qr[d];
      __syncthreads();
      norm_rope_head(hrow, D, rf.q_norm, rf.eps_q60, pos[t], rf.cos, rf.sin, hy, red);
      __syncthreads();
      int64_t m = 0;
      for (int d = tid; d < D; d += kFusedThreads) m = imax(m, iabs(hrow[d]));
      m = block_max(m, 0, red);
      const int e_q = (int)imax(bitlen(m) - 15, 0);
      for (int d = tid; d < D; d += kFusedThreads)
        qq[g * D + d] = (int16_t)clamp(round_shift(hrow[d], e_q), -kInt16QMax, kInt16QMax);
      if (tid == 0) eq[g] = e_q;
    }
  } else {  // quant16_row of each query head, a warp per head
    for (int g = warp; g < grp; g += kFusedWarps) {
      const int32_t* qr = qbuf + (t * nh + h0 + g) * D;
      int64_t m = 0;
      for (int d = lane; d < D; d += 32) m = imax(m, iabs(qr[d]));
      m = warp_max(m);
      const int e_q = (int)imax(bitlen(m) - 15, 0);
      for (int d = lane; d < D; d += 32) qq[g * D + d] = (int16_t)clamp(round_shift(qr[d], e_q), -kInt16QMax, kInt16QMax);
      if (lane == 0) eq[g] = e_q;
    }
  }
  __syncthreads();

  // 1. Scores into sc: L lanes per position, slots positions per pass of the block.
  const bool vec = D % 16 == 0;
  const int lg = attn_lanes_log2(D, vec), L = 1 << lg, sub = lane & (L - 1), slots = kFusedThreads >> lg,
            slot = tid >> lg;
  // The loops below take the cache's positions 0..nc-1; the row's own
  // position under a RopeFold (this block appended it: shared memory) comes after.
  const int64_t nc = own ? n - 1 : n;
  for (int64_t ib = 0; ib < nc; ib += kFusedUnroll * slots) {  // block-uniform bounds: every lane shuffles
    int4 k16[kFusedUnroll];
#pragma unroll
    for (int u = 0; u < kFusedUnroll; ++u) {  // the loads first: kFusedUnroll rows in flight per lane
      const int64_t i = ib + u * slots + slot;
      k16[u] = make_int4(0, 0, 0, 0);
      if (vec && i < nc && sub * 16 < D) k16[u] = load16(kb + i * rs + sub * 16);
    }
#pragma unroll
    for (int u = 0; u < kFusedUnroll; ++u) {
      const int64_t i = ib + u * slots + slot;
      const bool ok = i < nc;
      const int8_t* kr = kb + (ok ? i : 0) * rs;  // the scalar path's row
      for (int g = 0; g < grp; ++g) {
        int32_t raw = 0;
        if (vec) {
          if (ok && sub * 16 < D) {
            const int16_t* qp = qq + g * D + sub * 16;
            raw = dot16(load16_shared(qp), load16_shared(qp + 8), k16[u]);
          }
        } else if (ok) {
          for (int d = sub; d < D; d += 32) raw += (int32_t)qq[g * D + d] * (int32_t)kr[d];
        }
        raw = group_sum32(raw, L);  // |q . k| <= 2^15 * 127 * 256 < 2^31
        if (ok && sub == 0) sc[g * n + i] = raw;
      }
    }
  }
  if (own && warp == 0) {  // the own position by warp 0 (every group of L lanes computes it)
    for (int g = 0; g < grp; ++g) {
      int32_t raw = 0;
      if (vec) {
        if (sub * 16 < D) {
          const int16_t* qp = qq + g * D + sub * 16;
          raw = dot16(load16_shared(qp), load16_shared(qp + 8), load16_shared(k8 + sub * 16));
        }
      } else {
        for (int d = sub; d < D; d += 32) raw += (int32_t)qq[g * D + d] * (int32_t)k8[d];
      }
      raw = group_sum32(raw, L);
      if (lane == 0) sc[g * n + n - 1] = raw;
    }
  }
  __syncthreads();

  // 2. The scores (a thread per position: attn_score is most of a score's
  // instructions, and one lane in L would run it in the loop above), then the
  // softmax and the value weights, every head in each pass.
  for (int g = 0; g < grp; ++g) {  // z, zmax
    int64_t m = kI64Min;
    for (int64_t i = tid; i < n; i += kFusedThreads) {
      const int32_t ka = own && i == n - 1 ? k8a : kab[i * nkv];
      int64_t z = attn_score(sc[g * n + i], ka, eq[g], score_mant, score_shift);  // sat32
      if (cap.cap) z = softcap(z, cap);  // Gemma 2
      sc[g * n + i] = (int32_t)z;
      m = imax(m, z);
    }
    m = warp_max(m);
    if (lane == 0) pmax[g][warp] = m;
  }
  __syncthreads();
  for (int g = 0; g < grp; ++g) {  // e = exp2(-(zmax - z)), tot
    int64_t zmax = kI64Min;
#pragma unroll
    for (int w = 0; w < kFusedWarps; ++w) zmax = imax(zmax, pmax[g][w]);
    int64_t tot = 0;
    for (int64_t i = tid; i < n; i += kFusedThreads) {
      const int64_t ev = exp2_neg_q30(zmax - sc[g * n + i]);  // <= 2^30
      sc[g * n + i] = (int32_t)ev;
      tot += ev;
    }
    tot = warp_sum(tot);
    if (lane == 0) psum[g][warp] = tot;
  }
  __syncthreads();
  if (tid < grp) {  // R = 2^62 / tot per head (tot >= 2^30 - 4: the max term)
    int64_t tot = 0;
#pragma unroll
    for (int w = 0; w < kFusedWarps; ++w) tot += psum[tid][w];
    hR[tid] = floor_div((int64_t)1 << 62, tot);
  }
  __syncthreads();
  for (int g = 0; g < grp; ++g) {  // p, wmax (pmax's zmax reads all came before the last barrier)
    const int64_t R = hR[g];
    int64_t wmax = 0;
    for (int64_t i = tid; i < n; i += kFusedThreads) {
      const int64_t p = round_shift((int64_t)sc[g * n + i] * R, 62 - kProbFrac);  // <= 2^16
      sc[g * n + i] = (int32_t)p;
      wmax = imax(wmax, p * (own && i == n - 1 ? v8a : vab[i * nkv]));  // < 2^47
    }
    wmax = warp_max(wmax);
    if (lane == 0) pmax[g][warp] = wmax;
  }
  __syncthreads();
  for (int g = 0; g < grp; ++g) {  // s, w16
    int64_t wmax = 0;
#pragma unroll
    for (int w = 0; w < kFusedWarps; ++w) wmax = imax(wmax, pmax[g][w]);
    const int s = (int)imax(bitlen(wmax) - 15, 0);
    for (int64_t i = tid; i < n; i += kFusedThreads) {
      const int64_t va = own && i == n - 1 ? v8a : vab[i * nkv];
      sc[g * n + i] = (int32_t)clamp(round_shift((int64_t)sc[g * n + i] * va, s), -kInt16QMax, kInt16QMax);
    }
    if (tid == 0) hs[g] = s;
  }
  __syncthreads();

  // 3. P.V, heads g0 and g0 + 1 together (one V load for both).
  const int HD = nh * D;
  int64_t omax = 0;
  for (int g0 = 0; g0 < grp; g0 += 2) {
    const bool two = g0 + 1 < grp;  // block-uniform
    const int32_t* w0 = sc + g0 * n;
    const int32_t* w1 = sc + (two ? g0 + 1 : g0) * n;
    int32_t a0[16], a1[16];  // vec: dims 16 sub + j; scalar: dims sub + 32 j (j < 8)
#pragma unroll
    for (int j = 0; j < 16; ++j) a0[j] = 0, a1[j] = 0;
    for (int64_t ib = slot; ib < nc; ib += kFusedUnroll * slots) {
      if (vec) {
        if (sub * 16 < D) {
          int4 v[kFusedUnroll];
#pragma unroll
          for (int u = 0; u < kFusedUnroll; ++u) {  // the loads first: kFusedUnroll rows in flight per lane
            const int64_t i = ib + u * slots;
            v[u] = make_int4(0, 0, 0, 0);
            if (i < nc) v[u] = load16(vb + i * rs + sub * 16);
          }
#pragma unroll
          for (int u = 0; u < kFusedUnroll; u += 2) {  // positions a = ib + u slots and b = a + slots
            const int64_t ia = ib + u * slots, ibb = ia + slots;
            // The pair's int16 weights in one word per head (a low, b high; 0 past n).
            const int w0p =
                (int)__byte_perm((unsigned)(ia < nc ? w0[ia] : 0), (unsigned)(ibb < nc ? w0[ibb] : 0), 0x5410);
            const int w1p =
                two ? (int)__byte_perm((unsigned)(ia < nc ? w1[ia] : 0), (unsigned)(ibb < nc ? w1[ibb] : 0), 0x5410) : 0;
            const unsigned va[4] = {(unsigned)v[u].x, (unsigned)v[u].y, (unsigned)v[u].z, (unsigned)v[u].w};
            const unsigned vbw[4] = {(unsigned)v[u + 1].x, (unsigned)v[u + 1].y, (unsigned)v[u + 1].z,
                                     (unsigned)v[u + 1].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              // Bytes (a d, b d, a d+1, b d+1) for dims d = 4k, 4k + 2: __dp2a_lo / hi
              // take w_a v_a[d] + w_b v_b[d] for the low / high byte pair.
              const int lo = (int)__byte_perm(va[k], vbw[k], 0x5140), hi = (int)__byte_perm(va[k], vbw[k], 0x7362);
              a0[4 * k] = __dp2a_lo(w0p, lo, a0[4 * k]), a0[4 * k + 1] = __dp2a_hi(w0p, lo, a0[4 * k + 1]);
              a0[4 * k + 2] = __dp2a_lo(w0p, hi, a0[4 * k + 2]), a0[4 * k + 3] = __dp2a_hi(w0p, hi, a0[4 * k + 3]);
              a1[4 * k] = __dp2a_lo(w1p, lo, a1[4 * k]), a1[4 * k + 1] = __dp2a_hi(w1p, lo, a1[4 * k + 1]);
              a1[4 * k + 2] = __dp2a_lo(w1p, hi, a1[4 * k + 2]), a1[4 * k + 3] = __dp2a_hi(w1p, hi, a1[4 * k + 3]);
            }
          }
        }
      } else {
        for (int64_t i = ib; i < nc && i < ib + kFusedUnroll * slots; i += slots) {
          const int32_t x0 = w0[i], x1 = two ? w1[i] : 0;
          const int8_t* vr = vb + i * rs;
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (sub + 32 * j < D) {
              const int32_t b = vr[sub + 32 * j];
              a0[j] += x0 * b, a1[j] += x1 * b;
            }
        }
      }
    }
    if (own && slot == 0) {  // the own position (shared memory) into slot 0's sums: one product more
      const int32_t x0 = w0[n - 1], x1 = two ? w1[n - 1] : 0;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int d = vec ? sub * 16 + j : sub + 32 * j;
        if ((vec || j < 8) && d < D) a0[j] += x0 * (int32_t)v8[d], a1[j] += x1 * (int32_t)v8[d];
      }
    }
    // The warp's slots (lanes of the same sub) added: int32, at most 289 products.
    for (int o = L; o < 32; o <<= 1)
#pragma unroll
      for (int j = 0; j < 16; ++j) a0[j] += __shfl_xor_sync(kFull, a0[j], o), a1[j] += __shfl_xor_sync(kFull, a1[j], o);
    int32_t* p0 = pv + warp * 2 * kMaxHeadDim;
    int32_t* p1 = p0 + kMaxHeadDim;
    if (lane < L) {
      if (vec) {
        if (sub * 16 < D)
#pragma unroll
          for (int j = 0; j < 16; ++j) p0[sub * 16 + j] = a0[j], p1[sub * 16 + j] = a1[j];
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (sub + 32 * j < D) p0[sub + 32 * j] = a0[j], p1[sub + 32 * j] = a1[j];
      }
    }
    __syncthreads();
    for (int d = tid; d < (two ? 2 * D : D); d += kFusedThreads) {
      const int hh = d >= D ? 1 : 0, dd = d - hh * D;
      int64_t sum = 0;
#pragma unroll
      for (int w = 0; w < kFusedWarps; ++w) sum += pv[(w * 2 + hh) * kMaxHeadDim + dd];
      const int64_t o = shl(sum, hs[g0 + hh]);
      out[t * HD + (int64_t)(h0 + g0 + hh) * D + dd] = o;
      omax = imax(omax, iabs(o));
    }
    __syncthreads();  // before the next pair rewrites pv
  }

  // 4. quant16 of the row: its max |out| over the kv heads' blocks, then the last block.
  grid_dep_launch();  // the o-projection may start its weight loads (it waits for this grid to finish)
  omax = block_max(omax, 0, red);
  if (tid == 0) atomicMax(rmax + tl, (unsigned long long)omax);
  if (!last_block_arrives(cnt + tl, nkv, &flag)) return;
  if (tid == 0) rowmax = atomicExch(rmax + tl, 0ull);  // the row's max; the slot back to zero
  __syncthreads();
  const int e = (int)imax(bitlen((int64_t)rowmax) - 15, 0);
  for (int i = tid; i < HD; i += kFusedThreads)
    act[t * HD + i] = (int16_t)clamp(round_shift(load_cg(out + t * HD + i), e), -kInt16QMax, kInt16QMax);
  if (tid == 0) act_e[t] = e;
}

}  // namespace

int64_t attn_fused_max_pos(int grp) { return grp < 1 ? 0 : std::min<int64_t>(kFusedMaxPos, kFusedScoreInts / grp); }

void launch_attention_fused(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer,
                            const int32_t* seq, const int32_t* pos, const DevKV* kvs, int64_t score_mant,
                            int64_t score_shift, const AttnScratch& sc, int64_t npos, int64_t* out, int16_t* act,
                            int32_t* act_e, cudaStream_t st, int64_t window, const RopeFold& rope, const Softcap& cap) {
  const int grp = nh / nkv;  // host-side division (launch_attention checked the shape)
  if (grp > kFusedMaxGroup || npos < 1 || npos > attn_fused_max_pos(grp) || nrows > sc.rows)
    throw std::invalid_argument("attention: more positions than the one-kernel path holds");
  launch_at(attn_fused_kernel, shape_attn_fused(nkv, nrows, grp, npos), pdl_enabled(), st, q, row0, nh, nkv, grp, D,
            layer, seq, pos, kvs, score_mant, score_shift, window, sc.oacc, sc.counters + (int64_t)nrows * nkv, out,
            act, act_e, rope, cap);
  check_launch("attention (one kernel)");
}

}  // namespace cuda
}  // namespace intdet
