// The CUDA backend's host API: a device copy of an intdet::Model, device KV
// caches, and forward_rows with the same contract as the CPU core's
// (csrc/include/intdet/model.h): the same logits, bit for bit.
// No CUDA types here, so the pybind11 module is plain C++.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "intdet/model.h"
#include "intdet/trace.h"

namespace intdet {
namespace cuda {

// Number of CUDA devices the runtime sees (0 when there is no driver or GPU);
// *why receives the runtime's reason when it is 0.
int device_count(std::string* why = nullptr);
std::string device_name(int device);

struct DeviceModel;
struct DeviceState;

struct ModelDeleter {
  void operator()(DeviceModel* m) const;
};
struct StateDeleter {
  void operator()(DeviceState* s) const;
};
using ModelPtr = std::unique_ptr<DeviceModel, ModelDeleter>;
using StatePtr = std::unique_ptr<DeviceState, StateDeleter>;

// Uploads every tensor the host model points to (tied weights are uploaded
// once). Throws std::runtime_error when there is no usable device.
ModelPtr upload_model(const Model& host);
// Decode steps (up to 32 rows) replayed from captured CUDA graphs when on.
void set_graphs(DeviceModel& m, bool on);
bool graphs(const DeviceModel& m);
// Bytes of device memory the model's weights take.
int64_t weight_bytes(const DeviceModel& m);

StatePtr new_state(DeviceModel& m, int64_t max_len);
int64_t state_max_len(const DeviceState& s);
// Positions [0, n) of src's KV cache (K/V rows and scales of every layer and
// KV head) into dst, both states of m: the prefix cache's copy, bit for bit
// what a prefill of those tokens writes (the cache is [layer, position,
// kv head] rows, full length on the GPU). Device-to-device, on m's stream.
void copy_prefix(DeviceModel& m, const DeviceState& src, DeviceState& dst, int64_t n);

// Like intdet::forward_rows: rows[t].seq indexes states. Rows of one sequence
// must come in increasing position order (forward and forward_batch do).
// logits: host int32 [rows with want_logits, V] in row order.
void forward_rows(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                  int32_t* logits);
// forward_rows that also fills `trace` with the named intermediates of the
// CPU's forward_rows_traced (same names, order, shapes and values; isa
// "cuda"), each copied from the device after its step; never from a CUDA
// graph. forward_rows itself records nothing and never waits mid-call.
void forward_rows_traced(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                         int32_t* logits, Trace& trace);

// Decode with the token chosen on the device and the logits hashed on the
// host while the next step runs (docs/cuda.md). submit_pick enqueues rows
// start..start+T-1 of one sequence (tokens[t]; tokens null and T == 1: the
// token the previous submit chose, read on the device), the choice from the
// last row's logits (greedy: the largest, the lowest id on ties; or sampled,
// below: the host Sampler's token) and the copies of that row and the token
// into the next of two pinned slots, and returns without waiting.
// wait_pick waits for that step and returns its token; *logits points at
// its pinned row [V], valid until the second submit_pick after it. Any
// other forward on the model finishes a submitted step first.
// how: greedy (t_num 0), or temperature t_num / t_den sampling with the
// draw draw_u64(seed, start + T) (top-k, top-p, min-p off; no repetition
// penalty): python/intdet/sampling.py Sampler.pick's token.
struct Pick {
  int64_t t_num = 0, t_den = 1;
  uint64_t draw = 0;
  int64_t top_k = 0;  // Sampler.pick's cuts (0 / 1 / 0: off); kernels.cuh SampleCuts
  int64_t p_num = 1, p_den = 1;
  int64_t m_num = 0, m_den = 1;
};
void submit_pick(DeviceModel& m, DeviceState& s, const int32_t* tokens, int64_t T, int64_t start,
                 const Pick& how = Pick{});
int32_t wait_pick(DeviceModel& m, const int32_t** logits);

// One step of a profiled call: its name (embed, attn_norm, qkv, rope_append,
// attention, o_proj, ffn_norm, gate_up_glu, quant16_ffn, down_proj, per
// layer; out_norm, lm_head), its cudaEvent time in nanoseconds, the bytes it
// must read at least (weights; K and V for attention) and its launches.
struct ProfStep {
  std::string name;
  int64_t ns;
  int64_t bytes;
  int64_t launches;
};
// forward_rows (never from a graph) with a cudaEvent after every step;
// at most 4096 rows (one chunk).
std::vector<ProfStep> forward_rows_profiled(DeviceModel& m, DeviceState* const* states, int64_t n_states,
                                            const Row* rows, int64_t T, int32_t* logits);

// Page-locked host memory for the logits forward returns (the bindings' numpy
// arrays own a block each, module.cpp Gpu::alloc_logits): blocks come from a
// per-process pool, freed ones are kept for reuse up to kPinnedKeepBytes in
// all. pinned_alloc returns null when the runtime cannot pin that much (the
// caller then uses pageable memory); thread-safe.
void* pinned_alloc(size_t bytes);
void pinned_release(void* p);
struct PinnedStats {
  int64_t allocs = 0;  // blocks pinned by the runtime
  int64_t reuses = 0;  // requests served by a kept block
  int64_t frees = 0;  // blocks given back to the runtime
  int64_t kept_blocks = 0, kept_bytes = 0;  // free blocks kept now
  int64_t live_blocks = 0;  // blocks handed out and not released
};
PinnedStats pinned_stats();

// Kernel launches enqueued by this process so far (kernels_elementwise.cu; a graph
// replay adds none): the launches-per-token test and script.
int64_t launch_count();

// Op-level entry points for the tests (host arrays in, host arrays out).
namespace test {
// out [T, N] int32 = the linear layer; path: 0 auto, 1 GEMV, 2 tensor-core GEMM, 3 __dp2a GEMM, 4 skinny
// tensor-core GEMM (split-K scratch given). init: null, or out's starting values [T, N] and the residual
// mode (out = sat32(init + linear)).
void linear(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
            const int32_t* shift, const int32_t* bias, int64_t N, int path, int32_t* out,
            const int32_t* init = nullptr);
// The same with int4 weights: codes w4 [N, K/2], gd, gm [N, K/32]; K % 32 == 0.
void linear_w4(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
               const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int path,
               int32_t* out);
// nh query heads (q [nh, D] int32, quantized on the device like the forward
// pass) over n positions of an nkv-head cache (kc, vc [n, nkv, D]; ka, va
// [n, nkv]); out [nh, D]. chunk: positions per block of the split path (0:
// the launcher's choice of path and chunk).
void attend(const int32_t* q, int64_t nh, int64_t nkv, int64_t D, const int8_t* kc, const int32_t* ka,
            const int8_t* vc, const int32_t* va, int64_t n, int64_t score_mant, int64_t score_shift, int chunk,
            int64_t* out);
// Attention of T rows of one sequence (queries q [T, nh, D] int32 after RoPE;
// row t at position pos[t] < n, window > 0: only its last `window`
// positions) over the cache kc, vc [n, nkv, D], ka, va [n, nkv]: out [T, nh,
// D] int64 (attn_out), act [T, nh * D] int16 and act_e [T] its quant16.
// path: kAttnAuto / kAttnSplit / kAttnMma / kAttnFused (kernels.cuh).
void attend_rows(const int32_t* q, int64_t T, int64_t nh, int64_t nkv, int64_t D, const int8_t* kc, const int32_t* ka,
                 const int8_t* vc, const int32_t* va, int64_t n, const int32_t* pos, int64_t window,
                 int64_t score_mant, int64_t score_shift, int path, int64_t* out, int16_t* act, int32_t* act_e);
// The decode GEMV with its input computed in its prologue by every block
// (kernels.cuh GemvIn): out [T, N] int32 = the linear layer (w [N, K] int8)
// of quant16(RMSNorm(x[t])) (kind 1: x [T, K] int32 rows of fixed point
// in_frac) or of quant16(a[t]) (kind 2: a [T, K] int64). T <= 2.
void gemv_prologue(int kind, const int32_t* x, const int16_t* g, int64_t eps_q60,
                   int in_frac, const int64_t* a, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                   const int32_t* shift, const int32_t* bias, int64_t N, int32_t* out);
// RMSNorm then quant16 of rows x [R, n] int32: q [R, n], e [R].
void norm_quant16(const int32_t* x, const int16_t* g, int64_t R, int64_t n, int64_t eps_q60, int16_t* q, int32_t* e);
void swiglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a);
void geglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a);
void round_div(const int64_t* a, const int64_t* b, int64_t count, int64_t* out);
// The division microbenchmark (launch_div_bench, modes there): out [count],
// returns the kernel's cudaEvent time in nanoseconds.
int64_t div_bench(const int64_t* a, const int64_t* b, int64_t count, int reps, int mode, int64_t* out);
// out [R] = the device argmax of each logits row (logits [R, V]).
void argmax(const int32_t* logits, int64_t R, int64_t V, int32_t* out);
// The device sampler's token for one logits row [V] (launch_sample).
int32_t sample(const int32_t* logits, int64_t V, const Pick& how);
// Force the GEMV's warps per output channel to 2^wlg (0..2; -1: automatic).
void set_gemv_split(int wlg);
// Force the skinny GEMM's K splits (<= 0: automatic).
void set_skinny_split(int splits);
// kernels.cuh set_prefill_gemm_override: 2 the earlier prefill GEMM, else the skinny GEMM.
void set_prefill_gemm(int path);
// kernels.cuh set_attn_path_override: 1 split, 2 tensor cores, 3 one kernel, 4 flash tiles, else auto.
void set_attn_path(int path);
// Force the rows per lm_head slice and per lm_head group (<= 0: the
// constants kLogitsSliceRows and kLogitsBudget's rows), so tiny models
// exercise several slices and groups.
void set_logits_rows(int64_t slice, int64_t group);
// The host emulator's order of ready streams at a synchronization point
// (emu.h set_stream_order); throws on a real build.
void set_emu_stream_order(bool latest_first);
}  // namespace test

}  // namespace cuda
}  // namespace intdet
