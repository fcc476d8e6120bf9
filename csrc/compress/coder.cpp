#include "coder.h"

#include <vector>

namespace intdet::compress {

void encode_rows(RangeEncoder& enc, const int32_t* logits, int64_t T, int64_t V, const int32_t* targets,
                 int precision) {
  std::vector<uint64_t> cum(T), freq(T);
#pragma omp parallel if (T > 1)
  {
    std::vector<uint32_t> f(V);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      freq_table(logits + t * V, V, precision, f.data());
      uint64_t c = 0;
      for (int64_t i = 0; i < targets[t]; ++i) c += f[i];
      cum[t] = c;
      freq[t] = f[targets[t]];
    }
  }
  for (int64_t t = 0; t < T; ++t) enc.encode(cum[t], freq[t], precision);
}

void decode_rows(RangeDecoder* const* decs, const int32_t* const* logits, int64_t B, int64_t V, int precision,
                 int32_t* out) {
#pragma omp parallel if (B > 1)
  {
    std::vector<uint32_t> f(V);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      freq_table(logits[b], V, precision, f.data());
      const int64_t t = decs[b]->target(precision);
      out[b] = -1;
      if (t < 0) continue;
      uint64_t c = 0;
      int64_t s = 0;
      while (c + f[s] <= (uint64_t)t) c += f[s++];  // terminates: the f sum to 2^precision > t
      decs[b]->consume(c, f[s]);
      out[b] = (int32_t)s;
    }
  }
}

}  // namespace intdet::compress
