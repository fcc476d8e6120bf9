// The CUDA engine's op-level entry points for the tests (engine.h
// namespace test): host arrays in, one kernel launch, host arrays out.
#include "engine_state.h"

namespace intdet {
namespace cuda {

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
            const int32_t* shift, const int32_t* bias, int64_t N, int path, int32_t* out, const int32_t* init) {
  Keep k;
  int32_t* o = to_dev<int32_t>(k.p, init, T * N);
  GemmScratch sc{to_dev<unsigned long long>(k.p, nullptr, kSkinnyPartElems), to_dev<int>(k.p, nullptr, kSkinnyPartTiles)};
  ck(cudaMemset(sc.part, 0, (size_t)kSkinnyPartElems * sizeof(unsigned long long)), "cudaMemset");
  ck(cudaMemset(sc.counters, 0, (size_t)kSkinnyPartTiles * sizeof(int)), "cudaMemset");
  launch_linear(to_dev(k.p, q, T * K), to_dev(k.p, e, T), (int)T, (int)K, to_dev(k.p, w, N * K), to_dev(k.p, mant, N),
                to_dev(k.p, shift, N), bias ? to_dev(k.p, bias, N) : nullptr, (int)N, o, N, init != nullptr, path, 0,
                &sc);
  from_dev(out, o, T * N);
  // The skinny GEMM's split-K scratch is left zero (graph replays rely on it).
  std::vector<unsigned long long> part((size_t)kSkinnyPartElems);
  std::vector<int> cnt((size_t)kSkinnyPartTiles);
  from_dev(part.data(), sc.part, kSkinnyPartElems);
  from_dev(cnt.data(), sc.counters, kSkinnyPartTiles);
  for (unsigned long long v : part)
    if (v) throw std::logic_error("linear left a split-K partial sum non-zero");
  for (int v : cnt)
    if (v) throw std::logic_error("linear left a split-K counter non-zero");
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
                   to_dev<int16_t>(k.p, nullptr, nh * D), to_dev<int32_t>(k.p, nullptr, 1), 0, 0, chunk,
                   chunk > 0 ? kAttnSplit : kAttnAuto);
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
                 attn_max_splits(sstride), n};
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

void gemv_prologue(int kind, const int32_t* x, const int16_t* g, int64_t eps_q60,
                   int in_frac, const int64_t* a, int64_t T, int64_t K, const int8_t* w, const int32_t* mant,
                   const int32_t* shift, const int32_t* bias, int64_t N, int32_t* out) {
  if ((kind != kGemvNorm && kind != kGemvQuant) || !gemv_prologue_fits(kind, (int)T, (int)K))
    throw std::invalid_argument("gemv_prologue: kind 1 or 2, at most 2 rows that fit in shared memory");
  Keep k;
  int32_t* o = to_dev<int32_t>(k.p, nullptr, T * N);
  GemvIn in{};
  in.kind = kind;
  if (kind == kGemvNorm) {
    in.x = to_dev(k.p, x, T * K);
    in.g = to_dev(k.p, g, K);
    in.eps_q60 = eps_q60;
    in.in_frac = in_frac;
  } else {
    in.a = to_dev(k.p, a, T * K);
  }
  GemvSegs s{};
  s.s[0] = GemvSeg{to_dev(k.p, w, N * K), to_dev(k.p, mant, N), to_dev(k.p, shift, N),
                   bias ? to_dev(k.p, bias, N) : nullptr, o, N, (int)N, 0};
  s.n = 1;
  launch_gemv(nullptr, nullptr, (int)T, (int)K, s, false, 0, in);
  from_dev(out, o, T * N);
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
void set_skinny_split(int splits) { set_skinny_split_override(splits); }
void set_prefill_gemm(int path) { set_prefill_gemm_override(path); }
void set_attn_path(int path) { set_attn_path_override(path); }
void set_emu_stream_order(bool latest_first) {
#if defined(INTDET_CUDA_EMU)
  ::emu::set_stream_order(latest_first);
#else
  (void)latest_first;
  throw std::invalid_argument("set_emu_stream_order: the host emulator only");
#endif
}

}  // namespace test

}  // namespace cuda
}  // namespace intdet
