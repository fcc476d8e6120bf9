// The integer probability table of `intdet compress` (docs/compress.md):
// the C++ twin of python/intdet/compress/table.py, tested bit for bit
// against it (tests/compress/test_compress_table.py). No floating point.
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
// same bits by construction; tested in tests/compress/test_compress_table.py).
inline const uint32_t* exp2_frac_table() {
  static const std::vector<uint32_t> t = [] {
    std::vector<uint32_t> v((std::size_t)1 << kExpFrac);
    for (int64_t f = 0; f < ((int64_t)1 << kExpFrac); ++f) v[(std::size_t)f] = (uint32_t)exp2_neg_q30(f);
    return v;
  }();
  return t.data();
}

// exp2_neg_q30(u) for u >= 0 without a branch: the fraction's table entry
// rounded by the integer part (the identity above), 0 from u = 31 * 2^16 on
// (a shift of 63 leaves 0: the entry is <= 2^30). Shifts 1..30 round half
// up as round_shift; a shift of 0 adds 0.
inline uint32_t weight_of_u(const uint32_t* e2, int64_t u) {
  const int64_t i = u >> kExpFrac;
  const int sh = i >= 31 ? 63 : (int)i;
  const uint64_t half = ((uint64_t)1 << sh) >> 1;
  return (uint32_t)(((uint64_t)e2[u & 0xFFFF] + half) >> sh);
}

// Steps 1-5 below for one row: the argmax, w[0..V) (Q30, <= 2^30) and M.
struct Weights {
  int64_t arg;  // lowest id among the largest logits
  uint32_t M;   // floor((2^P - V) * 2^32 / W) < 2^32 (W >= 2^30, P <= 30)
};
inline Weights row_weights(const int32_t* z, int64_t V, int precision, uint32_t* w) {
  const uint32_t* e2 = exp2_frac_table();
  int32_t top = z[0];
  for (int64_t i = 1; i < V; ++i) top = z[i] > top ? z[i] : top;
  int64_t arg = 0;
  while (z[arg] != top) ++arg;
  int64_t W = 0;
  for (int64_t i = 0; i < V; ++i) {
    const int64_t d = imin((int64_t)top - (int64_t)z[i], kDiffCap);
    const int64_t u = (d * kLog2eQ30 + ((int64_t)1 << 29)) >> 30;  // round_shift(d * log2(e), 30), d >= 0
    w[i] = weight_of_u(e2, u);
    W += w[i];
  }
  return Weights{arg, (uint32_t)(((((int64_t)1 << precision) - V) << 32) / W)};
}

// Step 6 without the argmax's remainder: 1 + floor(w * M / 2^32).
inline uint32_t base_freq(uint32_t w, uint32_t M) { return 1 + (uint32_t)(((uint64_t)w * M) >> 32); }

// Frequencies f[0..V) of the token after int32 logits z[0..V) (Q16 nats),
// summing to exactly 2^precision, each >= 1:
//   d_i = min(max(z) - z_i, kDiffCap); u_i = round_shift(d_i * log2(e)_Q30, 30) (Q16 log2 units)
//   w_i = exp2_neg_q30(u_i) (Q30, the argmax has 2^30); W = sum w_i
//   M = floor((2^P - V) * 2^32 / W); f_i = 1 + ((w_i * M) >> 32); the
//   remainder 2^P - sum f_i goes to the argmax (lowest id on ties).
// Returns the argmax. Bounds: W >= 2^30 (the argmax), so M < 2^32 and
// w_i * M < 2^62; (2^P - V) * 2^32 < 2^62; W <= V * 2^30 <= 2^52.
// The caller checks 1 <= V <= kMaxVocab and kMinPrecision <= P <= kMaxPrecision.
inline int64_t freq_table(const int32_t* z, int64_t V, int precision, uint32_t* f) {
  const Weights r = row_weights(z, V, precision, f);  // f holds w until overwritten
  uint64_t sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    f[i] = base_freq(f[i], r.M);
    sum += f[i];
  }
  f[r.arg] += (uint32_t)(((uint64_t)1 << precision) - sum);
  return r.arg;
}

// One symbol's slot [cum, cum + freq) of freq_table(z) without writing the
// table: the frequencies summed in blocks of kSlotBlock ids (bsum), so the
// encoder adds whole blocks below the target and the decoder finds the
// target's block before scanning ids. Same numbers as freq_table by
// construction (base_freq plus the remainder on the argmax); tested against
// table.py through encode_rows / decode_rows (tests/compress/test_compress_coder.py).
constexpr int64_t kSlotBlock = 256;

struct SlotTable {
  std::vector<uint32_t> w;
  std::vector<uint64_t> bsum;  // block sums of f, the remainder included
  Weights r{};
  uint64_t rem = 0;
  int64_t V = 0;

  void build(const int32_t* z, int64_t V_, int precision) {
    V = V_;
    w.resize((size_t)V);
    bsum.resize((size_t)((V + kSlotBlock - 1) / kSlotBlock));
    r = row_weights(z, V, precision, w.data());
    uint64_t total = 0;
    for (size_t b = 0; b < bsum.size(); ++b) {
      const int64_t lo = (int64_t)b * kSlotBlock, hi = imin(lo + kSlotBlock, V);
      uint64_t s = 0;
      for (int64_t i = lo; i < hi; ++i) s += base_freq(w[(size_t)i], r.M);
      bsum[b] = s;
      total += s;
    }
    rem = ((uint64_t)1 << precision) - total;
    bsum[(size_t)(r.arg / kSlotBlock)] += rem;
  }
  uint64_t freq(int64_t i) const { return base_freq(w[(size_t)i], r.M) + (i == r.arg ? rem : 0); }
  // cum_s = sum of f below s.
  uint64_t cum(int64_t s) const {
    const int64_t b = s / kSlotBlock;
    uint64_t c = 0;
    for (int64_t k = 0; k < b; ++k) c += bsum[(size_t)k];
    for (int64_t i = b * kSlotBlock; i < s; ++i) c += freq(i);
    return c;
  }
  // The s with cum_s <= t < cum_s + f_s (t < 2^precision); *c = cum_s.
  int64_t find(uint64_t t, uint64_t* c_out) const {
    uint64_t c = 0;
    size_t b = 0;
    while (b + 1 < bsum.size() && c + bsum[b] <= t) c += bsum[b++];
    int64_t s = (int64_t)b * kSlotBlock;
    const int64_t hi = imin(s + kSlotBlock, V) - 1;  // t < c + bsum[b]: found by hi
    while (s < hi && c + freq(s) <= t) c += freq(s++);
    *c_out = c;
    return s;
  }
};

}  // namespace intdet::compress
