// Can this CPU run the AVX-512 kernel set (avx512.cpp)? Compiled without ISA
// flags: it runs before any AVX-512 code, on every x86-64 CPU. In the
// test-only SIMDe build (INTDET_AVX512_SIMDE) the set is emulated with AVX2.
#include <cstdint>

#include "avx512.h"

#if !defined(INTDET_AVX512_SIMDE) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace intdet {
namespace {

// Whether CPUID and XCR0 allow the set: AVX2 (the kernels it shares with the
// AVX2 set), AVX512F, AVX512BW, AVX512VL, AVX512_VNNI, and an OS that saves
// the XMM, YMM, opmask and both ZMM state components (XCR0 bits 1, 2, 5, 6,
// 7; Intel SDM vol. 1, 15.2). Pure, so the decision is checked below.
constexpr uint32_t kOsxsave = 1u << 27;                                                      // CPUID.1:ECX
constexpr uint32_t kLeaf7Ebx = (1u << 5) | (1u << 16) | (1u << 30) | (1u << 31);  // AVX2, F, BW, VL
constexpr uint32_t kVnni = 1u << 11;                                                         // CPUID.7.0:ECX
constexpr uint64_t kZmmState = 0xE6;                                                         // XCR0
constexpr bool avx512_usable(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint32_t leaf7_ecx, uint64_t xcr0) {
  return (leaf1_ecx & kOsxsave) && (xcr0 & kZmmState) == kZmmState && (leaf7_ebx & kLeaf7Ebx) == kLeaf7Ebx &&
         (leaf7_ecx & kVnni);
}
static_assert(avx512_usable(kOsxsave, kLeaf7Ebx, kVnni, 0xE7));
static_assert(!avx512_usable(kOsxsave, kLeaf7Ebx, kVnni, 0x07));  // the OS saves no ZMM/opmask state
static_assert(!avx512_usable(kOsxsave, kLeaf7Ebx, kVnni, 0x67));  // nor ZMM16-31
static_assert(!avx512_usable(0, kLeaf7Ebx, kVnni, 0xE7));         // no XGETBV
static_assert(!avx512_usable(kOsxsave, kLeaf7Ebx, 0, 0xE7));      // no VNNI (Skylake-SP)
static_assert(!avx512_usable(kOsxsave, kLeaf7Ebx & ~(1u << 30), kVnni, 0xE7));  // no BW
static_assert(!avx512_usable(kOsxsave, kLeaf7Ebx & ~(1u << 31), kVnni, 0xE7));  // no VL

}  // namespace

bool cpu_has_avx512_vnni() {
#if defined(INTDET_AVX512_SIMDE)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#elif defined(__GNUC__) || defined(__clang__)
  unsigned a, b, c1, d;
  if (!__get_cpuid(1, &a, &b, &c1, &d) || __get_cpuid_max(0, nullptr) < 7) return false;
  uint64_t xcr0 = 0;
  if (c1 & kOsxsave) {  // XGETBV exists: read XCR0
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = ((uint64_t)hi << 32) | lo;
  }
  unsigned b7, c7;
  __cpuid_count(7, 0, a, b7, c7, d);
  return avx512_usable(c1, b7, c7, xcr0);
#else
  return false;
#endif
}

}  // namespace intdet
