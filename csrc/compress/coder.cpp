#include "coder.h"

#include <vector>

#include "intdet/kernels.h"
#include "intdet/pool.h"

namespace intdet::compress {

// Rows go to the forward's thread pool (intdet/pool.h), not an OpenMP team:
// the pool's workers are the ones already awake after the forward, and a
// second team would contend with them for the same cores. Each task owns
// its row's outputs, so which thread runs it cannot change a byte.

void encode_rows(RangeEncoder& enc, const int32_t* logits, int64_t T, int64_t V, const int32_t* targets,
                 int precision) {
  std::vector<uint64_t> cum((size_t)T), freq((size_t)T);
  const int threads = forward_threads();
  // Tasks of kRows rows, so a task's table scratch serves several rows.
  constexpr int64_t kRows = 8;
  const int64_t n = (T + kRows - 1) / kRows;
  parallel_tasks(threads, n, [&](int64_t k) {
    SlotTable tab;
    for (int64_t t = k * kRows; t < T && t < (k + 1) * kRows; ++t) {
      tab.build(logits + t * V, V, precision);
      cum[(size_t)t] = tab.cum(targets[t]);
      freq[(size_t)t] = tab.freq(targets[t]);
    }
  });
  for (int64_t t = 0; t < T; ++t) enc.encode(cum[(size_t)t], freq[(size_t)t], precision);
}

void decode_rows(RangeDecoder* const* decs, const int32_t* const* logits, int64_t B, int64_t V, int precision,
                 int32_t* out) {
  parallel_tasks(forward_threads(), B, [&](int64_t b) {
    SlotTable tab;
    tab.build(logits[b], V, precision);
    const int64_t t = decs[b]->target(precision);
    out[b] = -1;
    if (t < 0) return;
    uint64_t c = 0;
    const int64_t s = tab.find((uint64_t)t, &c);
    decs[b]->consume(c, tab.freq(s));
    out[b] = (int32_t)s;
  });
}

}  // namespace intdet::compress
