// The AMX tile intrinsics of amx_gemm.cpp: the compiler's own (<immintrin.h>
// with -mamx-tile -mamx-int8), or, in the SIMDe test build
// (INTDET_AVX512_SIMDE), a portable emulation of exactly the instructions the
// kernel uses, written from their definitions (Intel SDM vol. 2, TDPBSSD /
// TDPBUSD / TILELOADD / TILESTORED / TILEZERO), so the very same kernel source
// is compared bit for bit with the scalar set on CPUs without AMX. The
// emulation supports the one configuration the kernel loads: every tile 16
// rows of 64 bytes.
#pragma once

#include <cstdint>

#include "avx512_intrin.h"

namespace intdet {

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) AmxTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

}  // namespace intdet

#if defined(INTDET_AVX512_SIMDE)
#include <cstring>

namespace intdet::amx_emu {

struct Tile {
  alignas(64) uint8_t b[16][64];
};
inline thread_local Tile tmm[8];

inline void loadd(int t, const void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(tmm[t].b[r], static_cast<const uint8_t*>(base) + r * stride, 64);
}
inline void stored(int t, void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<uint8_t*>(base) + r * stride, tmm[t].b[r], 64);
}
inline void zero(int t) { std::memset(tmm[t].b, 0, sizeof tmm[t].b); }
// C[m][n] += sum_{k < 16, i < 4} A[m][4k + i] * B[k][4n + i], int32 lanes
// wrapping; A's bytes signed (SSD) or unsigned (USD), B's signed.
template <bool kUnsignedA>
inline void dp(int c, int a, int b) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      int32_t acc;
      std::memcpy(&acc, &tmm[c].b[m][4 * n], 4);
      uint32_t sum = (uint32_t)acc;
      for (int k = 0; k < 16; ++k)
        for (int i = 0; i < 4; ++i) {
          const int32_t x = kUnsignedA ? (int32_t)tmm[a].b[m][4 * k + i] : (int32_t)(int8_t)tmm[a].b[m][4 * k + i];
          sum += (uint32_t)(x * (int32_t)(int8_t)tmm[b].b[k][4 * n + i]);
        }
      acc = (int32_t)sum;
      std::memcpy(&tmm[c].b[m][4 * n], &acc, 4);
    }
}

}  // namespace intdet::amx_emu

// (GCC's <immintrin.h>, which SIMDe includes, defines some of these names
// as macros whatever the flags.)
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_dpbusd
#define _tile_loadconfig(cfg) ((void)(cfg))
#define _tile_release() ((void)0)
#define _tile_loadd(t, base, stride) ::intdet::amx_emu::loadd(t, base, stride)
#define _tile_stream_loadd(t, base, stride) ::intdet::amx_emu::loadd(t, base, stride)
#define _tile_stored(t, base, stride) ::intdet::amx_emu::stored(t, base, stride)
#define _tile_zero(t) ::intdet::amx_emu::zero(t)
#define _tile_dpbssd(c, a, b) ::intdet::amx_emu::dp<false>(c, a, b)
#define _tile_dpbusd(c, a, b) ::intdet::amx_emu::dp<true>(c, a, b)
#endif
