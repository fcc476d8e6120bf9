// Can this CPU and OS run the AMX kernel set (amx_gemm.cpp)? Compiled without
// ISA flags: it runs before any AMX code, on every x86-64 CPU. In the
// test-only SIMDe build (INTDET_AVX512_SIMDE) the tiles are emulated
// (amx_intrin.h) and AVX2 is enough.
#include <cstdint>

#include "amx.h"
#include "avx512.h"

#if !defined(INTDET_AVX512_SIMDE) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if !defined(INTDET_AVX512_SIMDE) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace intdet {
namespace {

// CPUID.7.0:EDX bit 24 AMX-TILE, bit 25 AMX-INT8; XCR0 bits 17 (XTILECFG)
// and 18 (XTILEDATA) enabled by the OS (Intel SDM vol. 1, 13.2 and 3.2.6).
constexpr uint32_t kAmxTileInt8 = (1u << 24) | (1u << 25);
constexpr uint64_t kTileState = (1ull << 17) | (1ull << 18);
constexpr bool amx_usable(uint32_t leaf7_edx, uint64_t xcr0) {
  return (leaf7_edx & kAmxTileInt8) == kAmxTileInt8 && (xcr0 & kTileState) == kTileState;
}
static_assert(amx_usable(kAmxTileInt8, kTileState | 0xE7));
static_assert(!amx_usable(1u << 24, kTileState | 0xE7));          // tiles but no INT8 (BF16 only)
static_assert(!amx_usable(kAmxTileInt8, (1ull << 17) | 0xE7));    // the OS does not save tile data
static_assert(!amx_usable(kAmxTileInt8, 0xE7));

#if !defined(INTDET_AVX512_SIMDE) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
bool amx_check() {
  if (!cpu_has_avx512_vnni()) return false;  // the set's other kernels are the AVX-512 set's
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));  // cpu_has_avx512_vnni saw OSXSAVE
  if (!amx_usable(d, ((uint64_t)hi << 32) | lo)) return false;
  // Linux keeps tile data off until the process asks for it (arch_prctl
  // ARCH_REQ_XCOMP_PERM = 0x1023 with XFEATURE_XTILEDATA = 18; kernel
  // Documentation/arch/x86/xstate.rst); the permission then holds for every
  // thread of the process, so the OpenMP workers may use tiles too. Each
  // thread still loads the tile configuration itself (amx_gemm.cpp).
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

}  // namespace

bool cpu_has_amx_int8() {
#if defined(INTDET_AVX512_SIMDE)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
  static const bool ok = amx_check();  // asks for the permission once per process
  return ok;
#else
  return false;
#endif
}

}  // namespace intdet
