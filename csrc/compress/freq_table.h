// The integer probability table of `intdet compress` (docs/compress.md):
// the C++ twin of python/intdet/compress/table.py, tested bit for bit
// against it (tests/test_compress_table.py). No floating point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "intdet/intmath.h"

namespace intdet::compress {

// Logit gaps (Q16 nats) are capped here before the log2(e) product so it
// stays inside int64; a gap of 1024 nats has weight 0 anyway (as sampling.py).
constexpr int64_t kDiffCap = (int64_t)1 << 26;
constexpr int64_t kZeroWeightU = (int64_t)31 << kExpFrac;  // exp2_neg_q30(u) == 0 from here on
constexpr int kMinPrecision = 24, kMaxPrecision = 30;
constexpr int kPrecision = 28;  // the tables of container format version 1 (table.py PRECISION)
constexpr int64_t kMaxVocab = (int64_t)1 << 22;

// exp2_neg_q30 of the fraction bits: exp2_neg_q30(u) == round_shift(kExp2Frac[u & 0xFFFF], u >> 16)
// for u < 31 * 2^16, the same function evaluated once per fraction (so the
// same bits by construction; tested in tests/test_compress_table.py).
inline const uint32_t* exp2_frac_table() {
  static const std::vector<uint32_t> t = [] {
    std::vector<uint32_t> v((std::size_t)1 << kExpFrac);
    for (int64_t f = 0; f < ((int64_t)1 << kExpFrac); ++f) v[(std::size_t)f] = (uint32_t)exp2_neg_q30(f);
    return v;
  }();
  return t.data();
}

// Frequencies f[0..V) of the token after int32 logits z[0..V) (Q16 nats),
// summing to exactly 2^precision, each >= 1:
//   d_i = min(max(z) - z_i, kDiffCap); u_i = round_shift(d_i * log2(e)_Q30, 30) (Q16 log2 units)
//   w_i = exp2_neg_q30(u_i) (Q30, the argmax has 2^30); W = sum w_i
//   M = floor((2^P - V) * 2^32 / W); f_i = 1 + ((w_i * M) >> 32); the
//   remainder 2^P - sum f_i goes to the argmax (lowest id on ties).
// Returns the argmax. Bounds: W >= 2^30 (the argmax), so M <= 2^32 and
// w_i * M <= 2^62; (2^P - V) * 2^32 < 2^62; W <= V * 2^30 <= 2^52.
// The caller checks 1 <= V <= kMaxVocab and kMinPrecision <= P <= kMaxPrecision.
inline int64_t freq_table(const int32_t* z, int64_t V, int precision, uint32_t* f) {
  const uint32_t* e2 = exp2_frac_table();
  int64_t top = z[0], arg = 0;
  for (int64_t i = 1; i < V; ++i)
    if (z[i] > top) top = z[i], arg = i;
  int64_t W = 0;
  for (int64_t i = 0; i < V; ++i) {
    int64_t d = imin(top - (int64_t)z[i], kDiffCap);
    int64_t u = round_shift(d * kLog2eQ30, 30);
    int64_t w = u >= kZeroWeightU ? 0 : round_shift((int64_t)e2[u & 0xFFFF], u >> kExpFrac);
    f[i] = (uint32_t)w;  // w <= 2^30 fits; replaced by the frequency below
    W += w;
  }
  const int64_t M = ((((int64_t)1 << precision) - V) << 32) / W;
  int64_t sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    const int64_t fi = 1 + (((int64_t)f[i] * M) >> 32);
    f[i] = (uint32_t)fi;
    sum += fi;
  }
  f[arg] += (uint32_t)(((int64_t)1 << precision) - sum);
  return arg;
}

}  // namespace intdet::compress
