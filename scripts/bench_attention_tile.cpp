// Microbenchmark: one attention tile's passes (csrc/model/attention.cpp,
// docs/long-context.md) at SmolLM2-135M's shape: `rows` query rows (default
// 30: 10 positions x 3 query heads of one KV group, a prefill tile; 3: one
// decode row's tile), head size 64, `span` keys; min of N runs per pass, in
// the driver's order (qk_tile, the AttnRowFns passes, pv_tile).
//
//   g++ -O2 -std=c++20 -Icsrc/include scripts/bench_attention_tile.cpp \
//       build/<wheel tag>/libintdet_core.a -fopenmp -o /tmp/bench_attention_tile
//   /tmp/bench_attention_tile [ISA=avx2] [span=2048] [N=21] [rows=30, at most 64] [copies=1]
//
// copies > 1: that many K/V caches, a different one each run, so with
// enough of them (> L3) every tile reads its keys and values from DRAM, as
// a decode step does (each row is its own sequence in decompression).
// The last line hashes the P.V output: every set must print the same one.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <string>
#include "intdet/kernels.h"
#include "intdet/ops.h"
#include "intdet/intmath.h"
using namespace intdet;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const char* isa = argc > 1 ? argv[1] : "avx2";
  const int64_t span = argc > 2 ? atoll(argv[2]) : 2048;
  const int N = argc > 3 ? atoi(argv[3]) : 21;
  const Kernels& ks = kernel_set(isa);
  const int64_t nkv = 3, D = 64, R = argc > 4 ? atoll(argv[4]) : 30;
  const int64_t st = D;  // the head-major KV cache (KVCache: [n_kv, cap, D] per layer): a head's keys are consecutive
  const int64_t copies = argc > 5 ? atoll(argv[5]) : 1;
  if (R < 1 || R > 64 || span < 16 || N < 1 || copies < 1) {
    fprintf(stderr, "usage: bench_attention_tile [ISA] [span >= 16] [N >= 1] [rows 1..64] [copies >= 1]\n");
    return 2;
  }
  std::mt19937_64 rng(1);
  std::vector<int8_t> kall(copies * span * st), vall(copies * span * st);
  std::vector<int32_t> ka(span * nkv), va(span * nkv);
  for (auto& x : kall) x = (int8_t)((int)(rng() % 255) - 127);
  for (auto& x : vall) x = (int8_t)((int)(rng() % 255) - 127);
  for (auto& x : ka) x = (int32_t)(rng() % (1 << 21)) + 1;
  for (auto& x : va) x = (int32_t)(rng() % (1 << 21)) + 1;
  std::vector<int64_t> q64(R * D);
  for (auto& x : q64) x = (int64_t)(rng() % (1 << 23)) - (1 << 22);
  std::vector<int16_t> q(R * D); std::vector<int32_t> e_q(R);
  for (int r = 0; r < R; ++r) e_q[r] = ks.quant16(q64.data() + r * D, D, q.data() + r * D);
  std::vector<int64_t> z(R * span), zs(R * span), out(R * D);
  std::vector<int16_t> w16(R * span);
  std::vector<int64_t> lo(R, 0), hi(R);
  for (int r = 0; r < R; ++r) hi[r] = span - 9 + r / 3;  // causal: the tile's last rows read the most keys
  double best[7]; for (auto& b : best) b = 1e9;
  std::vector<double> totals;  // every run's whole tile, for the median
  int64_t mxs[64], tots[64], pmx[64];
  for (int it = 0; it < N; ++it) {
    const int8_t* k = kall.data() + (it % copies) * span * st;  // copy 0 every run when copies == 1
    const int8_t* v = vall.data() + (it % copies) * span * st;
    double t0 = now();
    ks.qk_tile(q.data(), e_q.data(), R, k, ka.data(), span, st, D, 23170, 47, z.data(), span);
    double t1 = now();
    std::vector<int32_t> vz(span); for (int64_t i = 0; i < span; ++i) vz[i] = va[i * nkv];
    for (int r = 0; r < R; ++r) mxs[r] = ks.attn_row.max(z.data() + r * span + lo[r], hi[r] - lo[r]);
    double t2 = now();
    for (int r = 0; r < R; ++r) tots[r] = ks.attn_row.exp_sum(z.data() + r * span + lo[r], hi[r] - lo[r], mxs[r]);
    double t3 = now();
    for (int r = 0; r < R; ++r) pmx[r] = ks.attn_row.prob_max(z.data() + r * span + lo[r], hi[r] - lo[r], ((int64_t)1 << 62) / tots[r], vz.data() + lo[r]);
    double t4 = now();
    for (int r = 0; r < R; ++r) { const int e = (int)imax(bitlen(pmx[r]) - 15, 0); int16_t* w = w16.data() + r * span;
      ks.attn_row.prob_w16(z.data() + r * span + lo[r], hi[r] - lo[r], ((int64_t)1 << 62) / tots[r], vz.data() + lo[r], e, w + lo[r]);
      for (int64_t i = hi[r]; i < span; ++i) w[i] = 0; }
    double t5 = now();
    for (auto& x : out) x = 0;
    ks.pv_tile(w16.data(), span, R, v, span, st, D, out.data());
    double t6 = now();
    double d[6] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5};
    for (int j = 0; j < 6; ++j) best[j] = std::min(best[j], d[j]);
    best[6] = std::min(best[6], t6 - t0);
    totals.push_back(t6 - t0);
  }
  const char* nm[7] = {"qk_tile", "rowmax", "exp+sum", "weights", "w16", "pv_tile", "total"};
  double tot = 0; for (int j = 0; j < 6; ++j) tot += best[j];
  for (int j = 0; j < 7; ++j) printf("%-8s %8.1f us  %5.1f%%  %6.2f ns/(row*key)\n", nm[j], best[j] * 1e6, 100 * best[j] / tot, best[j] * 1e9 / (R * span));
  std::sort(totals.begin(), totals.end());
  printf("median   %8.1f us (whole tile, %d runs)\n", totals[totals.size() / 2] * 1e6, N);
  int64_t h = 0; for (auto x : out) h = h * 31 + x; printf("hash %lld\n", (long long)h);
}
