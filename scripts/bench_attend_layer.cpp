// Microbenchmark: one layer's prefill attention (attend_layer, the forward's
// own driver, csrc/model/attention.cpp) at SmolLM2-135M's shape (9 query
// heads, 3 KV heads, head size 64) for a piece of `rows` rows (default 512,
// a prefill piece; 1: a decode step) ending at position `ctx`; min of N runs, at `threads` threads. Build it
// against two libraries (e.g. main's and a branch's build trees, each with
// its own csrc/include) and run them alternately to compare:
//
//   g++ -O2 -std=c++20 -ITREE/csrc/include scripts/bench_attend_layer.cpp \
//       TREE/build/<wheel tag>/libintdet_core.a -fopenmp -o /tmp/bench_attend_layer
//   /tmp/bench_attend_layer [ISA=avx2] [ctx=4096] [threads=2] [N=9] [rows=512]
//
// The last line hashes the output: every build and set must print the same one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "intdet/attention.h"
#include "intdet/kernels.h"
#include "intdet/model.h"

using namespace intdet;

int main(int argc, char** argv) {
  const char* isa = argc > 1 ? argv[1] : "avx2";
  const int64_t ctx = argc > 2 ? atoll(argv[2]) : 4096;
  const int threads = argc > 3 ? atoi(argv[3]) : 2;
  const int N = argc > 4 ? atoi(argv[4]) : 9;
  const int64_t nh = 9, nkv = 3, D = 64, T = std::min<int64_t>(argc > 5 ? atoll(argv[5]) : 512, ctx);
  Model m;
  m.cfg.n_layers = 1;
  m.cfg.n_heads = nh;
  m.cfg.n_kv = nkv;
  m.cfg.head_dim = D;
  m.layers.resize(1);
  m.layers[0].score_mant = 23170;
  m.layers[0].score_shift = 47;
  KVCache kv;
  kv.init(m, ctx);
  std::mt19937_64 rng(7);
  for (auto& x : kv.k) x = (int8_t)((int)(rng() % 255) - 127);
  for (auto& x : kv.v) x = (int8_t)((int)(rng() % 255) - 127);
  for (auto& x : kv.ka) x = (int32_t)(rng() % (1 << 21)) + 1;
  for (auto& x : kv.va) x = (int32_t)(rng() % (1 << 21)) + 1;
  std::vector<Row> rows((size_t)T);
  for (int64_t t = 0; t < T; ++t) rows[t] = Row{0, ctx - T + t, 0, false};
  std::vector<int64_t> q((size_t)(T * nh * D)), o(q.size());
  for (auto& x : q) x = (int64_t)(rng() % (1 << 23)) - (1 << 22);
  set_num_threads(threads);
  const int nt = forward_threads();
  KVCache* caches[1] = {&kv};
  double best = 1e9;
  for (int it = 0; it < N; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    attend_layer(nt, kernel_set(isa), m, 0, caches, rows.data(), T, q.data(), o.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  int64_t h = 0;
  for (auto x : o) h = h * 31 + x;
  printf("%s ctx %lld rows %lld threads %d: %.3f ms (min of %d)\nhash %lld\n", isa, (long long)ctx, (long long)T,
         nt, best * 1e3, N, (long long)h);
}
