// The CUDA engine's weight upload and device state: the device model
// (every tensor of the host model, tied ones once), KV caches, the prefix
// copy, and the device queries.
#include "engine_state.h"

#include <cstdlib>

namespace intdet {
namespace cuda {

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
  {  // decode GEMVs with programmatic dependent launch on sm_90+ (INTDET_CUDA_PDL=0: off, for A/B timing)
    cudaDeviceProp p{};
    ck(cudaGetDeviceProperties(&p, m->device), "cudaGetDeviceProperties");
    const char* env = std::getenv("INTDET_CUDA_PDL");
    set_gemv_pdl(p.major >= 9 && !(env && std::string(env) == "0"));
  }
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

}  // namespace cuda
}  // namespace intdet
