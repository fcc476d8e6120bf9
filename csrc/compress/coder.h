// Row-parallel drivers of the table and the range coder (csrc/compress/coder.cpp).
#pragma once

#include <cstdint>

#include "freq_table.h"
#include "range_coder.h"

namespace intdet::compress {

// Codes targets[0..T) in order, row t under the table of logits[t * V ..].
// The tables are built in parallel (OpenMP), each by one thread, so the
// thread count cannot change a byte.
void encode_rows(RangeEncoder& enc, const int32_t* logits, int64_t T, int64_t V, const int32_t* targets,
                 int precision);

// One symbol for each of B decoders, decoder b under the table of
// logits[b][0..V). out[b] is the token id, or -1 when the stream cannot
// come from the encoder (corrupt data).
void decode_rows(RangeDecoder* const* decs, const int32_t* const* logits, int64_t B, int64_t V, int precision,
                 int32_t* out);

}  // namespace intdet::compress
