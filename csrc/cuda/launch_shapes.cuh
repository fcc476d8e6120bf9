// Every CUDA kernel's launch shape in one place: its block size (the
// kernels' __launch_bounds__ and per-warp layouts use the same constants),
// its grid for the launch's sizes, and its dynamic shared memory. The
// launchers in kernels_*.cu take their shape from here (INTDET_LAUNCH_AT),
// so a retuning is one edit, and docs/cuda.md's per-kernel table reads off
// one file. Shapes only change how work is split, never a bit (each kernel
// file says why). Included by kernels_shared.cuh.
#pragma once

#include "kernels.cuh"  // dim3, cudaStream_t (or the emulator's)

#include <algorithm>
#include <cstddef>
#include <cstdint>

// A launch at shape s (a LaunchShape) on stream st.
#define INTDET_LAUNCH_AT(kernel, s, st, ...) INTDET_LAUNCH(kernel, (s).grid, (s).block, (s).smem, st, __VA_ARGS__)

namespace intdet {
namespace cuda {
namespace {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem;  // dynamic shared memory, bytes
};

// A launch of kernel at shape s on stream st; pdl: with programmatic
// dependent launch (sm_90+: the kernel may start while the previous launch
// finishes, so it must call grid_dep_wait, kernels_shared.cuh, before it
// reads or writes anything an earlier launch touches). Stream capture
// records it as a programmatic graph edge. The emulator runs launches one
// after another either way.
template <class... P, class... A>
void launch_at(void (*kernel)(P...), const LaunchShape& s, bool pdl, cudaStream_t st, A... args) {
#if defined(INTDET_CUDA_EMU)
  (void)pdl;
  ::emu::launch(st, s.grid, s.block, s.smem, [=] { kernel(args...); });
#else
  if (!pdl) {
    kernel<<<s.grid, s.block, s.smem, st>>>(args...);
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = s.grid;
  cfg.blockDim = s.block;
  cfg.dynamicSmemBytes = s.smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, args...);  // an error stays for check_launch (cudaGetLastError)
#endif
}

// ---- block sizes (threads)
constexpr int kElemThreads = 256;  // elementwise kernels and the embedding: grid-stride loops
constexpr int kNormThreads = 256;  // one block per row: norms, quant16, post-norm add
constexpr int kHeadThreads = 128;  // one block per (row, head): q/k norm + RoPE, KV append
constexpr int kGemvWarps = 4;  // int4 decode GEMV and the MoE expert GEMV: one channel per warp
constexpr int kGemvThreads = kGemvWarps * 32;
// int8 decode GEMV: 8 warps per block (1, 2 or 4 per channel), so that the
// prologue every block runs (GemvIn) is split over 256 threads and repeated
// by half as many blocks as with 4 warps.
constexpr int kGemv8Warps = 8;
constexpr int kGemv8Threads = kGemv8Warps * 32;
constexpr int kMmaThreads = 128;  // tensor-core GEMM: 4 warps of 32 x 32
constexpr int kMmaM = 64, kMmaN = 64;  // its block tile (rows x channels)
// Skinny tensor-core GEMM (every linear of more than kGemvDecodeRows rows:
// decode batches and prefill): 4 warps, each 16 channels of the block's 64
// times all its 16 MT rows (MT = 1, 2 or 4 m16 tiles: 16, 32 or 64 rows), K
// tiles of 64 through a kSkStages-stage cp.async pipeline.
constexpr int kSkThreads = 128;
constexpr int kSkN = 64, kSkK = 64;
// Stages of its cp.async pipeline: 3 x 15 KiB of static shared memory at
// 64 rows (the 48 KiB static limit holds no fourth).
constexpr int kSkStages = 3;
// Split-K: about kSkTargetBlocks blocks per launch (two per SM of an H100's
// 132) where the row and channel tiles are fewer, each split at least
// kSkMinKTiles K tiles (256 inputs: the pipeline reaches its steady state
// and the int64 partial adds stay a small share), at most kSkMaxSplits.
constexpr int kSkTargetBlocks = 264, kSkMinKTiles = 4, kSkMaxSplits = 16;
constexpr int kTileThreads = 256;  // __dp2a GEMM (int8 and int4): 16 x 16 threads of 4 x 4
constexpr int kTileM = 64, kTileN = 64;  // its block tile
constexpr int kAttnThreads = 128;  // attention: split scores, split P.V, tensor-core tiles
constexpr int kAttnFlashThreads = 256;  // prefill attention, FA2 shape: 8 warps of 16 tile rows
constexpr int kAttnFusedThreads = 256;  // decode attention in one kernel: 8 warps over the row's positions
constexpr int kRouteThreads = 64;  // MoE router top-k: one thread per row
constexpr int kArgmaxThreads = 256, kArgmaxBlocks = 64;  // argmax: blocks over a stride of the row
constexpr int kSampleThreads = 1024;  // the sampler: one block

// Blocks for a grid-stride loop over count elements (at most 65535).
inline unsigned grid_1d(int64_t count, int threads) {
  int64_t b = (count + threads - 1) / threads;
  if (b > 65535) b = 65535;  // grid-stride loops cover the rest
  return (unsigned)(b < 1 ? 1 : b);
}

// ---- kernels_elementwise.cu
inline LaunchShape shape_elementwise(int64_t count) { return {grid_1d(count, kElemThreads), kElemThreads, 0}; }
inline LaunchShape shape_embed(int T) { return {(unsigned)T, kElemThreads, 0}; }  // one block per row

// ---- kernels_norm_rope.cu
// One block per row; smem: the row held in shared memory (norm_quant16 and
// post_norm_add: n int32), else 0.
inline LaunchShape shape_row(int R, size_t smem = 0) { return {(unsigned)R, kNormThreads, smem}; }
// One block per (row, head): heads = nheads (norm_rope), nh + 2 nkv (rope_append), nkv (kv_append).
inline LaunchShape shape_heads(int T, int heads) { return {dim3((unsigned)T, (unsigned)heads), kHeadThreads, 0}; }

// ---- kernels_linear.cu
// Decode GEMV: gx blocks of kGemv8Warps warps over the channels (launch_gemv
// splits them between segments), gy groups of 8 rows (T > 4); smem: the
// prologue's rows (gemv_prologue_smem), else 0.
inline LaunchShape shape_gemv(int64_t gx, unsigned gy, size_t smem) {
  return {dim3((unsigned)gx, gy), kGemv8Threads, smem};
}
// The GEMV prologue's dynamic shared memory (GemvIn): 16 bytes of row
// exponents (rows <= 4), the block's int16 input rows [rows, K] (rounded up
// to 16 bytes), then K int32 for the norm's row.
constexpr size_t kGemvPrologueSmem = 46 * 1024;  // under the 48 KB default, with the static arrays
__host__ __device__ inline size_t gemv_prologue_act_bytes(int rows, int K) { return ((size_t)rows * K * 2 + 15) / 16 * 16; }
inline size_t gemv_prologue_smem(bool norm, int rows, int K) {
  return 16 + gemv_prologue_act_bytes(rows, K) + (norm ? (size_t)K * 4 : 0);
}
// int4 decode GEMV: one channel per warp.
inline LaunchShape shape_gemv_w4(int N, unsigned gy) {
  return {dim3((unsigned)((N + kGemvWarps - 1) / kGemvWarps), gy), kGemvThreads, 0};
}
// Prefill GEMMs: one block per (kMmaN / kTileN channels, kMmaM / kTileM rows) tile.
inline unsigned gemm_mma_rows(int T) { return (unsigned)((T + kMmaM - 1) / kMmaM); }
inline LaunchShape shape_gemm_mma(int N, int T) {
  return {dim3((unsigned)((N + kMmaN - 1) / kMmaN), gemm_mma_rows(T)), kMmaThreads, 0};
}
inline unsigned gemm_tile_rows(int T) { return (unsigned)((T + kTileM - 1) / kTileM); }
inline LaunchShape shape_gemm_tile(int N, int T) {
  return {dim3((unsigned)((N + kTileN - 1) / kTileN), gemm_tile_rows(T)), kTileThreads, 0};
}

// Skinny GEMM: m16 tiles per warp for T rows (1, 2, 4), its grid (row
// tiles fastest, so the row tiles that share a weight slice run together
// and DRAM streams each weight once; channel tiles; splits).
inline int skinny_mt(int T) { return T <= 16 ? 1 : T <= 32 ? 2 : 4; }
inline unsigned skinny_row_tiles(int T) { return (unsigned)((T + 16 * skinny_mt(T) - 1) / (16 * skinny_mt(T))); }
inline unsigned skinny_col_tiles(int N) { return (unsigned)((N + kSkN - 1) / kSkN); }
inline LaunchShape shape_skinny(int T, int N, int splits) {
  return {dim3(skinny_row_tiles(T), skinny_col_tiles(N), (unsigned)splits), kSkThreads, 0};
}
// Splits of K (in K tiles of kSkK) for `tiles` row x channel tiles.
inline int skinny_splits(int64_t tiles, int64_t ktiles) {
  int64_t s = (kSkTargetBlocks + tiles - 1) / tiles;
  s = std::min<int64_t>({s, ktiles / kSkMinKTiles, kSkMaxSplits});
  return (int)std::max<int64_t>(s, 1);
}

// ---- kernels_attention.cu
// Split path: one block per (chunk of positions, kv head, row), for both the
// scores and the P.V kernel.
inline LaunchShape shape_attn_split(int64_t nsplit, int nkv, int nrows) {
  return {dim3((unsigned)nsplit, (unsigned)nkv, (unsigned)nrows), kAttnThreads, 0};
}
// Tensor-core path: one block per (tile of rows, kv head).
inline LaunchShape shape_attn_mma(unsigned tiles, int nkv) { return {dim3(tiles, (unsigned)nkv), kAttnThreads, 0}; }

// ---- kernels_attention_flash.cu
// One block per (tile of 128 tile rows, kv head); smem: attn_flash_smem(D)
// (queries, two K and two V tiles, V^T), above 48 KiB (opt-in).
inline LaunchShape shape_attn_flash(unsigned tiles, int nkv, size_t smem) {
  return {dim3(tiles, (unsigned)nkv), kAttnFlashThreads, smem};
}

// ---- kernels_attention_decode.cu
// One kernel: one block per (kv head, row); smem: the group's grp x npos
// int32 scores (npos: the call's most positions per row).
inline LaunchShape shape_attn_fused(int nkv, int nrows, int grp, int64_t npos) {
  return {dim3((unsigned)nkv, (unsigned)nrows), kAttnFusedThreads, (size_t)(grp * npos) * sizeof(int32_t)};
}

// ---- kernels_moe.cu
inline LaunchShape shape_moe_route(int T) { return {grid_1d(T, kRouteThreads), kRouteThreads, 0}; }
// One warp per expert channel, one grid row per gathered row (at most 65535 a launch).
inline LaunchShape shape_moe_linear(int N, int rows) {
  return {dim3((unsigned)((N + kGemvWarps - 1) / kGemvWarps), (unsigned)rows), kGemvThreads, 0};
}
inline LaunchShape shape_moe_combine(int T) { return {dim3((unsigned)(T < 65535 ? T : 65535)), kElemThreads, 0}; }

// ---- kernels_sample.cu
inline LaunchShape shape_argmax(int V) {
  const int64_t b = ((int64_t)V + kArgmaxThreads - 1) / kArgmaxThreads;
  return {(unsigned)(b < kArgmaxBlocks ? b : kArgmaxBlocks), kArgmaxThreads, 0};
}
inline LaunchShape shape_sample() { return {1, kSampleThreads, 0}; }

}  // namespace
}  // namespace cuda
}  // namespace intdet
