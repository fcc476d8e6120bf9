// Microbenchmark: one core's peak int16 multiply-accumulate rate on the
// instructions the x86 kernel sets could use, register-only (12 independent
// accumulators, no loads), 3 rounds:
//   vpdpwssd zmm           AVX512-VNNI (the avx512 set's GEMM)
//   vpdpwssd ymm           the 256-bit EVEX form (AVX512-VL + VNNI): the same
//                          operation as AVX-VNNI's VEX vpdpwssd, so it tells
//                          what a 256-bit VNNI set would gain on this core
//   vpmaddwd + vpaddd ymm  the avx2 set's GEMM
// GMAC/s counts int16 x int16 products.
//
//   gcc -O2 -mavx2 -mavx512f -mavx512vl -mavx512vnni scripts/bench_peak_mac.c -o /tmp/bench_peak_mac
//   /tmp/bench_peak_mac
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEPS 16666667L  // x 12 accumulators per loop

int main(void) {
  for (int round = 0; round < 3; round++) {
    {
      __m512i a[12];
      __m512i x = _mm512_set1_epi16(3), w = _mm512_set1_epi16(5);
      for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
      const double t0 = now();
      for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpwssd_epi32(a[i], x, w);
        __asm__ volatile("" : "+v"(x));  // x may change: nothing is hoisted
      }
      const double t = now() - t0;
      int s = 0;
      for (int i = 0; i < 12; i++) s += _mm_cvtsi128_si32(_mm512_castsi512_si128(a[i]));
      printf("vpdpwssd zmm           %6.1f GMAC/s (%d)\n", STEPS * 12 * 32.0 / t / 1e9, s & 1);
    }
    {
      __m256i a[12];
      __m256i x = _mm256_set1_epi16(3), w = _mm256_set1_epi16(5);
      for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(i);
      const double t0 = now();
      for (long n = 0; n < STEPS; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_dpwssd_epi32(a[i], x, w);
        __asm__ volatile("" : "+v"(x));
      }
      const double t = now() - t0;
      int s = 0;
      for (int i = 0; i < 12; i++) s += _mm_cvtsi128_si32(_mm256_castsi256_si128(a[i]));
      printf("vpdpwssd ymm           %6.1f GMAC/s (%d)\n", STEPS * 12 * 16.0 / t / 1e9, s & 1);
    }
    {
      __m256i a[12];
      const __m256i w = _mm256_set1_epi16(5);
      for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(i);
      const double t0 = now();
      for (long n = 0; n < STEPS; n++) {
        // each product reads its own accumulator, so none is common to two
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(a[i], w));
      }
      const double t = now() - t0;
      int s = 0;
      for (int i = 0; i < 12; i++) s += _mm_cvtsi128_si32(_mm256_castsi256_si128(a[i]));
      printf("vpmaddwd + vpaddd ymm  %6.1f GMAC/s (%d)\n", STEPS * 12 * 16.0 / t / 1e9, s & 1);
    }
  }
  return 0;
}
