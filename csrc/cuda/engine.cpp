// The CUDA backend's host side: uploads the model, owns device KV caches and
// the activation workspace, and enqueues the forward pass of
// csrc/model/forward.cpp kernel by kernel (kernels in kernels_*.cu). Decode
// steps can be captured once per shape into CUDA graphs and replayed.
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
namespace {

void ck(cudaError_t err, const char* what) {
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
int64_t attn_max_splits(int64_t sstride) { return (sstride + 31) / 32; }
// Rows per pass through the layers (a longer call runs in chunks; causal
// attention only reads earlier positions, so chunking cannot change a bit).
constexpr int64_t kMaxChunkRows = 4096;
// Logits buffer bound for the lm_head groups (at least one row).
constexpr int64_t kLogitsBudget = (int64_t)256 << 20;

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
  bool fold_rope = false;  // this call's rows: at most kGemvMaxRows, each of a different sequence
  Buf<int> gemv_cnt;  // [8]: a residual GEMV's arrival counters for the norm it runs after (zero)
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

}  // namespace

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
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, cudaGraphExec_t> graphs;  // (T, Tout, sstride, rows_per, fold_rope)

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

void ModelDeleter::operator()(DeviceModel* m) const { delete m; }
void StateDeleter::operator()(DeviceState* s) const { delete s; }

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime sees no device";
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  ck(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ")";
}

namespace {

template <class T>
const T* upload(DeviceModel& m, std::map<const void*, void*>& seen, const T* host, int64_t count) {
  if (!host) return nullptr;
  auto it = seen.find(host);
  if (it != seen.end()) return static_cast<const T*>(it->second);
  void* d = nullptr;
  const size_t bytes = (size_t)std::max<int64_t>(count, 1) * sizeof(T);
  ck(cudaMalloc(&d, bytes), "cudaMalloc (weights)");
  m.allocs.push_back(d);
  ck(cudaMemcpy(d, host, (size_t)count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
  seen[host] = d;
  m.bytes += (int64_t)bytes;
  return static_cast<const T*>(d);
}

DevLinear upload_linear(DeviceModel& m, std::map<const void*, void*>& seen, const Linear& L) {
  DevLinear d;
  d.N = L.N;
  d.K = L.K;
  if (L.w4) {  // int4: the unpacked format (w4, gd, gm); the CPU kernel sets' packed copies are not used here
    if (L.K % 32) throw std::invalid_argument("int4 weights: input size is not a multiple of 32");
    d.w4 = upload(m, seen, L.w4, L.N * (L.K / 2));
    d.gd = upload(m, seen, L.gd, L.N * (L.K / 32));
    d.gm = upload(m, seen, L.gm, L.N * (L.K / 32));
  } else {
    d.w = upload(m, seen, L.w, L.N * L.K);
  }
  d.mant = upload(m, seen, L.mant, L.N);
  d.shift = upload(m, seen, L.shift, L.N);
  d.bias = upload(m, seen, L.bias, L.N);
  return d;
}

// The E experts' Linear views (loader.cpp: expert e at row e * N of one
// [E, N, K] tensor) as that one tensor on the device.
MoeLinear upload_experts(DeviceModel& m, std::map<const void*, void*>& seen, const std::vector<Linear>& ex) {
  const Linear& a = ex[0];
  const int64_t E = (int64_t)ex.size(), N = a.N, K = a.K;
  for (int64_t e = 0; e < E; ++e) {
    const Linear& b = ex[(size_t)e];
    if (b.N != N || b.K != K || b.mant != a.mant + e * N || b.shift != a.shift + e * N ||
        (a.w && b.w != a.w + e * N * K) || (a.w4 && b.w4 != a.w4 + e * N * (K / 2)))
      throw std::logic_error("experts are not views of one [E, N, K] tensor");
  }
  MoeLinear d{};
  d.N = (int)N;
  d.K = (int)K;
  if (a.w4) {
    if (K % 32) throw std::invalid_argument("int4 weights: input size is not a multiple of 32");
    d.w4 = upload(m, seen, a.w4, E * N * (K / 2));
    d.gd = upload(m, seen, a.gd, E * N * (K / 32));
    d.gm = upload(m, seen, a.gm, E * N * (K / 32));
  } else {
    d.w = upload(m, seen, a.w, E * N * K);
  }
  d.mant = upload(m, seen, a.mant, E * N);
  d.shift = upload(m, seen, a.shift, E * N);
  return d;
}

void lin(DeviceModel& m, const DevLinear& L, int64_t T, int32_t* out, bool residual) {
  if (L.w4) {
    launch_linear_w4(m.ws.act.p, m.ws.act_e.p, (int)T, (int)L.K, L.w4, L.gd, L.gm, L.mant, L.shift, L.bias, (int)L.N,
                     out, L.N, residual, kLinearAuto, m.stream);
    return;
  }
  launch_linear(m.ws.act.p, m.ws.act_e.p, (int)T, (int)L.K, L.w, L.mant, L.shift, L.bias, (int)L.N, out, L.N, residual, kLinearAuto, m.stream);
}

// Bytes of weights a linear layer reads (int8, or int4 codes + group step and offset).
int64_t lin_bytes(const DevLinear& L) { return L.w ? L.N * L.K : L.N * L.K / 2 + L.N * (L.K / 32) * 4; }
void mark(DeviceModel& m, const char* name, int64_t bytes) {
  if (m.prof) m.prof->mark(name, bytes, m.stream);
}

// Decode-sized calls with int8 weights fuse linear layers into one GEMV launch.
bool fused_gemv(const DevLinear& L, int64_t T) { return L.w && T <= kGemvMaxRows; }
GemvSeg seg(const DevLinear& L, int32_t* out) {
  return GemvSeg{L.w, L.mant, L.shift, L.bias, out, L.N, (int)L.N, 0};
}

// x = sat32(x + linear) for T <= kNormFoldRows rows, then RMSNorm (gamma g)
// + quant16 of x into act by the GEMV's last block: one launch for the
// residual projection and the norm after it (normed: the trace's copy).
bool fold_norm(const DevLinear& L, int64_t T) { return L.w && T <= kNormFoldRows; }
void lin_norm(DeviceModel& m, const DevLinear& L, int64_t T, const int16_t* g, int32_t* normed) {
  Workspace& w = m.ws;
  const Config& c = m.cfg;
  GemvSegs s{};
  s.s[0] = seg(L, w.x.p);
  s.n = 1;
  const NormAfter na{w.gemv_cnt.p, g, (int)c.hidden, c.eps_hidden, (int)c.residual_frac, w.act.p, w.act_e.p, normed};
  launch_gemv(w.act.p, w.act_e.p, (int)T, (int)L.K, s, true, m.stream, na);
}

// Mixture-of-experts FFN of T rows (act: their int16 FFN input) into the
// residual x: router, route (device top-k), the chosen experts' SwiGLU FFNs
// on the T * k gathered rows, the weighted sum. Fixed launch shapes for T,
// so a decode step is graph-captured as a dense one; only the chosen
// experts' weight rows are read.
void enqueue_moe(DeviceModel& m, const DevLayer& L, int64_t T, Tracer* tr, const std::string& blk) {
  Workspace& w = m.ws;
  const cudaStream_t st = m.stream;
  const int E = (int)L.n_experts, k = (int)L.n_experts_used, Fm = L.gate_exps.N, H = (int)m.cfg.hidden;
  const int G = (int)(T * k);
  lin(m, L.router, T, w.moe_z.p, false);  // [T, E] Q16 log2 units
  launch_moe_route(w.moe_z.p, (int)T, E, k, L.norm_topk, w.moe_sel.p, w.moe_w.p, st);
  launch_moe_linear(w.act.p, w.act_e.p, G, k, L.gate_exps, w.moe_sel.p, w.moe_g.p, st);  // [G, Fm] Q16
  launch_moe_linear(w.act.p, w.act_e.p, G, k, L.up_exps, w.moe_sel.p, w.moe_u.p, st);
  launch_swiglu(w.moe_g.p, w.moe_u.p, (int64_t)G * Fm, w.moe_a.p, st);  // Q32 int64
  launch_quant16_i64(w.moe_a.p, G, Fm, w.moe_act.p, w.moe_act_e.p, st);
  launch_moe_linear(w.moe_act.p, w.moe_act_e.p, G, 1, L.down_exps, w.moe_sel.p, w.moe_d.p, st);  // [G, H]
  launch_moe_combine(w.moe_d.p, w.moe_w.p, (int)T, k, H, w.x.p, tr ? w.moe_comb.p : nullptr, st);
  if (tr) {
    tr->rec(blk + "ffn_gate_inp", w.moe_z.p, {T, E});
    tr->rec(blk + "ffn_down", w.moe_comb.p, {T, H});
    tr->rec(blk + "residual", w.x.p, {T, H});
  }
  const auto exp_bytes = [&](const MoeLinear& X) {
    return (int64_t)(X.w ? X.N * X.K : X.N * X.K / 2 + X.N * (X.K / 32) * 4);
  };
  mark(m, "ffn_moe", lin_bytes(L.router) + (int64_t)k * (exp_bytes(L.gate_exps) + exp_bytes(L.up_exps) + exp_bytes(L.down_exps)));
}

// All layers for T rows (metadata already on the device); no host sync
// unless tr (then each named step is copied to the host after it runs).
void enqueue_body(DeviceModel& m, int64_t T, int64_t sstride, int64_t rows_per, Tracer* tr) {
  const Config& c = m.cfg;
  Workspace& w = m.ws;
  const AttnScratch asc{w.scratch.p, sstride, w.zpart.p, w.shifts.p, w.counters.p, w.oacc.p, rows_per,
                        attn_max_splits(sstride)};
  const cudaStream_t st = m.stream;
  const int H = (int)c.hidden, nh = (int)c.n_heads, nkv = (int)c.n_kv, D = (int)c.head_dim;
  const int64_t F = c.ffn;
  int32_t* normed = tr ? w.traced.p : nullptr;  // the norms also store their int32 rows when tracing
  const int R = (int)c.residual_frac;  // residual Q R
  launch_embed(w.tokens(), m.tok_embd, m.embd_mant, m.embd_shift, (int)T, H, w.x.p, st);
  if (tr) tr->rec("tok_embd", w.x.p, {T, H});
  mark(m, "embed", T * H);
  bool normed_ahead = false;  // act already holds this layer's attn_norm output
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const DevLayer& L = m.layers[(size_t)l];
    const DevLayer* next = l + 1 < c.n_layers ? &m.layers[(size_t)l + 1] : nullptr;
    const std::string blk = tr ? "blk." + std::to_string(l) + "." : "";
    // --- attention block ---
    bool ffn_normed = false;
    if (!L.attn_norm)  // no pre-norm (OLMo 2): the residual itself to int16
      launch_quant16_i32(w.x.p, (int)T, H, w.act.p, w.act_e.p, st);
    else if (!normed_ahead)  // else the previous down-proj's last block ran this norm
      launch_norm_quant16(w.x.p, nullptr, L.attn_norm, (int)T, H, c.eps_hidden, R, w.act.p, w.act_e.p, st, normed);
    normed_ahead = false;
    if (tr && L.attn_norm) tr->rec(blk + "attn_norm", normed, {T, H});
    mark(m, "attn_norm", T * H * 4);
    if (fused_gemv(L.q, T) && L.k.w && L.v.w && L.k.K == L.q.K && L.v.K == L.q.K) {  // q, k, v: one launch
      GemvSegs s{};
      s.s[0] = seg(L.q, w.qb.p);
      s.s[1] = seg(L.k, w.kb.p);
      s.s[2] = seg(L.v, w.vb.p);
      s.n = 3;
      launch_gemv(w.act.p, w.act_e.p, (int)T, (int)L.q.K, s, false, st);
    } else {
      lin(m, L.q, T, w.qb.p, false);  // [T, nh*D] Q16
      lin(m, L.k, T, w.kb.p, false);  // [T, nkv*D]
      lin(m, L.v, T, w.vb.p, false);
    }
    mark(m, "qkv", lin_bytes(L.q) + lin_bytes(L.k) + lin_bytes(L.v));
    if (tr) {  // before norm_rope rewrites q and k in place
      tr->rec(blk + "attn_q", w.qb.p, {T, nh, D});
      tr->rec(blk + "attn_k", w.kb.p, {T, nkv, D});
      tr->rec(blk + "attn_v", w.vb.p, {T, nkv, D});
    }
    // q_norm / k_norm are null unless the block has per-head q/k RMSNorm.
    // q/k norm + RoPE of q and k, and the KV append: one launch.
    // Decode rows of distinct sequences (w.fold_rope): the attention's scores
    // kernel runs it instead (RopeFold), one launch fewer.
    // A projection-wide q/k norm (OLMo 2) runs first, on whole rows; the
    // per-head step then has no norm.
    const int16_t* head_q_norm = L.qk_norm_projection ? nullptr : L.q_norm;
    const int16_t* head_k_norm = L.qk_norm_projection ? nullptr : L.k_norm;
    if (L.q_norm && L.qk_norm_projection) {
      launch_norm_rows(w.qb.p, L.q_norm, (int)T, nh * D, c.eps_q, st);
      launch_norm_rows(w.kb.p, L.k_norm, (int)T, nkv * D, c.eps_k, st);
    }
    RopeFold rf{};
    if (w.fold_rope && !tr)
      rf = RopeFold{1, head_q_norm, head_k_norm, c.eps_head, L.rope_cos, L.rope_sin, w.kb.p, w.vb.p};
    else
      launch_rope_append(w.qb.p, w.kb.p, w.vb.p, (int)T, nh, nkv, D, head_q_norm, head_k_norm, c.eps_head, w.pos(),
                         L.rope_cos, L.rope_sin, (int)l, w.seq(), w.kvs.p, st);
    mark(m, "rope_append", T * (nh + 2 * nkv) * D * 4);
    for (int64_t r0 = 0; r0 < T; r0 += rows_per)
      launch_attention(w.qb.p, (int)r0, (int)std::min(rows_per, T - r0), nh, nkv, D, (int)l, w.seq(), w.pos(),
                       w.kvs.p, L.score_mant, L.score_shift, asc, w.o.p, w.act.p, w.act_e.p, st, L.window, 0,
                       kAttnAuto, rf, L.attn_softcap);
    mark(m, "attention", m.prof ? m.prof->attn_bytes : 0);
    if (tr) tr->rec(blk + "attn_out", w.o.p, {T, nh * D});
    if (L.post_attn_norm) {  // o-proj (Q16), its RMSNorm, then into the residual
      lin(m, L.o, T, w.branch.p, false);
      if (tr) tr->rec(blk + "attn_output", w.branch.p, {T, H});
      launch_post_norm_add(w.branch.p, L.post_attn_norm, (int)T, H, c.eps_hidden, L.post_attn_shift, w.x.p, st);
    } else {
      if (tr) {  // the projection alone: the same kernel once more, storing instead of adding
        lin(m, L.o, T, w.traced.p, false);
        tr->rec(blk + "attn_output", w.traced.p, {T, H});
      }
      if (L.ffn_norm && fold_norm(L.o, T))
        lin_norm(m, L.o, T, L.ffn_norm, normed), ffn_normed = true;  // x += o-proj, then ffn_norm: one launch
      else
        lin(m, L.o, T, w.x.p, true);  // x = sat32(x + o-proj)
    }
    mark(m, "o_proj", lin_bytes(L.o));
    // --- feed-forward block ---
    if (!L.ffn_norm)
      launch_quant16_i32(w.x.p, (int)T, H, w.act.p, w.act_e.p, st);
    else if (!ffn_normed)
      launch_norm_quant16(w.x.p, nullptr, L.ffn_norm, (int)T, H, c.eps_hidden, R, w.act.p, w.act_e.p, st, normed);
    if (tr && L.ffn_norm) tr->rec(blk + "ffn_norm", normed, {T, H});
    mark(m, "ffn_norm", T * H * 4);
    if (L.n_experts) {  // mixture of experts: forward.cpp moe_ffn's values, routed on the device
      enqueue_moe(m, L, T, tr, blk);
      continue;
    }
    bool ffn_quantized = false;  // the gate+up GEMV's last block ran quant16 of the GLU rows
    if (fused_gemv(L.gate, T) && L.up.w && L.up.K == L.gate.K && L.up.N == L.gate.N) {
      // gate and up in one launch, SwiGLU / GeGLU of each pair in its epilogue
      GemvSegs s{};
      s.s[0] = seg(L.gate, w.gate.p);
      s.s[1] = seg(L.up, w.up.p);
      s.n = 2;
      s.glu = L.geglu ? 2 : 1;
      s.glu_out = w.a.p;
      s.glu_ldo = F;
      if (T <= kNormFoldRows && F <= kQuantFoldN) {  // and quant16 of the rows: the down-proj's input
        s.quant_counter = w.gemv_cnt.p + 4;
        s.quant_q = w.act.p;
        s.quant_e = w.act_e.p;
        ffn_quantized = true;
      }
      launch_gemv(w.act.p, w.act_e.p, (int)T, (int)L.gate.K, s, false, st);
    } else {
      lin(m, L.gate, T, w.gate.p, false);  // [T, F] Q16
      lin(m, L.up, T, w.up.p, false);
      if (L.geglu)
        launch_geglu(w.gate.p, w.up.p, T * F, w.a.p, st);  // Q32 int64
      else
        launch_swiglu(w.gate.p, w.up.p, T * F, w.a.p, st);
    }
    mark(m, "gate_up_glu", lin_bytes(L.gate) + lin_bytes(L.up));
    if (!ffn_quantized) launch_quant16_i64(w.a.p, (int)T, (int)F, w.act.p, w.act_e.p, st);
    mark(m, "quant16_ffn", ffn_quantized ? 0 : T * F * 8);
    if (tr) {
      tr->rec(blk + "ffn_gate", w.gate.p, {T, F});
      tr->rec(blk + "ffn_up", w.up.p, {T, F});
      tr->rec(blk + "ffn_swiglu", w.a.p, {T, F});
    }
    if (L.post_ffn_norm) {
      lin(m, L.down, T, w.branch.p, false);
      if (tr) tr->rec(blk + "ffn_down", w.branch.p, {T, H});
      launch_post_norm_add(w.branch.p, L.post_ffn_norm, (int)T, H, c.eps_hidden, L.post_ffn_shift, w.x.p, st);
    } else {
      if (tr) {
        lin(m, L.down, T, w.traced.p, false);
        tr->rec(blk + "ffn_down", w.traced.p, {T, H});
      }
      if (next && next->attn_norm && fold_norm(L.down, T))  // x += down-proj, then the next layer's attn_norm: one launch
        lin_norm(m, L.down, T, next->attn_norm, normed), normed_ahead = true;
      else
        lin(m, L.down, T, w.x.p, true);
    }
    mark(m, "down_proj", lin_bytes(L.down));
    if (tr) tr->rec(blk + "residual", w.x.p, {T, H});
  }
}

// Final norm and lm_head for selected rows r0..r0+nr-1 (w.sel) into w.logits.
void enqueue_head(DeviceModel& m, int64_t r0, int64_t nr) {
  Workspace& w = m.ws;
  launch_norm_quant16(w.x.p, w.sel() + r0, m.out_norm, (int)nr, (int)m.cfg.hidden, m.cfg.eps_hidden,
                      (int)m.cfg.residual_frac, w.act.p, w.act_e.p, m.stream);
  mark(m, "out_norm", nr * m.cfg.hidden * 4);
  lin(m, m.output, nr, w.logits.p, false);  // [nr, V] Q16
  if (m.final_softcap.cap) launch_softcap(w.logits.p, nr * m.cfg.vocab, m.final_softcap, m.stream);  // Gemma 2
  mark(m, "lm_head", lin_bytes(m.output));
}

// Argmax of the (one) logits row in w.logits into the pipe's device token
// and its pinned slot.
void enqueue_pick(DeviceModel& m, GreedyPipe& g) {
  if (g.how.t_num)
    launch_sample(m.ws.logits.p, (int)m.cfg.vocab, g.how.t_num, g.how.t_den, g.how.draw, g.wbuf.p, g.pick.p, m.stream,
                  SampleCuts{g.how.top_k, g.how.p_num, g.how.p_den, g.how.m_num, g.how.m_den});
  else
    launch_argmax(m.ws.logits.p, (int)m.cfg.vocab, g.best.p, g.counter.p, g.pick.p, m.stream);
  ck(cudaMemcpyAsync(g.h_pick.p + g.slot, g.pick.p, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
     "cudaMemcpyAsync (token)");
}

void forward_chunk(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                   int32_t* logits, Tracer* tr, const ChunkOpts* opt = nullptr) {
  const Config& c = m.cfg;
  Workspace& w = m.ws;
  const int64_t H = c.hidden, F = c.ffn, nh = c.n_heads, nkv = c.n_kv, D = c.head_dim, V = c.vocab;
  int64_t Tout = 0, nmax = 1, maxlen = 1;
  for (int64_t t = 0; t < T; ++t) {
    Tout += rows[t].want_logits ? 1 : 0;
    nmax = std::max(nmax, rows[t].pos + 1);
  }
  for (int64_t i = 0; i < n_states; ++i) maxlen = std::max(maxlen, states[i]->kv.max_len);
  const bool graph = m.use_graphs && T <= kGemvMaxRows && !tr && !m.prof;  // traced or profiled: no graph
  // Scratch row stride: the longest cache for graphs (replayed as sequences
  // grow), else this call's longest row, rounded up.
  const int64_t sstride = graph ? maxlen : (nmax + 255) / 256 * 256;
  const int64_t rows_per = std::max<int64_t>(1, std::min<int64_t>({T, 65535, kScratchBudget / (nh * sstride * 4)}));
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(Tout, kLogitsBudget / (V * 4)));
  const int64_t cap = std::max(T, w.rows);
  bool moved = false;
  if (cap > w.rows || !w.meta.p) {
    moved |= w.meta.grow((size_t)(4 * cap));
    w.h_meta.grow((size_t)(4 * cap));
    w.rows = cap;
  }
  const int64_t kmax = std::max({H, nh * D, F});
  moved |= w.kvs.grow((size_t)std::max<int64_t>(n_states, 1));
  w.h_kvs.grow((size_t)std::max<int64_t>(n_states, 1));
  moved |= w.x.grow((size_t)(cap * H));
  moved |= w.branch.grow((size_t)(cap * H));
  moved |= w.act.grow((size_t)(cap * kmax));
  moved |= w.act_e.grow((size_t)cap);
  moved |= w.qb.grow((size_t)(cap * nh * D));
  moved |= w.kb.grow((size_t)(cap * nkv * D));
  moved |= w.vb.grow((size_t)(cap * nkv * D));
  moved |= w.o.grow((size_t)(cap * nh * D));
  moved |= w.gate.grow((size_t)(cap * F));
  moved |= w.up.grow((size_t)(cap * F));
  moved |= w.a.grow((size_t)(cap * F));
  moved |= w.logits.grow((size_t)(std::max<int64_t>(group, 1) * V));
  if (m.moe_E) {
    const size_t g = (size_t)(cap * m.moe_k);  // gathered rows
    moved |= w.moe_z.grow((size_t)(cap * m.moe_E));
    moved |= w.moe_sel.grow(g);
    moved |= w.moe_w.grow(g);
    moved |= w.moe_g.grow(g * (size_t)m.moe_F);
    moved |= w.moe_u.grow(g * (size_t)m.moe_F);
    moved |= w.moe_a.grow(g * (size_t)m.moe_F);
    moved |= w.moe_act.grow(g * (size_t)std::max(m.moe_F, H));
    moved |= w.moe_act_e.grow(g);
    moved |= w.moe_d.grow(g * (size_t)H);
    moved |= w.moe_comb.grow((size_t)(cap * H));
  }
  moved |= w.scratch.grow((size_t)(rows_per * nh * sstride));
  moved |= w.zpart.grow((size_t)(rows_per * nh * attn_max_splits(sstride)));
  moved |= w.shifts.grow((size_t)(rows_per * nh));
  if (w.counters.grow((size_t)(rows_per * (nkv + 1)))) {
    moved = true;
    ck(cudaMemsetAsync(w.counters.p, 0, w.counters.n * sizeof(int), m.stream), "cudaMemsetAsync");
  }
  if (w.gemv_cnt.grow(8)) {
    moved = true;
    ck(cudaMemsetAsync(w.gemv_cnt.p, 0, w.gemv_cnt.n * sizeof(int), m.stream), "cudaMemsetAsync");
  }
  if (w.oacc.grow((size_t)(rows_per * nh * D))) {
    moved = true;
    ck(cudaMemsetAsync(w.oacc.p, 0, w.oacc.n * sizeof(unsigned long long), m.stream), "cudaMemsetAsync");
  }
  if (moved) m.drop_graphs();
  if (tr) w.traced.grow((size_t)(cap * H));  // no graph reads it

  // Row metadata and the caches of this call to the device.
  int32_t* hm = w.h_meta.p;
  int64_t r = 0;
  for (int64_t t = 0; t < T; ++t) {
    hm[t] = rows[t].token;
    hm[w.rows + t] = (int32_t)rows[t].seq;
    hm[2 * w.rows + t] = (int32_t)rows[t].pos;
    if (rows[t].want_logits) hm[3 * w.rows + r++] = (int32_t)t;
  }
  for (int64_t i = 0; i < n_states; ++i) w.h_kvs.p[i] = states[i]->kv;
  w.fold_rope = T <= kGemvMaxRows && !tr;
  for (int64_t t = 1; t < T && w.fold_rope; ++t)
    for (int64_t u = 0; u < t; ++u)
      if (rows[u].seq == rows[t].seq) {
        w.fold_rope = false;
        break;
      }
  for (int k = 0; k < 4; ++k)
    ck(cudaMemcpyAsync(w.meta.p + k * w.rows, hm + k * w.rows, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice,
                       m.stream),
       "cudaMemcpyAsync (rows)");
  ck(cudaMemcpyAsync(w.kvs.p, w.h_kvs.p, (size_t)n_states * sizeof(DevKV), cudaMemcpyHostToDevice, m.stream),
     "cudaMemcpyAsync (caches)");
  if (opt && opt->token_from)  // stream order: after the rows' upload, before the embedding reads it
    ck(cudaMemcpyAsync(w.tokens(), opt->token_from, sizeof(int32_t), cudaMemcpyDeviceToDevice, m.stream),
       "cudaMemcpyAsync (device token)");

  if (graph && Tout <= group) {
    const auto key = std::make_tuple(T, Tout, sstride, rows_per, w.fold_rope);
    auto it = m.graphs.find(key);
    if (it == m.graphs.end()) {
      cudaGraph_t g = nullptr;
      ck(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        enqueue_body(m, T, sstride, rows_per, nullptr);
        if (Tout) enqueue_head(m, 0, Tout);
      } catch (...) {
        cudaStreamEndCapture(m.stream, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      ck(cudaStreamEndCapture(m.stream, &g), "cudaStreamEndCapture");
      cudaGraphExec_t ex = nullptr;
      const cudaError_t err = cudaGraphInstantiate(&ex, g, 0);
      cudaGraphDestroy(g);
      ck(err, "cudaGraphInstantiate");
      it = m.graphs.emplace(key, ex).first;
    }
    ck(cudaGraphLaunch(it->second, m.stream), "cudaGraphLaunch");
    if (Tout)
      ck(cudaMemcpyAsync(logits, w.logits.p, (size_t)(Tout * V) * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
         "cudaMemcpyAsync (logits)");
    if (opt && opt->pipe) enqueue_pick(m, *opt->pipe);
  } else {
    if (m.prof) {
      m.prof->attn_bytes = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t win = m.layers.empty() ? 0 : m.layers[0].window;
        const int64_t n = win && rows[t].pos + 1 > win ? win : rows[t].pos + 1;
        m.prof->attn_bytes += n * nkv * (2 * D + 8);  // K and V rows and their scales
      }
      m.prof->mark("start", 0, m.stream);
    }
    enqueue_body(m, T, sstride, rows_per, tr);
    for (int64_t r0 = 0; r0 < Tout; r0 += group) {
      const int64_t nr = std::min(group, Tout - r0);
      enqueue_head(m, r0, nr);
      ck(cudaMemcpyAsync(logits + r0 * V, w.logits.p, (size_t)(nr * V) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                         m.stream),
         "cudaMemcpyAsync (logits)");
    }
    if (opt && opt->pipe) enqueue_pick(m, *opt->pipe);
  }
  if (opt && opt->pipe) {  // submit_pick: the host waits on the event later (wait_pick)
    ck(cudaEventRecord(opt->pipe->done, m.stream), "cudaEventRecord");
    return;
  }
  ck(cudaStreamSynchronize(m.stream), "forward");
  if (tr && Tout) tr->add("output", {Tout, V}, std::vector<int64_t>(logits, logits + Tout * V));
}

}  // namespace

ModelPtr upload_model(const Model& h) {
  std::string why;
  if (device_count(&why) == 0) throw std::runtime_error("no CUDA GPU available (" + why + ")");
  const Config& c = h.cfg;
  if (c.n_heads <= 0 || c.n_kv <= 0 || c.n_heads % c.n_kv || c.head_dim % 2 || c.head_dim > 256 || c.hidden > 8192)
    throw std::invalid_argument("model config has unsupported head or hidden sizes");
  for (const Layer& L : h.layers)  // refused by name rather than run wrong (the CPU engine runs it)
    if (!L.gate_exps.empty() && L.post_ffn_norm)
      throw std::invalid_argument("mixture-of-experts blocks with a post-FFN norm are not implemented by the CUDA "
                                  "engine (use the CPU)");
  ModelPtr m(new DeviceModel());
  m->cfg = c;
  ck(cudaGetDevice(&m->device), "cudaGetDevice");
  ck(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::map<const void*, void*> seen;
  const int64_t H = c.hidden, half = c.head_dim / 2;
  m->tok_embd = upload(*m, seen, h.tok_embd, c.vocab * H);
  m->embd_mant = upload(*m, seen, h.embd_mant, c.vocab);
  m->embd_shift = upload(*m, seen, h.embd_shift, c.vocab);
  m->rope_cos = upload(*m, seen, h.rope_cos, c.ctx * half);
  m->rope_sin = upload(*m, seen, h.rope_sin, c.ctx * half);
  upload(*m, seen, h.rope_local_cos, c.ctx * half);  // null unless a block uses the local table
  upload(*m, seen, h.rope_local_sin, c.ctx * half);
  for (const Layer& L : h.layers) {
    DevLayer d;
    d.attn_norm = upload(*m, seen, L.attn_norm, H);
    d.q = upload_linear(*m, seen, L.q);
    d.k = upload_linear(*m, seen, L.k);
    d.v = upload_linear(*m, seen, L.v);
    d.o = upload_linear(*m, seen, L.o);
    d.qk_norm_projection = L.qk_norm_projection;  // q_norm [nh*D], k_norm [nkv*D], else [D]
    d.q_norm = upload(*m, seen, L.q_norm, L.qk_norm_projection ? c.n_heads * c.head_dim : c.head_dim);
    d.k_norm = upload(*m, seen, L.k_norm, L.qk_norm_projection ? c.n_kv * c.head_dim : c.head_dim);
    d.score_mant = L.score_mant;
    d.score_shift = L.score_shift;
    d.attn_softcap = L.attn_softcap;
    d.ffn_norm = upload(*m, seen, L.ffn_norm, H);
    d.gate = upload_linear(*m, seen, L.gate);
    d.up = upload_linear(*m, seen, L.up);
    d.down = upload_linear(*m, seen, L.down);
    d.post_attn_norm = upload(*m, seen, L.post_attn_norm, H);
    d.post_attn_shift = L.post_attn_shift;
    d.post_ffn_norm = upload(*m, seen, L.post_ffn_norm, H);
    d.post_ffn_shift = L.post_ffn_shift;
    d.geglu = L.geglu;
    d.window = L.window;
    d.rope_cos = upload(*m, seen, L.rope_cos, c.ctx * half);  // the tables above: already on the device
    d.rope_sin = upload(*m, seen, L.rope_sin, c.ctx * half);
    if (!L.gate_exps.empty()) {
      d.n_experts = L.router.N;
      d.n_experts_used = L.n_experts_used;
      d.norm_topk = L.norm_topk;
      d.router = upload_linear(*m, seen, L.router);
      d.gate_exps = upload_experts(*m, seen, L.gate_exps);
      d.up_exps = upload_experts(*m, seen, L.up_exps);
      d.down_exps = upload_experts(*m, seen, L.down_exps);
      m->moe_E = std::max(m->moe_E, d.n_experts);
      m->moe_k = std::max(m->moe_k, d.n_experts_used);
      m->moe_F = std::max<int64_t>(m->moe_F, d.gate_exps.N);
    }
    m->layers.push_back(d);
  }
  m->out_norm = upload(*m, seen, h.out_norm, H);
  m->output = upload_linear(*m, seen, h.output);
  m->final_softcap = h.final_softcap;
  // The copies ran on the legacy stream, which the model's non-blocking
  // stream does not wait for (a pageable cudaMemcpy may return before its DMA).
  ck(cudaDeviceSynchronize(), "upload");
  return m;
}

void set_graphs(DeviceModel& m, bool on) {
  if (!on) {
    cudaSetDevice(m.device);
    m.drop_graphs();
  }
  m.use_graphs = on;
}
bool graphs(const DeviceModel& m) { return m.use_graphs; }
int64_t weight_bytes(const DeviceModel& m) { return m.bytes; }

StatePtr new_state(DeviceModel& m, int64_t max_len) {
  if (max_len <= 0 || max_len > m.cfg.ctx) throw std::invalid_argument("max_len must be in [1, context_length]");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  const Config& c = m.cfg;
  StatePtr s(new DeviceState());
  s->device = m.device;
  s->kv.max_len = max_len;
  const size_t rows = (size_t)(c.n_layers * max_len * c.n_kv);
  ck(cudaMalloc(&s->kv.k, rows * (size_t)c.head_dim), "cudaMalloc (KV cache)");
  ck(cudaMalloc(&s->kv.v, rows * (size_t)c.head_dim), "cudaMalloc (KV cache)");
  ck(cudaMalloc(&s->kv.ka, rows * sizeof(int32_t)), "cudaMalloc (KV cache)");
  ck(cudaMalloc(&s->kv.va, rows * sizeof(int32_t)), "cudaMalloc (KV cache)");
  ck(cudaMemset(s->kv.k, 0, rows * (size_t)c.head_dim), "cudaMemset");
  ck(cudaMemset(s->kv.v, 0, rows * (size_t)c.head_dim), "cudaMemset");
  ck(cudaMemset(s->kv.ka, 0, rows * sizeof(int32_t)), "cudaMemset");
  ck(cudaMemset(s->kv.va, 0, rows * sizeof(int32_t)), "cudaMemset");
  ck(cudaDeviceSynchronize(), "cudaMemset");  // legacy stream: finish before the model's stream writes the cache
  return s;
}

int64_t state_max_len(const DeviceState& s) { return s.kv.max_len; }

void copy_prefix(DeviceModel& m, const DeviceState& src, DeviceState& dst, int64_t n) {
  if (src.device != m.device || dst.device != m.device) throw std::invalid_argument("copy_prefix: a state of another device");
  if (n < 0 || n > src.kv.max_len || n > dst.kv.max_len) throw std::invalid_argument("copy_prefix: n outside [0, max_len]");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  if (m.greedy.pending) ck(cudaEventSynchronize(m.greedy.done), "greedy step");  // it may still write src
  const Config& c = m.cfg;
  const size_t rows = (size_t)(n * c.n_kv), D = (size_t)c.head_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const size_t rs = (size_t)(l * src.kv.max_len * c.n_kv), rd = (size_t)(l * dst.kv.max_len * c.n_kv);
    ck(cudaMemcpyAsync(dst.kv.k + rd * D, src.kv.k + rs * D, rows * D, cudaMemcpyDeviceToDevice, m.stream), "copy_prefix");
    ck(cudaMemcpyAsync(dst.kv.v + rd * D, src.kv.v + rs * D, rows * D, cudaMemcpyDeviceToDevice, m.stream), "copy_prefix");
    ck(cudaMemcpyAsync(dst.kv.ka + rd, src.kv.ka + rs, rows * sizeof(int32_t), cudaMemcpyDeviceToDevice, m.stream),
       "copy_prefix");
    ck(cudaMemcpyAsync(dst.kv.va + rd, src.kv.va + rs, rows * sizeof(int32_t), cudaMemcpyDeviceToDevice, m.stream),
       "copy_prefix");
  }
}

namespace {

void forward_rows_impl(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                       int32_t* logits, Trace* trace, const ChunkOpts* opt = nullptr) {
  if (T <= 0) return;
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  // A submitted greedy step still reads the workspace and the pinned row
  // buffers: finish it first (wait_pick still returns it).
  if (m.greedy.pending) ck(cudaEventSynchronize(m.greedy.done), "greedy step");
  for (int64_t i = 0; i < n_states; ++i)
    if (!states[i] || states[i]->device != m.device) throw std::invalid_argument("forward: a state of another device");
  for (int64_t t = 0; t < T; ++t) {
    const Row& r = rows[t];
    if (r.seq < 0 || r.seq >= n_states) throw std::invalid_argument("forward: row of an unknown sequence");
    if (r.pos < 0 || r.pos >= states[r.seq]->kv.max_len) throw std::invalid_argument("sequence longer than the KV cache");
    if (r.token < 0 || r.token >= m.cfg.vocab) throw std::invalid_argument("token id out of range");
  }
  for (int64_t c0 = 0; c0 < T; c0 += kMaxChunkRows) {
    const int64_t n = std::min(kMaxChunkRows, T - c0);
    if (trace) {
      Tracer tr{*trace, m.stream, 0, c0 > 0};
      forward_chunk(m, states, n_states, rows + c0, n, logits, &tr);
    } else {
      forward_chunk(m, states, n_states, rows + c0, n, logits, nullptr, c0 + n == T ? opt : nullptr);
    }
    for (int64_t t = c0; t < c0 + n; ++t)
      if (rows[t].want_logits) logits += m.cfg.vocab;
  }
}

}  // namespace

void forward_rows(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                  int32_t* logits) {
  forward_rows_impl(m, states, n_states, rows, T, logits, nullptr);
}

void forward_rows_traced(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                         int32_t* logits, Trace& trace) {
  trace = Trace{};
  trace.isa = "cuda";
  forward_rows_impl(m, states, n_states, rows, T, logits, &trace);
}

void submit_pick(DeviceModel& m, DeviceState& s, const int32_t* tokens, int64_t T, int64_t start, const Pick& how) {
  GreedyPipe& g = m.greedy;
  if (T <= 0) throw std::invalid_argument("submit_pick: no rows");
  if (how.t_num < 0 || how.t_den <= 0) throw std::invalid_argument("submit_pick: temperature must be >= 0");
  if (how.top_k < 0 || how.p_num <= 0 || how.p_den <= 0 || how.p_num > how.p_den || how.m_num < 0 || how.m_den <= 0 ||
      how.m_num > how.m_den || how.m_den > 1000000)
    throw std::invalid_argument("submit_pick: top-k < 0, top-p outside (0, 1] or min-p outside [0, 1]");
  if (!tokens && (T != 1 || !g.have_pick))
    throw std::invalid_argument("submit_pick: no token was chosen on the device yet (give the tokens)");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  if (g.pending) {  // a step never waited for: its result is dropped
    ck(cudaEventSynchronize(g.done), "greedy step");
    g.pending = false;
  }
  if (!g.done) {
    g.pick.grow(1);
    g.wbuf.grow((size_t)m.cfg.vocab);
    g.best.grow(1);
    g.counter.grow(1);
    ck(cudaMemset(g.best.p, 0, sizeof(unsigned long long)), "cudaMemset");
    ck(cudaMemset(g.counter.p, 0, sizeof(int)), "cudaMemset");
    ck(cudaDeviceSynchronize(), "cudaMemset");  // legacy stream: before the model's stream uses them
    g.h_logits.grow((size_t)(2 * m.cfg.vocab));
    g.h_pick.grow(2);
    ck(cudaEventCreate(&g.done), "cudaEventCreate");
  }
  std::vector<Row> rows((size_t)T);
  for (int64_t t = 0; t < T; ++t) rows[(size_t)t] = Row{0, start + t, tokens ? tokens[t] : 0, t == T - 1};
  g.slot ^= 1;
  g.how = how;
  ChunkOpts opt;
  opt.token_from = tokens ? nullptr : g.pick.p;
  opt.pipe = &g;
  DeviceState* devs[1] = {&s};
  forward_rows_impl(m, devs, 1, rows.data(), T, g.h_logits.p + (int64_t)g.slot * m.cfg.vocab, nullptr, &opt);
  g.pending = true;
  g.have_pick = true;
}

int32_t wait_pick(DeviceModel& m, const int32_t** logits) {
  GreedyPipe& g = m.greedy;
  if (!g.pending) throw std::invalid_argument("wait_pick: no step was submitted");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  ck(cudaEventSynchronize(g.done), "greedy step");
  g.pending = false;
  *logits = g.h_logits.p + (int64_t)g.slot * m.cfg.vocab;
  return g.h_pick.p[g.slot];
}

std::vector<ProfStep> forward_rows_profiled(DeviceModel& m, DeviceState* const* states, int64_t n_states,
                                            const Row* rows, int64_t T, int32_t* logits) {
  if (T > kMaxChunkRows) throw std::invalid_argument("profile: at most 4096 rows");
  Profiler pf;
  m.prof = &pf;
  try {
    forward_rows_impl(m, states, n_states, rows, T, logits, nullptr);
  } catch (...) {
    m.prof = nullptr;
    throw;
  }
  m.prof = nullptr;
  std::vector<ProfStep> out;
  for (size_t i = 1; i < pf.marks.size(); ++i) {
    float ms = 0;  // timing (analysis), not the numerical path
    ck(cudaEventElapsedTime(&ms, pf.marks[i - 1].ev, pf.marks[i].ev), "cudaEventElapsedTime");
    out.push_back({pf.marks[i].name, (int64_t)(ms * 1e6f), pf.marks[i].bytes,
                   pf.marks[i].launches - pf.marks[i - 1].launches});
  }
  return out;
}

// ---------------------------------------------------------------- test entry points

namespace test {
namespace {

template <class T>
T* to_dev(std::vector<void*>& keep, const T* h, int64_t n) {
  void* d = nullptr;
  ck(cudaMalloc(&d, (size_t)std::max<int64_t>(n, 1) * sizeof(T)), "cudaMalloc");
  keep.push_back(d);
  if (h && n) ck(cudaMemcpy(d, h, (size_t)n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<T*>(d);
}

struct Keep {
  std::vector<void*> p;
  ~Keep() {
    for (void* q : p) cudaFree(q);
  }
};

template <class T>
void from_dev(T* h, const T* d, int64_t n) {
  ck(cudaDeviceSynchronize(), "kernel");
  ck(cudaMemcpy(h, d, (size_t)n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace

void argmax(const int32_t* logits, int64_t R, int64_t V, int32_t* out) {
  Keep k;
  const int32_t* d = to_dev(k.p, logits, R * V);
  int32_t* o = to_dev<int32_t>(k.p, nullptr, R);
  unsigned long long* best = to_dev<unsigned long long>(k.p, nullptr, 1);
  int* counter = to_dev<int>(k.p, nullptr, 1);
  ck(cudaMemset(best, 0, sizeof(unsigned long long)), "cudaMemset");
  ck(cudaMemset(counter, 0, sizeof(int)), "cudaMemset");
  for (int64_t r = 0; r < R; ++r) launch_argmax(d + r * V, (int)V, best, counter, o + r, 0);
  from_dev(out, o, R);
}

int32_t sample(const int32_t* logits, int64_t V, const Pick& how) {
  Keep k;
  int32_t* o = to_dev<int32_t>(k.p, nullptr, 1);
  launch_sample(to_dev(k.p, logits, V), (int)V, how.t_num, how.t_den, how.draw, to_dev<int32_t>(k.p, nullptr, V), o, 0,
                SampleCuts{how.top_k, how.p_num, how.p_den, how.m_num, how.m_den});
  int32_t tok = 0;
  from_dev(&tok, o, 1);
  return tok;
}

void linear(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
            const int32_t* shift, const int32_t* bias, int64_t N, int path, int32_t* out) {
  Keep k;
  int32_t* o = to_dev<int32_t>(k.p, nullptr, T * N);
  launch_linear(to_dev(k.p, q, T * K), to_dev(k.p, e, T), (int)T, (int)K, to_dev(k.p, w, N * K), to_dev(k.p, mant, N),
                to_dev(k.p, shift, N), bias ? to_dev(k.p, bias, N) : nullptr, (int)N, o, N, false, path, 0);
  from_dev(out, o, T * N);
}

void linear_w4(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4, const int16_t* gd,
               const int16_t* gm, const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int path,
               int32_t* out) {
  Keep k;
  int32_t* o = to_dev<int32_t>(k.p, nullptr, T * N);
  launch_linear_w4(to_dev(k.p, q, T * K), to_dev(k.p, e, T), (int)T, (int)K, to_dev(k.p, w4, N * (K / 2)),
                   to_dev(k.p, gd, N * (K / 32)), to_dev(k.p, gm, N * (K / 32)), to_dev(k.p, mant, N),
                   to_dev(k.p, shift, N), bias ? to_dev(k.p, bias, N) : nullptr, (int)N, o, N, false, path, 0);
  from_dev(out, o, T * N);
}

void attend(const int32_t* q, int64_t nh, int64_t nkv, int64_t D, const int8_t* kc, const int32_t* ka,
            const int8_t* vc, const int32_t* va, int64_t n, int64_t score_mant, int64_t score_shift, int chunk,
            int64_t* out) {
  Keep k;
  DevKV kv{to_dev(k.p, kc, n * nkv * D), to_dev(k.p, vc, n * nkv * D), to_dev(k.p, ka, n * nkv),
           to_dev(k.p, va, n * nkv), n};
  const int32_t zero = 0, last = (int32_t)(n - 1);
  int64_t* o = to_dev<int64_t>(k.p, nullptr, nh * D);
  AttnScratch sc{to_dev<int32_t>(k.p, nullptr, nh * n), n, to_dev<int64_t>(k.p, nullptr, nh * attn_max_splits(n)),
                 to_dev<int32_t>(k.p, nullptr, nh), to_dev<int>(k.p, nullptr, nkv + 1),
                 to_dev<unsigned long long>(k.p, nullptr, nh * D), 1, attn_max_splits(n)};
  ck(cudaMemset(sc.counters, 0, (size_t)(nkv + 1) * sizeof(int)), "cudaMemset");
  ck(cudaMemset(sc.oacc, 0, (size_t)(nh * D) * sizeof(unsigned long long)), "cudaMemset");
  launch_attention(to_dev(k.p, q, nh * D), 0, 1, (int)nh, (int)nkv, (int)D, 0, to_dev(k.p, &zero, 1),
                   to_dev(k.p, &last, 1), to_dev(k.p, &kv, 1), score_mant, score_shift, sc, o,
                   to_dev<int16_t>(k.p, nullptr, nh * D), to_dev<int32_t>(k.p, nullptr, 1), 0, 0, chunk);
  from_dev(out, o, nh * D);
  // Every launch leaves the counters and P.V sums at zero (graph replays rely on it).
  std::vector<int> c((size_t)(nkv + 1));
  std::vector<unsigned long long> a((size_t)(nh * D));
  from_dev(c.data(), sc.counters, nkv + 1);
  from_dev(a.data(), sc.oacc, nh * D);
  for (int v : c)
    if (v) throw std::logic_error("attention left a counter non-zero");
  for (unsigned long long v : a)
    if (v) throw std::logic_error("attention left its P.V sums non-zero");
}

void attend_rows(const int32_t* q, int64_t T, int64_t nh, int64_t nkv, int64_t D, const int8_t* kc, const int32_t* ka,
                 const int8_t* vc, const int32_t* va, int64_t n, const int32_t* pos, int64_t window,
                 int64_t score_mant, int64_t score_shift, int path, int64_t* out, int16_t* act, int32_t* act_e) {
  Keep k;
  DevKV kv{to_dev(k.p, kc, n * nkv * D), to_dev(k.p, vc, n * nkv * D), to_dev(k.p, ka, n * nkv),
           to_dev(k.p, va, n * nkv), n};
  const std::vector<int32_t> seq((size_t)T, 0);
  const int64_t sstride = (n + 255) / 256 * 256;
  AttnScratch sc{to_dev<int32_t>(k.p, nullptr, T * nh * sstride), sstride,
                 to_dev<int64_t>(k.p, nullptr, T * nh * attn_max_splits(sstride)), to_dev<int32_t>(k.p, nullptr, T * nh),
                 to_dev<int>(k.p, nullptr, T * (nkv + 1)), to_dev<unsigned long long>(k.p, nullptr, T * nh * D), T,
                 attn_max_splits(sstride)};
  ck(cudaMemset(sc.counters, 0, (size_t)(T * (nkv + 1)) * sizeof(int)), "cudaMemset");
  ck(cudaMemset(sc.oacc, 0, (size_t)(T * nh * D) * sizeof(unsigned long long)), "cudaMemset");
  int64_t* o = to_dev<int64_t>(k.p, nullptr, T * nh * D);
  int16_t* a = to_dev<int16_t>(k.p, nullptr, T * nh * D);
  int32_t* ae = to_dev<int32_t>(k.p, nullptr, T);
  launch_attention(to_dev(k.p, q, T * nh * D), 0, (int)T, (int)nh, (int)nkv, (int)D, 0, to_dev(k.p, seq.data(), T),
                   to_dev(k.p, pos, T), to_dev(k.p, &kv, 1), score_mant, score_shift, sc, o, a, ae, 0, window, 0, path);
  from_dev(out, o, T * nh * D);
  from_dev(act, a, T * nh * D);
  from_dev(act_e, ae, T);
}

void norm_quant16(const int32_t* x, const int16_t* g, int64_t R, int64_t n, int64_t eps_q60, int16_t* q, int32_t* e) {
  Keep k;
  int16_t* dq = to_dev<int16_t>(k.p, nullptr, R * n);
  int32_t* de = to_dev<int32_t>(k.p, nullptr, R);
  launch_norm_quant16(to_dev(k.p, x, R * n), nullptr, to_dev(k.p, g, n), (int)R, (int)n, eps_q60, 16, dq, de, 0);
  from_dev(q, dq, R * n);
  from_dev(e, de, R);
}

void swiglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a) {
  Keep k;
  int64_t* da = to_dev<int64_t>(k.p, nullptr, count);
  launch_swiglu(to_dev(k.p, g, count), to_dev(k.p, u, count), count, da, 0);
  from_dev(a, da, count);
}

void geglu(const int32_t* g, const int32_t* u, int64_t count, int64_t* a) {
  Keep k;
  int64_t* da = to_dev<int64_t>(k.p, nullptr, count);
  launch_geglu(to_dev(k.p, g, count), to_dev(k.p, u, count), count, da, 0);
  from_dev(a, da, count);
}

void round_div(const int64_t* a, const int64_t* b, int64_t count, int64_t* out) {
  Keep k;
  int64_t* d = to_dev<int64_t>(k.p, nullptr, count);
  launch_round_div(to_dev(k.p, a, count), to_dev(k.p, b, count), count, d, 0);
  from_dev(out, d, count);
}

int64_t div_bench(const int64_t* a, const int64_t* b, int64_t count, int reps, int mode, int64_t* out) {
  Keep k;
  int64_t* d = to_dev<int64_t>(k.p, nullptr, count);
  const int64_t* da = to_dev(k.p, a, count);
  const int64_t* db = to_dev(k.p, b, count);
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "cudaEventCreate");
  ck(cudaEventCreate(&e1), "cudaEventCreate");
  ck(cudaEventRecord(e0, 0), "cudaEventRecord");
  launch_div_bench(da, db, count, reps, mode, d, 0);
  ck(cudaEventRecord(e1, 0), "cudaEventRecord");
  ck(cudaEventSynchronize(e1), "cudaEventSynchronize");
  float ms = 0;  // timing (analysis), not the numerical path
  ck(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  from_dev(out, d, count);
  return (int64_t)(ms * 1e6f);
}

void set_gemv_split(int wlg) { set_gemv_split_override(wlg); }
void set_attn_path(int path) { set_attn_path_override(path); }

}  // namespace test

}  // namespace cuda
}  // namespace intdet
