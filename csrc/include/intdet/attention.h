// One layer's attention over the int8 KV cache, in tiles (csrc/model/attention.cpp).
#pragma once

#include <cstdint>

#include "intdet/kernels.h"
#include "intdet/model.h"

namespace intdet {

// Query rows per tile: consecutive positions of one sequence times the query
// heads of one KV group (GQA), so every K and V row loaded serves them all.
constexpr int64_t kTileRows = 32;
// Fewest keys per thread's share when one sequence's keys are split.
constexpr int64_t kSplitKeys = 256;
// Few tiles (decode) whose rows read fewer keys than this run whole, one
// per task, even when there are fewer of them than threads: at a short
// context the key split's passes cost more than they save.
constexpr int64_t kShortKeys = 1024;

// o [T, nh, D] int64 for the layer l of m: for each row t and query head,
// softmax(q k^T) v over the row's causal (or sliding-window) positions, the
// same bits as attend_head per (row, head) (ops_generic.cpp, ref/ops.py
// attend). q [T, nh, D] int64 Q16 after RoPE; the rows' K and V are already
// in their caches. Many tiles: threads take whole tiles; few (decode): each
// tile's keys are split across threads and the integer maxima, sums and
// weighted sums combined exactly (every partial is an exact integer).
// nt: threads of the pool (pool.h) the tasks run on (forward_threads()).
void attend_layer(int nt, const Kernels& ks, const Model& m, int64_t l, KVCache* const* caches, const Row* rows,
                  int64_t T, const int64_t* q, int64_t* o);

}  // namespace intdet
