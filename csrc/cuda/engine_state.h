// The CUDA engine's host-side state, shared by its files (engine_*.cpp):
// device buffers, the uploaded model and its workspace, the tracer and
// profiler of a call, the device-side token choice's pipe, and the few
// functions one file calls in another. Internal: only engine_*.cpp include it.
#pragma once

#include "engine.h"

#include "kernels.cuh"  // cuda_runtime.h, or the host emulator

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace intdet {
namespace cuda {

inline void ck(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error
    throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(err));
  }
}

// A device buffer that only grows; grow() says whether the pointer changed.
template <class T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (p) cudaFree(p);
  }
  bool grow(size_t want) {
    if (want <= n) return false;
    if (p) cudaFree(p);
    p = nullptr;
    n = 0;
    ck(cudaMalloc(&p, std::max<size_t>(want, 1) * sizeof(T)), "cudaMalloc (workspace)");
    n = want;
    return true;
  }
};

template <class T>
struct HostBuf {  // pinned, so async copies from it are real copies at execution time
  T* p = nullptr;
  size_t n = 0;
  HostBuf() = default;
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
  ~HostBuf() {
    if (p) cudaFreeHost(p);
  }
  void grow(size_t want) {
    if (want <= n) return;
    if (p) cudaFreeHost(p);
    p = nullptr;
    n = 0;
    ck(cudaMallocHost(&p, std::max<size_t>(want, 1) * sizeof(T)), "cudaMallocHost");
    n = want;
  }
};

struct DevLinear {
  const int8_t* w = nullptr;  // int8 weights [N, K], or null for int4:
  const uint8_t* w4 = nullptr;  // codes [N, K/2], step gd and offset gm [N, K/32]
  const int16_t* gd = nullptr;
  const int16_t* gm = nullptr;
  const int32_t* mant = nullptr;
  const int32_t* shift = nullptr;
  const int32_t* bias = nullptr;
  int64_t N = 0, K = 0;
};

struct DevLayer {
  const int16_t* attn_norm = nullptr;
  DevLinear q, k, v, o;
  bool qk_norm_projection = false;  // q/k RMSNorm over the whole projection (OLMo 2)
  const int16_t* q_norm = nullptr;
  const int16_t* k_norm = nullptr;
  int64_t score_mant = 0, score_shift = 0;
  Softcap attn_softcap;                     // Gemma 2's score soft-capping, else cap 0
  const int16_t* post_attn_norm = nullptr;  // Gemma's post-norms, else null
  int32_t post_attn_shift = 0;
  const int16_t* ffn_norm = nullptr;
  DevLinear gate, up, down;
  const int16_t* post_ffn_norm = nullptr;
  int32_t post_ffn_shift = 0;
  bool geglu = false;
  int64_t window = 0;
  const int16_t* rope_cos = nullptr;  // the block's RoPE table
  const int16_t* rope_sin = nullptr;
  // Mixture of experts (gate/up/down then unused), else n_experts 0: the
  // int8 router [E, H] and the experts' [E, N, K] tensors.
  int64_t n_experts = 0, n_experts_used = 0;
  bool norm_topk = false;
  DevLinear router;
  MoeLinear gate_exps{}, up_exps{}, down_exps{};
};

// Attention scratch (int32 per (row, head, position)) is bounded by this many
// bytes; rows beyond it go to further attention launches.
constexpr int64_t kScratchBudget = (int64_t)256 << 20;
// Columns of the chunk maxima: nsplit for the smallest chunk (32 positions).
inline int64_t attn_max_splits(int64_t sstride) { return (sstride + 31) / 32; }
// Rows per pass through the layers (a longer call runs in chunks; causal
// attention only reads earlier positions, so chunking cannot change a bit).
constexpr int64_t kMaxChunkRows = 4096;
// Logits buffer bound for the lm_head groups (at least one row).
constexpr int64_t kLogitsBudget = (int64_t)256 << 20;
// Rows per lm_head slice: a group of more rows runs its lm_head in slices,
// each slice's logits copied to the host on the copy stream while the next
// slice computes (docs/cuda.md "The logits path"); up to this many rows, one
// slice and one copy on the model's stream.
constexpr int64_t kLogitsSliceRows = 32;
// Rows per slice and per group: the constants, or the tests' overrides
// (test::set_logits_rows; 0: the constant).
int64_t logits_slice_rows();
int64_t logits_group_rows(int64_t vocab);

struct Workspace {
  int64_t rows = 0;  // row capacity of the per-row buffers
  Buf<int32_t> meta;  // [4, rows]: tokens, seq, pos, sel
  HostBuf<int32_t> h_meta;
  Buf<DevKV> kvs;
  HostBuf<DevKV> h_kvs;
  Buf<int32_t> x, qb, kb, vb, gate, up, logits, act_e, scratch;
  Buf<int32_t> branch;  // [rows, H]: o / down output in front of a post-norm (Gemma)
  // Mixture of experts: router outputs [rows, E], the chosen experts and
  // their weights [rows, k], per gathered row (rows * k) gate, up, SwiGLU,
  // its quant16 and the down output; comb [rows, H] the weighted sum (trace).
  Buf<int32_t> moe_z, moe_sel, moe_g, moe_u, moe_act_e, moe_d;
  Buf<int64_t> moe_w, moe_a, moe_comb;
  Buf<int16_t> moe_act;
  Buf<int16_t> act;
  Buf<int64_t> o, a;
  // Attention work buffers (AttnScratch): chunk maxima, shifts, arrival
  // counters and P.V sums; counters and oacc are zeroed when allocated and
  // every attention launch leaves them zero.
  Buf<int64_t> zpart;
  Buf<int32_t> shifts;
  Buf<int> counters;
  Buf<unsigned long long> oacc;
  // The skinny GEMM's split-K partial sums and arrival counters (kernels.cuh
  // GemmScratch): zeroed when allocated, left zero by every launch.
  Buf<unsigned long long> gemm_part;
  Buf<int> gemm_cnt;
  bool fold_rope = false;  // this call's rows: at most kDecodeGraphRows, each of a different sequence
  int64_t attn_npos = 0;  // AttnScratch::npos: this call's longest row, or for a graph a bound of its bucket
  Buf<int32_t> traced;  // [rows, H]: a normed row or a projection before its residual add (trace only)
  int32_t* tokens() { return meta.p; }
  int32_t* seq() { return meta.p + rows; }
  int32_t* pos() { return meta.p + 2 * rows; }
  int32_t* sel() { return meta.p + 3 * rows; }
};

// Receives the named intermediates of a traced call (intdet/trace.h): each
// step's device buffer is copied to the host once the stream has run it.
// Chunks after the first (rows beyond kMaxChunkRows) append their rows to the
// tensors the first one made, in the same order.
struct Tracer {
  Trace& tr;
  cudaStream_t st;
  size_t next = 0;  // tensor index of the next record in this chunk
  bool append = false;  // a later chunk: extend the tensors along rows
  template <class T>
  void rec(const std::string& name, const T* dev, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<T> host((size_t)n);
    ck(cudaMemcpyAsync(host.data(), dev, (size_t)n * sizeof(T), cudaMemcpyDeviceToHost, st),
       "cudaMemcpyAsync (trace)");
    ck(cudaStreamSynchronize(st), "trace");  // pageable memory: the copy is done when the stream is
    add(name, std::move(shape), std::vector<int64_t>(host.begin(), host.end()));
  }
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> values) {
    if (append && next < tr.tensors.size()) {
      Trace::Tensor& t = tr.tensors[next];
      if (t.name != name) throw std::logic_error("trace: chunks record different names");
      t.shape[0] += shape[0];
      t.values.insert(t.values.end(), values.begin(), values.end());
    } else {
      tr.tensors.push_back({name, std::move(shape), std::move(values)});
    }
    ++next;
  }
};

// cudaEvent timing of each step of one call (forward_rows_profiled): an
// event after every step, so step i's time is event i minus event i-1.
struct Profiler {
  struct Mark {
    std::string name;
    cudaEvent_t ev;
    int64_t bytes;
    int64_t launches;
  };
  std::vector<Mark> marks;
  int64_t attn_bytes = 0;  // K and V bytes (with scales) one layer's attention reads in this call
  ~Profiler() {
    for (Mark& k : marks) cudaEventDestroy(k.ev);
  }
  void mark(const std::string& name, int64_t bytes, cudaStream_t st) {
    cudaEvent_t ev = nullptr;
    ck(cudaEventCreate(&ev), "cudaEventCreate");
    marks.push_back({name, ev, bytes, launch_count()});
    ck(cudaEventRecord(ev, st), "cudaEventRecord");
  }
};

// Decode with the token chosen on the device (submit_pick, wait_pick): the
// argmax's and the sampler's scratch, the chosen token on the device (the
// next decode row's token), and two pinned slots for a step's logits row and
// token, so the host hashes one step's logits while the next step runs.
struct GreedyPipe {
  Buf<int32_t> pick;  // [1]
  Buf<int32_t> wbuf;  // [V] the sampler's weights
  Pick how;  // the submitted step's choice
  Buf<unsigned long long> best;  // [1] argmax scratch, zero between launches
  Buf<int> counter;  // [1] argmax arrivals, zero between launches
  HostBuf<int32_t> h_logits;  // [2, V]
  HostBuf<int32_t> h_pick;  // [2]
  cudaEvent_t done = nullptr;  // recorded after the submitted step's copies
  int slot = 0;  // the slot of the last submitted step
  bool pending = false;  // submitted, not yet waited for
  bool have_pick = false;  // pick holds a token
};

// What a chunk does beyond forward_rows (the last chunk of submit_pick).
struct ChunkOpts {
  const int32_t* token_from = nullptr;  // device: row 0's token (else the host's)
  GreedyPipe* pipe = nullptr;  // argmax of the (one) logits row into pipe->pick and pipe->h_pick[slot]
};

struct DeviceModel {
  Config cfg;
  int device = 0;
  std::vector<void*> allocs;
  int64_t bytes = 0;
  const int8_t* tok_embd = nullptr;
  const int32_t* embd_mant = nullptr;
  const int32_t* embd_shift = nullptr;
  const int16_t* rope_cos = nullptr;
  const int16_t* rope_sin = nullptr;
  std::vector<DevLayer> layers;
  const int16_t* out_norm = nullptr;
  DevLinear output;
  Softcap final_softcap;  // Gemma 2's logit soft-capping, else cap 0
  int64_t moe_E = 0, moe_k = 0, moe_F = 0;  // the largest experts, experts per token and expert FFN of any block
  cudaStream_t stream = nullptr;
  Workspace ws;
  bool use_graphs = false;
  Profiler* prof = nullptr;  // set only during forward_rows_profiled
  GreedyPipe greedy;
  // (T, Tout, sstride, rows_per, fold_rope, attn_npos, rows per lm_head slice)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t>, cudaGraphExec_t> graphs;
  // The sliced logits copies: their stream, an event after each lm_head
  // slice (on stream; in a captured graph an external event record node) and
  // one after the last copy (on copy_stream). Made on first use.
  cudaStream_t copy_stream = nullptr;
  std::vector<cudaEvent_t> slice_done;
  cudaEvent_t copies_done = nullptr;

  void drop_graphs() {
    for (auto& kv : graphs) cudaGraphExecDestroy(kv.second);
    graphs.clear();
  }
  ~DeviceModel() {
    cudaSetDevice(device);
    drop_graphs();
    if (greedy.done) {
      cudaEventSynchronize(greedy.done);
      cudaEventDestroy(greedy.done);
    }
    if (copy_stream) cudaStreamSynchronize(copy_stream);
    for (cudaEvent_t e : slice_done) cudaEventDestroy(e);
    if (copies_done) cudaEventDestroy(copies_done);
    if (copy_stream) cudaStreamDestroy(copy_stream);
    if (stream) cudaStreamDestroy(stream);
    for (void* p : allocs) cudaFree(p);
  }
};

struct DeviceState {
  int device = 0;
  DevKV kv{};
  ~DeviceState() {
    cudaSetDevice(device);
    for (void* p : {(void*)kv.k, (void*)kv.v, (void*)kv.ka, (void*)kv.va})
      if (p) cudaFree(p);
  }
};

// engine_forward.cpp: forward_rows and its variants; opt: the last chunk's
// extras (submit_pick).
void forward_rows_impl(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                       int32_t* logits, Trace* trace, const ChunkOpts* opt = nullptr);
// engine_pick.cpp: the device's choice of the (one) logits row in w.logits.
void enqueue_pick(DeviceModel& m, GreedyPipe& g);

}  // namespace cuda
}  // namespace intdet
