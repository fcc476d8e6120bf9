// Named intermediates of one forward call, for finding where two backends
// first differ (scripts/first_divergence.py). Names and values are those of
// python/intdet/ref/model.py's trace: GGUF-style (tok_embd, blk.3.attn_q,
// blk.3.ffn_down, blk.3.residual, output), int64 arrays over the call's rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "intdet/kernels.h"
#include "intdet/model.h"

namespace intdet {

struct Trace {
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<int64_t> values;  // row-major
  };
  std::string isa;  // the kernel set the call ran on
  std::vector<Tensor> tensors;  // in the order the forward made them
};

// forward_rows on kernel set ks (any this CPU runs, whatever kernels() is)
// that also fills `trace`, copying each intermediate once; forward_rows
// itself records nothing.
void forward_rows_traced(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits,
                         const Kernels& ks, Trace& trace);

}  // namespace intdet
