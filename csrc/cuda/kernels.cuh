// Launchers of the CUDA kernels (csrc/cuda/kernels_*.cu). Host-side header:
// plain C++ plus cuda_runtime.h, included by the engine (engine_*.cpp) and the tests' op
// bindings. Every kernel computes exactly what the scalar C++ reference
// (csrc/cpu/ops_generic.cpp, csrc/model/forward.cpp) computes, bit for bit;
// docs/cuda.md explains why each parallel decomposition keeps that.
#pragma once

#if defined(INTDET_CUDA_EMU)
#include "emu.h"  // host emulation for tests without a GPU
#else
#include <cuda_runtime.h>
#define INTDET_DYN_SMEM(T, name) extern __shared__ T name[]
#define INTDET_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#endif

#include <cstdint>

#include "intdet/intmath.h"  // Softcap

namespace intdet {
namespace cuda {

// One sequence's int8 KV cache on the device, position-major (the CPU's
// intdet::KVCache is head-major per layer; the bits do not depend on it):
// k, v [L, max_len, n_kv, D] int8; ka, va [L, max_len, n_kv] int32 absmax.
struct DevKV {
  int8_t* k;
  int8_t* v;
  int32_t* ka;
  int32_t* va;
  int64_t max_len;
};

// Linear kernel choice: auto (GEMV for T <= kGemvMaxRows, else tiled GEMM),
// or forced (tests compare both against the CPU).
// kLinearGemm is the tensor-core (IMMA) GEMM; kLinearGemmDp2a the older
// __dp2a tiled GEMM, kept for comparison (int8 weights only).
// kLinearSkinny is the skinny tensor-core GEMM (weights streamed through a
// three-stage cp.async pipeline, split-K where the tiles are few, q+k+v and
// gate+up+GLU as one launch each).
// Auto: the GEMV up to kGemvDecodeRows rows (it re-streams the weights for
// every 8 rows and issues T / 2 __dp2a per weight byte: beyond 8 rows the
// tensor cores win), then the skinny GEMM, for decode batches and prefill
// alike (kLinearGemm, whose tiles stage through plain loads, stays for the
// tests and A/B timing). kGemvMaxRows: the most rows the GEMV takes (forced).
enum LinearPath { kLinearAuto = 0, kLinearGemv = 1, kLinearGemm = 2, kLinearGemmDp2a = 3, kLinearSkinny = 4 };
constexpr int kGemvMaxRows = 32;
constexpr int kGemvDecodeRows = 8;
constexpr int kSkinnyMaxRows = 256;
// Decode steps of up to this many rows (one per sequence) run from CUDA
// graphs, with the decode attention (RopeFold).
constexpr int kDecodeGraphRows = kSkinnyMaxRows;
// The skinny GEMM's split-K scratch: int64 partial sums of up to
// kSkinnyPartTiles tiles of 64 x 64 and an arrival counter per tile, zero
// between launches (each launch's last block per tile reads and zeroes them,
// so graph replays need no reset). Without it (null, or more tiles) the
// GEMM runs unsplit: the same bits.
constexpr int kSkinnyPartTiles = 256;
constexpr int64_t kSkinnyPartElems = (int64_t)kSkinnyPartTiles * 64 * 64;
struct GemmScratch {
  unsigned long long* part;  // [kSkinnyPartElems]
  int* counters;  // [kSkinnyPartTiles]
};
// Force the skinny GEMM's K splits (tests; <= 0: skinny_splits' choice).
void set_skinny_split_override(int splits);
// The GEMM of linears of more than kSkinnyMaxRows rows (prefill):
// kLinearSkinny (the default: its pipeline, q+k+v and gate+up+GLU fused)
// or kLinearGemm (the earlier prefill GEMM, unfused); anything else: the
// default. The device check's A/B timing and tests; the bits never change.
void set_prefill_gemm_override(int path);
int prefill_gemm();

// x [T, H] int32 Q R (the residual) = embedding rows of tokens [T] times their dyadic scale.
void launch_embed(const int32_t* tokens, const int8_t* emb, const int32_t* mant, const int32_t* shift, int T, int H,
                  int32_t* x, cudaStream_t st);

// For each output row r (source row idx ? idx[r] : r of x [*, n] int32):
// y = rms_norm_row(x) (norm units), then (q [R, n] int16, e [R]) = quant16(y);
// y itself also goes to normed [R, n] int32 when not null (the trace).
// in_frac: x's fixed point (the residual's Q R).
void launch_norm_quant16(const int32_t* x, const int32_t* idx, const int16_t* g, int R, int n, int64_t eps_q60,
                         int in_frac, int16_t* q, int32_t* e, cudaStream_t st, int32_t* normed = nullptr);

// Gemma's post-norm, per row r of y [R, n] int32 Q16 (a branch output):
// x[r] = sat32(x[r] + shift_round_sat32(rms_norm_row(y[r], g), shift)) (x: the residual, Q R).
void launch_post_norm_add(const int32_t* y, const int16_t* g, int R, int n, int64_t eps_q60, int32_t shift, int32_t* x,
                          cudaStream_t st);

// (q [R, n] int16, e [R]) = quant16 of each row of x [R, n] int64.
void launch_quant16_i64(const int64_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st);
void launch_quant16_i32(const int32_t* x, int R, int n, int16_t* q, int32_t* e, cudaStream_t st);
// RMSNorm of R int32 Q16 rows of n (<= 8192) in place (gamma g, eps_q60 = round(n eps 2^60)).
void launch_norm_rows(int32_t* x, const int16_t* g, int R, int n, int64_t eps_q60, cudaStream_t st);

// out[t * ldo + j] (int32) = linear_epilogue(sum_k q[t,k] w[j,k], mant[j], shift[j], e[t], bias, j),
// or sat32(out + that) when residual != 0. q [T, K] int16, w [N, K] int8.
void launch_linear(const int16_t* q, const int32_t* e, int T, int K, const int8_t* w, const int32_t* mant,
                   const int32_t* shift, const int32_t* bias, int N, int32_t* out, int64_t ldo, bool residual,
                   int path, cudaStream_t st, const GemmScratch* sc = nullptr);

// log2 of the warps per output channel the GEMV uses for these sizes (0..2;
// K % 16 == 0); the sum, and so every bit, is the same for any split.
int gemv_split_log2(int K, int N);
// Force the GEMV's split (-1: gemv_split_log2's choice); tests only.
void set_gemv_split_override(int wlg);

// One GEMV launch (T <= kGemvMaxRows rows; int8 weights [N, K]) for up to
// three linear layers on the same input q [T, K] (segments: q, k and v), or
// in GLU mode (glu = 1 SwiGLU, 2 GeGLU; segments gate and up of the same N)
// gate and up together with glu_out[t * glu_ldo + j] = swiglu / geglu of the
// pair (Q32 int64), gate and up also stored. Each segment's out is what
// launch_linear would store; blocks is set by the launcher.
struct GemvSeg {
  const int8_t* w;
  const int32_t* mant;
  const int32_t* shift;
  const int32_t* bias;
  int32_t* out;
  int64_t ldo;
  int N;
  int blocks;
};
struct GemvSegs {
  GemvSeg s[3];
  int n;
  int glu;
  int64_t* glu_out;
  int64_t glu_ldo;
};
// The GEMV's input. kind kGemvQ: q [T, K] int16 and e [T] given (global
// memory). For T <= kPrologueRows the input can instead be computed by every
// block in its prologue, from rows of K values the previous launch wrote
// (small and L2-resident), into shared memory: kGemvNorm, RMSNorm (gamma g,
// eps_q60, in_frac: the rows' fixed point) then quant16 of x [*, K] int32
// rows (launch_norm_quant16's steps); kGemvQuant, quant16 of a [*, K] int64
// rows (launch_quant16_i64's steps). Every block computes the same integer
// function of the same rows, so all blocks hold the same q and e, those
// the separate launch would store.
enum GemvInKind { kGemvQ = 0, kGemvNorm = 1, kGemvQuant = 2 };
constexpr int kPrologueRows = 2;
struct GemvIn {
  int kind;
  const int32_t* x;
  const int16_t* g;
  int64_t eps_q60;
  int in_frac;
  const int64_t* a;
};
// Whether launch_gemv can run that prologue for T rows of K (its shared
// memory: T K int16, plus K int32 for the norm); else the caller runs the
// separate norm or quant16 launch first and passes kGemvQ.
bool gemv_prologue_fits(int kind, int T, int K);
// Decode GEMVs are launched with programmatic dependent launch where the
// device has it (compute capability 9.0+; on: the engine, per device): each
// block issues its first weight loads before it waits for the previous
// launch (griddepcontrol.wait), and lets the next launch start after its
// main loop. Graph-capturable; a no-op in the emulator.
void set_gemv_pdl(bool on);
// Whether set_gemv_pdl is on: the decode attention (attn_fused_kernel) is
// launched the same way, so a decode layer's five launches are all PDL.
bool pdl_enabled();
void launch_gemv(const int16_t* q, const int32_t* e, int T, int K, GemvSegs segs, bool residual, cudaStream_t st,
                 const GemvIn& in = GemvIn{});

// The skinny tensor-core GEMM (any T > 0 rows) for up to three
// linear layers on the same input q [T, K] in one launch (segments: q, k,
// v; no GLU mode): each segment's out as launch_linear stores it. sc: the
// split-K scratch (null: unsplit).
void launch_skinny(const int16_t* q, const int32_t* e, int T, int K, GemvSegs segs, bool residual, cudaStream_t st,
                   const GemmScratch* sc);

// Kernel launches enqueued so far in this process (the launch-count test).
int64_t launch_count();

// The same with int4 weights (docs/format.md): codes w4 [N, K/2] uint8, group
// step gd and offset gm [N, K/32] int16, w = gd * u + gm; K % 32 == 0.
void launch_linear_w4(const int16_t* q, const int32_t* e, int T, int K, const uint8_t* w4, const int16_t* gd,
                      const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int N,
                      int32_t* out, int64_t ldo, bool residual, int path, cudaStream_t st);

// In place on x [T, nheads, D] int32: per-head RMSNorm with gamma g (when g is
// not null; Qwen3 q/k norm), then split-half RoPE at position pos[t].
void launch_norm_rope(int32_t* x, int T, int nheads, int D, const int16_t* g, int64_t eps_q60, const int32_t* pos,
                      const int16_t* cos, const int16_t* sin, cudaStream_t st);

// launch_norm_rope on q (q_norm) and k (k_norm) and launch_kv_append in one
// launch: q [T, nh, D] and k [T, nkv, D] rotated in place, k and v [T, nkv, D]
// quantized into cache kvs[seq[t]] at (layer, pos[t]).
void launch_rope_append(int32_t* q, int32_t* k, const int32_t* v, int T, int nh, int nkv, int D,
                        const int16_t* q_norm, const int16_t* k_norm, int64_t eps_q60, const int32_t* pos,
                        const int16_t* cos, const int16_t* sin, int layer, const int32_t* seq, const DevKV* kvs,
                        cudaStream_t st);

// Quantize K and V rows (k, v [T, nkv, D] int32) to int8 absmax and store
// them at (layer, pos[t]) of cache kvs[seq[t]].
void launch_kv_append(const int32_t* k, const int32_t* v, int T, int nkv, int D, int layer, const int32_t* seq,
                      const int32_t* pos, const DevKV* kvs, cudaStream_t st);

// Per-launch work buffers of the attention (launch_attention). counters and
// oacc must be zero before the first launch; every launch leaves them zero.
struct AttnScratch {
  int32_t* scores;  // [rows * nh, sstride]: score, exp2, p, then the int16 value weight
  int64_t sstride;  // >= the longest row's positions (pos + 1)
  int64_t* zpart;  // [rows * nh, max_splits]: each chunk's score max
  int32_t* shifts;  // [rows * nh]: the value weights' quant16 shift s
  int* counters;  // [rows * (nkv + 1)]: blocks arrived, per (row, kv head) then per row
  unsigned long long* oacc;  // [rows * nh * D]: P.V sums (int64 two's complement)
  int64_t rows;  // row capacity of the buffers
  int64_t max_splits;  // zpart's columns; nsplit = ceil(sstride / chunk) must fit
  int64_t npos = 0;  // >= every row's positions (pos + 1) in this call, <= sstride; 0: sstride
};

// Chunk of positions per block that launch_attention picks (32..512).
int attn_chunk(int64_t sstride, int nkv, int nrows);

// Attention of rows row0..row0+nrows-1 (queries q [T, nh, D] int32 after
// RoPE) over their sequence's cache positions 0..pos[t] (window > 0: only
// the last `window` of them): out [T, nh, D] int64 (attn_out), and its
// quant16 per row into act [T, nh * D] int16, act_e [T]. Split over
// positions in chunks (chunk 0: attn_chunk's choice); the bits never depend
// on the split. nrows <= sc.rows.
//
// path: kAttnSplit, the flash-decoding split above (2 launches: scores with
// the softmax by each (row, kv head)'s last block, then P.V with the
// quant16 by each row's last block); kAttnMma, tiles of up to 16 query rows
// (consecutive rows times the query heads of one KV head, as the CPU's
// attention tiles) with QK^T and P.V on the tensor cores (mma.m16n8k32,
// int16 split into s8 hi and u8 lo bytes; 2 launches: the tiles, then
// quant16 of the rows); kAttnFused, one launch of one block per (row, kv
// head) over all the row's positions, the scores and the softmax in shared
// memory, the row's quant16 by its last block (at most attn_fused_max_pos
// positions); kAttnFlash, prefill in the FlashAttention-2 shape: tiles of
// 128 tile rows (8 warps of 16), K and V tiles double-buffered through
// cp.async, QK^T recomputed on the tensor cores in each of the softmax's
// four passes instead of a score scratch, causal tile skipping (2 launches:
// the tiles, then quant16 of the rows; kernels_attention_flash.cu);
// kAttnAuto: attn_path_for's choice. Every path gives the same bits.
enum AttnPath { kAttnAuto = 0, kAttnSplit = 1, kAttnMma = 2, kAttnFused = 3, kAttnFlash = 4 };
// Dynamic shared memory of kAttnFlash's block for head size D (bytes), and
// whether the device grants that much (its opt-in limit per block).
size_t attn_flash_smem(int D);
bool attn_flash_fits(int D);
// kAttnFlash's tiles (launch_attention calls it, then quant16 of the rows).
void launch_attention_flash(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer,
                            const int32_t* seq, const int32_t* pos, const DevKV* kvs, int64_t score_mant,
                            int64_t score_shift, int64_t* out, cudaStream_t st, int64_t window, const Softcap& cap);
// The most positions per row kAttnFused takes for grp query heads per kv
// head (their scores in shared memory): 2048, fewer for grp > 3.
int64_t attn_fused_max_pos(int grp);
// The path of one attention call: path (kAttnAuto, or a forced one: tests)
// resolved for nrows rows of at most npos positions (the window
// applied) with grp query heads per kv head; rope: a RopeFold is on.
// kAttnAuto (and set_attn_path_override's path where it applies): for more
// than kGemvMaxRows rows without a RopeFold (prefill) kAttnFlash where the
// device's shared memory holds its tiles for head size D, else kAttnMma;
// other calls kAttnFused where npos <= attn_fused_max_pos(grp), else
// kAttnSplit. Throws std::invalid_argument for a forced path that cannot
// serve the call.
int attn_path_for(int path, int nrows, int grp, int64_t npos, bool rope, int D);
// rope_append folded into the split path's scores kernel or kAttnFused's
// prologue (on: launch_rope_append is not called): every block runs q norm +
// RoPE of its group's heads from q (left unrotated in memory), and the block
// whose positions hold a row's own position runs k norm + RoPE of kb and the
// quant8_row append of K and vb first.
// Only when every row of the launch is a different sequence's (decode: no
// row reads a K or V row another block of this launch appends).
struct RopeFold {
  int on;
  const int16_t* q_norm;
  const int16_t* k_norm;
  int64_t eps_q60;
  const int16_t* cos;
  const int16_t* sin;
  const int32_t* kb;  // [T, nkv, D] before k norm + RoPE
  const int32_t* vb;  // [T, nkv, D]
};
// What kAttnAuto takes from now on (kAttnSplit, kAttnMma, kAttnFused or
// kAttnFlash; anything else: the choice above) where it can serve the call
// (not kAttnMma or kAttnFlash under a RopeFold, not kAttnFused beyond
// attn_fused_max_pos, not kAttnFlash beyond the shared memory); tests and the
// device check's A/B timing only. The bits never change.
void set_attn_path_override(int path);
// kAttnFused's launch (launch_attention calls it): npos as for attn_path_for.
void launch_attention_fused(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer,
                            const int32_t* seq, const int32_t* pos, const DevKV* kvs, int64_t score_mant,
                            int64_t score_shift, const AttnScratch& sc, int64_t npos, int64_t* out, int16_t* act,
                            int32_t* act_e, cudaStream_t st, int64_t window, const RopeFold& rope, const Softcap& cap);
void launch_attention(const int32_t* q, int row0, int nrows, int nh, int nkv, int D, int layer, const int32_t* seq,
                      const int32_t* pos, const DevKV* kvs, int64_t score_mant, int64_t score_shift,
                      const AttnScratch& sc, int64_t* out, int16_t* act, int32_t* act_e, cudaStream_t st,
                      int64_t window = 0, int chunk = 0, int path = kAttnAuto, const RopeFold& rope = RopeFold{},
                      const Softcap& cap = Softcap{});

// ---- Mixture of experts (csrc/model/forward.cpp moe_route / moe_ffn, bit for bit)
//
// Every launch has a shape fixed by the row count alone (the routing lives on
// the device), so a decode step with MoE blocks is captured into a CUDA graph
// like a dense one; the experts' linears read only the chosen experts' rows.

// sel [T, k] int32 = per router row z [T, E] (Q16 log2 units) the k largest,
// ties to the lowest expert id, in that order; wts [T, k] int64 Q16 =
// softmax_q16 over those k (norm_topk) or the entries of the softmax over
// all E. k <= E.
void launch_moe_route(const int32_t* z, int T, int E, int k, bool norm_topk, int32_t* sel, int64_t* wts,
                      cudaStream_t st);

// One [E, N, K] expert tensor on the device (int8 w [E, N, K], or int4 w4
// [E, N, K/2] with gd, gm [E, N, K/32]) and its per-(expert, channel) dyadic
// scale mant, shift [E, N]; no bias.
struct MoeLinear {
  const int8_t* w;
  const uint8_t* w4;
  const int16_t* gd;
  const int16_t* gm;
  const int32_t* mant;
  const int32_t* shift;
  int N, K;
};
// Gathered rows: out[i * N + j] (int32, i < rows) = the linear of expert
// sel[i] on input row i / in_div of q [*, K] int16 (exponents e): in_div k
// for gate and up (the k slots of a row share its FFN input), 1 for down
// (each slot's own SwiGLU row). launch_linear's value for that expert.
void launch_moe_linear(const int16_t* q, const int32_t* e, int rows, int in_div, const MoeLinear& L,
                       const int32_t* sel, int32_t* out, cudaStream_t st);

// The weighted sum of the chosen experts' down outputs d [T * k, H] int32:
// v = round_shift(sum_j wts[t, j] * d[t * k + j], 16) in exact int64, then
// x[t] = sat32(x[t] + v) (the residual); comb [T, H] int64 gets v when not
// null (the trace's ffn_down).
void launch_moe_combine(const int32_t* d, const int64_t* wts, int T, int k, int H, int32_t* x, int64_t* comb,
                        cudaStream_t st);

// x[i] = softcap(x[i], cap) in place (Gemma 2's final logits, Q16).
void launch_softcap(int32_t* x, int64_t count, const Softcap& cap, cudaStream_t st);
// a[i] = swiglu(g[i], u[i]) (Q32 int64) for count elements of int32 Q16 inputs.
void launch_swiglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st);
// a[i] = geglu(g[i], u[i]) (Q32 int64): tanh-GELU gate (geglu_row).
void launch_geglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a, cudaStream_t st);

// token[0] = the greedy choice of one logits row [V] int32: the largest
// value, the lowest id among equal ones (the host Sampler's np.argmax).
// best and counter: zero before the first launch; every launch leaves them zero.
void launch_argmax(const int32_t* logits, int V, unsigned long long* best, int* counter, int32_t* token,
                   cudaStream_t st);

// Sampler.pick's cuts (python/intdet/sampling.py): top_k 0 = off; top-p
// p_num / p_den in (0, 1] (equal: off); min-p m_num / m_den in [0, 1]
// (m_num 0: off; m_den <= 10^6, as parse_fraction allows).
struct SampleCuts {
  int64_t top_k = 0;
  int64_t p_num = 1, p_den = 1;
  int64_t m_num = 0, m_den = 1;
};
// token[0] = the host Sampler's choice for temperature t_num / t_den with
// those cuts (no repetition penalty: the host applies it to the logits
// first), from one logits row [V] and the draw draw_u64(seed, position);
// wbuf: int32 [V] scratch.
void launch_sample(const int32_t* logits, int V, int64_t t_num, int64_t t_den, uint64_t draw, int32_t* wbuf,
                   int32_t* token, cudaStream_t st, const SampleCuts& cuts = SampleCuts{});

// out[i] = round_div(a[i], b[i]) on the device (tests of the integer division).
void launch_round_div(const int64_t* a, const int64_t* b, int64_t count, int64_t* out, cudaStream_t st);
// The division microbenchmark's kernel (kernels_elementwise.cu div_bench_kernel).
void launch_div_bench(const int64_t* a, const int64_t* b, int64_t count, int reps, int mode, int64_t* out,
                      cudaStream_t st);

}  // namespace cuda
}  // namespace intdet
