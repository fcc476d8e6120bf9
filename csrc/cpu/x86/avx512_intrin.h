// The intrinsics of the AVX-512 kernel files: the compiler's own
// (<immintrin.h>, with -mavx512f -mavx512bw -mavx512vl -mavx512vnni), or,
// in the test-only build (-DINTDET_AVX512_SIMDE, CMakeLists.txt), SIMDe's
// portable versions under the same names, so the very same kernel source
// runs on CPUs without AVX-512 and is compared bit for bit with the scalar set.
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and warn
// "may be used uninitialized" wherever they are inlined (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(INTDET_AVX512_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

// Intrinsics SIMDe (0.8.2) lacks, composed from two 256-bit halves exactly
// as Intel defines them (sign or zero extension of each element). Only this
// test build uses them; the native build has the real instructions.
inline simde__m512i intdet_simde_cvtepu8_epi16(simde__m256i a) {
  return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(simde_mm256_cvtepu8_epi16(simde_mm256_castsi256_si128(a))),
                                 simde_mm256_cvtepu8_epi16(simde_mm256_extracti128_si256(a, 1)), 1);
}
inline simde__m512i intdet_simde_cvtepi32_epi64(simde__m256i a) {
  return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(simde_mm256_cvtepi32_epi64(simde_mm256_castsi256_si128(a))),
                                 simde_mm256_cvtepi32_epi64(simde_mm256_extracti128_si256(a, 1)), 1);
}
// vpsravq: each int64 lane shifted right arithmetically by its count (a
// count above 63 fills with the sign bit), lane by lane as Intel defines it.
inline simde__m512i intdet_simde_srav_epi64(simde__m512i a, simde__m512i count) {
  simde__m512i_private r, x = simde__m512i_to_private(a), c = simde__m512i_to_private(count);
  for (int i = 0; i < 8; ++i) {
    const uint64_t n = (uint64_t)c.i64[i];
    r.i64[i] = n > 63 ? (x.i64[i] < 0 ? -1 : 0) : (x.i64[i] >> n);
  }
  return simde__m512i_from_private(r);
}
#undef _mm512_cvtepu8_epi16
#undef _mm512_cvtepi32_epi64
#undef _mm512_srav_epi64
#define _mm512_cvtepu8_epi16 intdet_simde_cvtepu8_epi16
#define _mm512_cvtepi32_epi64 intdet_simde_cvtepi32_epi64
#define _mm512_srav_epi64 intdet_simde_srav_epi64
#else
#include <immintrin.h>
#endif
