// Microbenchmark: the kernel set's packed int8 linear layer (Kernels::linear_packed,
// the forward's own kernel) on `mats` copies of one [N, K] weight, so the copies
// together exceed the caches (72 x 1536 x 576 = 64 MB: weights from DRAM, as in
// decode) or fit them (mats = 1). Prints, min of 9 runs:
//   1. one thread, channel blocks of `block` per call (the forward's decode
//      split), T = 1, 2, 4, 6, 8, 12, 16, 32 rows: GMAC/s and weight GB/s;
//   2. the same at T = `rows` on the forward's pool (intdet/pool.h) with 2
//      threads and blocks of 16..256 channels, and with two fixed halves.
// Build against a build tree's library (see bench_attend_layer.cpp):
//
//   g++ -O2 -std=c++20 -ITREE/csrc/include scripts/bench_linear.cpp
//       TREE/build/<wheel tag>/libintdet_core.a -fopenmp -o /tmp/bench_linear   (one line)
//   /tmp/bench_linear [ISA=avx2] [N=1536] [K=576] [mats=72] [block=64] [rows=1]
//
// The last line hashes the outputs: every build and set must print the same one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "intdet/kernels.h"
#include "intdet/pool.h"

using namespace intdet;

int main(int argc, char** argv) {
  const Kernels& k = kernel_set(argc > 1 ? argv[1] : "avx2");
  const int64_t N = argc > 2 ? atoll(argv[2]) : 1536, K = argc > 3 ? atoll(argv[3]) : 576;
  const int mats = argc > 4 ? atoi(argv[4]) : 72;
  const int64_t block = argc > 5 ? atoll(argv[5]) : 64;
  const int rows = argc > 6 ? atoi(argv[6]) : 1;
  if (!k.linear_packed || N < 16 || K < 1 || mats < 1 || block < 16 || block % 16 || rows < 1 || rows > 64) {
    fprintf(stderr, "usage: bench_linear [ISA with a packed linear] [N>=16] [K>=1] [mats>=1] [block: multiple of 16] [rows 1..64]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::vector<int8_t> w((size_t)(N * K));
  for (auto& x : w) x = (int8_t)((int)(rng() % 255) - 127);
  const int64_t psz = k.packing->w8.size(N, K), cb = k.packing->w8.channel_bytes(K);
  std::vector<std::vector<int8_t>> P((size_t)mats, std::vector<int8_t>((size_t)psz));
  for (auto& p : P) k.packing->w8.pack(w.data(), N, K, p.data());
  std::vector<int32_t> mant((size_t)N, 1 << 20), shift((size_t)N, 20), e(64, 3);
  std::vector<int16_t> q((size_t)(64 * K));
  for (auto& x : q) x = (int16_t)((int)(rng() % 65535) - 32767);
  std::vector<int64_t> out((size_t)(64 * N));
  auto call = [&](int m, int T, int64_t j0, int64_t j1) {
    k.linear_packed(q.data(), e.data(), T, K, P[(size_t)m].data() + j0 * cb, mant.data() + j0, shift.data() + j0,
                    nullptr, j1 - j0, out.data() + j0, N);
  };
  auto best_of = [](auto&& body) {
    double best = 1e30;
    for (int rep = 0; rep < 9; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double wbytes = (double)N * K * mats;
  printf("%s N %lld K %lld, %d copies (%.1f MB), blocks of %lld\n", k.name, (long long)N, (long long)K, mats,
         wbytes / 1e6, (long long)block);
  for (int T : {1, 2, 4, 6, 8, 12, 16, 32}) {
    const double s = best_of([&] {
      for (int m = 0; m < mats; ++m)
        for (int64_t j = 0; j < N; j += block) call(m, T, j, std::min(N, j + block));
    });
    printf("1 thread  T %2d: %8.3f ms  %5.1f GMAC/s  %5.1f GB/s of weights\n", T, s * 1e3, T * wbytes / s / 1e9,
           wbytes / s / 1e9);
  }
  for (int64_t B : {16, 32, 64, 128, 256}) {
    const double s = best_of([&] {
      for (int m = 0; m < mats; ++m)
        parallel_tasks(2, (N + B - 1) / B, [&](int64_t b) { call(m, rows, b * B, std::min(N, (b + 1) * B)); });
    });
    printf("2 threads T %2d, pool blocks of %3lld: %8.3f ms  %5.1f GB/s\n", rows, (long long)B, s * 1e3, wbytes / s / 1e9);
  }
  const double s = best_of([&] {
    for (int m = 0; m < mats; ++m)
      parallel_tasks(2, 2, [&](int64_t h) {
        const int64_t a = h * N / 2 / 16 * 16, z = h ? N : N / 2 / 16 * 16;
        for (int64_t j = a; j < z; j += block) call(m, rows, j, std::min(z, j + block));
      });
  });
  printf("2 threads T %2d, two fixed halves:     %8.3f ms  %5.1f GB/s\n", rows, s * 1e3, wbytes / s / 1e9);
  long long h = 0;
  for (auto x : out) h = h * 31 + x;
  printf("hash %lld\n", h);
}
