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

namespace intdet {

// Wall time per op and layer of every forward while profiling is on
// (scripts/profile_cpu.py). An op's time runs from the end of the previous op
// to its own end, on the calling thread, so it includes the op's OpenMP fork,
// its load imbalance and its closing barrier; the ops of one forward add up
// to the forward's wall time ("forward", layer -1). Off (the default), a
// forward reads no clock.
struct OpTime {
  std::string op;
  int64_t layer;  // -1: outside the layers (embedding, output, the whole forward)
  int64_t calls;
  int64_t ns;     // summed over the calls
};

// on: clear the sums and start collecting; off: stop.
void set_op_profile(bool on);
bool op_profile_on();
// The sums since set_op_profile(true), in first-seen order.
std::vector<OpTime> op_profile();
// Adds one forward's times (forward.cpp calls it once per forward).
void op_profile_add(const std::vector<OpTime>& times);

}  // namespace intdet
