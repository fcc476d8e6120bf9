// Microbenchmark: the amx set's prefill linear (Kernels::planes: the
// activation split, then the AMX tiles on q16-packed weights) against the
// avx512 set's packed linear (VNNI, g8 weights) on one [N, K] weight that
// stays in cache, T rows, one thread, channel blocks of `block` per call.
// Prints min-of-7 times, GMAC/s and whether both sets gave the same outputs.
// Build against a build tree's library (see bench_attend_layer.cpp):
//
//   g++ -O2 -std=c++20 -ITREE/csrc/include scripts/bench_amx_linear.cpp
//       TREE/build/<wheel tag>/libintdet_core.a -fopenmp -o /tmp/bench_amx_linear   (one line)
//   /tmp/bench_amx_linear [T=512] [K=576] [N=1536] [block=N]
//
// Needs a CPU with AMX-INT8 (kernel_set("amx") throws otherwise).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "intdet/kernels.h"

using namespace intdet;

int main(int argc, char** argv) {
  const Kernels& amx = kernel_set("amx");
  const Kernels& vnni = kernel_set("avx512");
  const int64_t T = argc > 1 ? atoll(argv[1]) : 512, K = argc > 2 ? atoll(argv[2]) : 576;
  const int64_t N = argc > 3 ? atoll(argv[3]) : 1536, blk = argc > 4 ? atoll(argv[4]) : N;
  if (T < 1 || K < 1 || N < 16 || blk < 16 || blk % 16) {
    fprintf(stderr, "usage: bench_amx_linear [T>=1] [K>=1] [N>=16] [block: multiple of 16]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::vector<int8_t> w((size_t)(N * K));
  for (auto& x : w) x = (int8_t)((int)(rng() % 255) - 127);
  std::vector<int16_t> q((size_t)(T * K));
  for (auto& x : q) x = (int16_t)((int)(rng() % 65535) - 32767);
  std::vector<int32_t> e((size_t)T, 3), mant((size_t)N, 1000), shift((size_t)N, 30);
  std::vector<int8_t> wq((size_t)amx.packing->w8.size(N, K)), wg((size_t)vnni.packing->w8.size(N, K));
  amx.packing->w8.pack(w.data(), N, K, wq.data());
  vnni.packing->w8.pack(w.data(), N, K, wg.data());
  const int64_t ld = amx.planes.ld(K), rows = (T + kPlaneRows - 1) / kPlaneRows * kPlaneRows;
  std::vector<int8_t> hi((size_t)(rows * ld));
  std::vector<uint8_t> lo((size_t)(rows * ld));
  std::vector<int64_t> out_amx((size_t)(T * N)), out_vnni((size_t)(T * N));
  auto best_of = [](auto f) {
    double best = 1e9;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double ts = best_of([&] {
    for (int64_t t = 0; t < T; ++t) amx.planes.split_row(q.data() + t * K, K, hi.data() + t * ld, lo.data() + t * ld);
  });
  const double ta = best_of([&] {
    for (int64_t j = 0; j < N; j += blk)
      amx.planes.linear(hi.data(), lo.data(), ld, e.data(), T, K, wq.data() + j * amx.packing->w8.channel_bytes(K),
                        mant.data() + j, shift.data() + j, nullptr, std::min(blk, N - j), out_amx.data() + j, N);
  });
  const double tv = best_of([&] {
    for (int64_t j = 0; j < N; j += blk)
      vnni.linear_packed(q.data(), e.data(), T, K, wg.data() + j * vnni.packing->w8.channel_bytes(K), mant.data() + j,
                         shift.data() + j, nullptr, std::min(blk, N - j), out_vnni.data() + j, N);
  });
  const double mac = (double)T * K * N;
  printf("T=%ld K=%ld N=%ld block=%ld: split %.3f ms; amx %.3f ms (%.0f GMAC/s); avx512 %.3f ms (%.0f GMAC/s); "
         "same outputs: %s\n",
         (long)T, (long)K, (long)N, (long)blk, ts * 1e3, ta * 1e3, mac / ta / 1e9, tv * 1e3, mac / tv / 1e9,
         out_amx == out_vnni ? "yes" : "NO");
  return out_amx == out_vnni ? 0 : 1;
}
