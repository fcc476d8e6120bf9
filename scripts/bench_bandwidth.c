// Read bandwidth of this machine: T threads each sum their part of a 1 GiB
// buffer of 64-bit words as S streams at once (one stream per core leaves
// the memory idle between misses; a GEMV reads many rows together), best of
// R rounds, in bytes per second on stdout. The bound a batch-1 decode, which streams every weight once per
// token, can reach (scripts/bench_scale.py).
//   cc -O3 -march=native -fopenmp scripts/bench_bandwidth.c -o bench_bandwidth && ./bench_bandwidth 2
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 1;
  const int R = argc > 2 ? atoi(argv[2]) : 5;
  const size_t n = ((size_t)1 << 30) / sizeof(uint64_t);
  uint64_t* a = aligned_alloc(64, n * sizeof(uint64_t));
  if (!a) return 1;
  for (size_t i = 0; i < n; ++i) a[i] = i;  // touch every page
  double best = 0;
  uint64_t sink = 0;
  for (int r = 0; r < R; ++r) {
    const double t0 = now();
    uint64_t total = 0;
    enum { S = 4 };
    const size_t per = n / ((size_t)T * S);  // words per stream
#pragma omp parallel for num_threads(T) reduction(+ : total) schedule(static)
    for (int t = 0; t < T; ++t) {
      const uint64_t* base = a + (size_t)t * S * per;
      uint64_t acc[S] = {0};
      for (size_t i = 0; i < per; i += 8)
        for (int s = 0; s < S; ++s)
          for (int j = 0; j < 8; ++j) acc[s] += base[(size_t)s * per + i + j];
      for (int s = 0; s < S; ++s) total += acc[s];
    }
    const double dt = now() - t0;
    sink += total;
    if (n * sizeof(uint64_t) / dt > best) best = n * sizeof(uint64_t) / dt;
  }
  printf("%.0f\n", best);
  fprintf(stderr, "checksum %llu\n", (unsigned long long)sink);
  free(a);
  return 0;
}
