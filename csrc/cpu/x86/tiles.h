// Shared pieces of the AVX2 linear kernels (avx2_gemm.cpp, avx2_w4.cpp):
// splitting tokens into register tiles, and the per-channel epilogue.
#pragma once

#include <cstdint>
#include <type_traits>

#include "intdet/ops.h"

namespace intdet {

// Calls f(std::integral_constant<int, R>{}, t) for tiles of R = MR tokens
// over [t0, t1), then one tail tile of R < MR tokens if any remain; R is a
// compile-time constant so each tile size gets its own unrolled code.
template <int MR, class F>
inline void token_tiles(int64_t t0, int64_t t1, F&& f) {
  static_assert(MR >= 1 && MR <= 12, "tail dispatch covers tiles of up to 12 tokens");
  int64_t t = t0;
  for (; t + MR <= t1; t += MR) f(std::integral_constant<int, MR>{}, t);
  switch (t1 - t) {
#define INTDET_TAIL(R) \
  case R:              \
    if constexpr (R < MR) f(std::integral_constant<int, R>{}, t); \
    break;
    INTDET_TAIL(1) INTDET_TAIL(2) INTDET_TAIL(3) INTDET_TAIL(4) INTDET_TAIL(5)
    INTDET_TAIL(6) INTDET_TAIL(7) INTDET_TAIL(8) INTDET_TAIL(9) INTDET_TAIL(10) INTDET_TAIL(11)
#undef INTDET_TAIL
    default:
      break;
  }
}

// out[(t + r) * ldo + j + c] for a tile's exact dots acc [R][W] (W channels
// from j, of which the first min(W, N - j) exist): the shared linear_epilogue.
template <int R, int W>
inline void store_tile(const int64_t* acc, const int32_t* e, int64_t t, const int32_t* mant, const int32_t* shift,
                       const int32_t* bias, int64_t j, int64_t N, int64_t* out, int64_t ldo) {
  const int64_t nc = N - j < W ? N - j : W;
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < nc; ++c)
      out[(t + r) * ldo + j + c] = linear_epilogue(acc[r * W + c], mant[j + c], shift[j + c], e[t + r], bias, j + c);
}

}  // namespace intdet
