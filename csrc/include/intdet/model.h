// Model weights (borrowed pointers into the memory-mapped model file) and the
// int8 KV cache. Tensor formats: docs/format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "intdet/intmath.h"  // Softcap

namespace intdet {

struct Kernels;  // kernels.h

constexpr int kPackedLayouts = 4;  // distinct packed weight layouts a build may have

struct Linear {
  const int8_t* w = nullptr;       // [N, K] int8, per-output-channel symmetric
  const int32_t* mant = nullptr;   // [N] dyadic mantissa (< 2^15)
  const int32_t* shift = nullptr;  // [N] dyadic shift
  const int32_t* bias = nullptr;   // [N] Q16 or null
  int64_t N = 0, K = 0;
  // Int4 weights (docs/format.md; w is null then): codes w4 [N, K/2] uint8,
  // per group of 32 inputs step gd and offset gm [N, K/32] int16, the
  // effective weight gd * u + gm (|.| <= 2047).
  const uint8_t* w4 = nullptr;
  const int16_t* gd = nullptr;
  const int16_t* gm = nullptr;
  // w (or w4 + gd + gm) repacked by pack_model / ensure_packed, one copy per
  // packed layout in use (index Packing::id, kernels.h); owned by Model.
  const void* packed[kPackedLayouts] = {};
};

struct Layer {
  const int16_t* attn_norm = nullptr;  // [H] gamma; null without pre-norms (OLMo 2: the residual itself feeds q/k/v)
  Linear q, k, v, o;
  const int16_t* q_norm = nullptr;  // [D] when the block has per-head q/k RMSNorm (Qwen3), else null
  const int16_t* k_norm = nullptr;
  bool qk_norm_projection = false;  // q_norm [nh*D] / k_norm [nkv*D] over the whole projection (OLMo 2)
  int64_t score_mant = 0, score_shift = 0;
  Softcap attn_softcap;  // of the Q16 log2-domain scores before the softmax (Gemma 2), else cap 0
  // Post-norms (Gemma), else null: RMSNorm of the o / down output (Q16), then
  // shift_round_sat32 by the shift into the residual's Q R.
  const int16_t* post_attn_norm = nullptr;
  int32_t post_attn_shift = 0;
  const int16_t* ffn_norm = nullptr;
  Linear gate, up, down;
  const int16_t* post_ffn_norm = nullptr;
  int32_t post_ffn_shift = 0;
  // Mixture of experts (gate/up/down then unused): router [E, H] to Q16 log2
  // units, one Linear per expert (views into the [E, N, K] tensors).
  Linear router;
  std::vector<Linear> gate_exps, up_exps, down_exps;
  int64_t n_experts_used = 0;
  bool norm_topk = false;
  bool geglu = false;                 // gated FFN activation: GeGLU (tanh GELU), else SwiGLU
  int64_t window = 0;                 // attention window: 0 full causal, W the last W positions
  const int16_t* rope_cos = nullptr;  // the block's RoPE table [ctx, D/2] Q14 (Model::rope_* or rope_local_*); null: NoPE
  const int16_t* rope_sin = nullptr;
};

struct Config {
  int64_t hidden = 0, ffn = 0, n_layers = 0, n_heads = 0, n_kv = 0, head_dim = 0, vocab = 0, ctx = 0;
  int64_t eps_hidden = 0, eps_head = 0;  // round(n * eps * 2^60)
  int64_t eps_q = 0, eps_k = 0;          // the same for a projection-wide q / k RMSNorm (n = nh*D, nkv*D), else 0
  int64_t residual_frac = 16;            // residual stream int32 in Q residual_frac (config residual_frac_bits)
};

struct Model {
  Config cfg;
  const int8_t* tok_embd = nullptr;  // [V, H]
  // With a tied head packed by pack_model: its packed copy and the layout's
  // row reader (W8Packer::row); the embedding then reads rows there, not
  // from tok_embd's file pages. Null otherwise.
  const int8_t* tok_embd_packed = nullptr;
  void (*tok_embd_row)(const int8_t* packed, int64_t K, int64_t n, int8_t* out) = nullptr;
  const int32_t* embd_mant = nullptr;
  const int32_t* embd_shift = nullptr;
  const int16_t* rope_cos = nullptr;  // [ctx, D/2] Q14
  const int16_t* rope_sin = nullptr;
  const int16_t* rope_local_cos = nullptr;  // the local layers' table (Gemma), else null
  const int16_t* rope_local_sin = nullptr;
  std::vector<Layer> layers;
  const int16_t* out_norm = nullptr;
  Linear output;  // lm_head (may share w with tok_embd)
  Softcap final_softcap;  // of the Q16 logits (Gemma 2), else cap 0
  // Memory made at load and later (the repacked weights' arenas), shared so
  // a copy stays valid; the mutex serializes ensure_packed between threads.
  struct Packs {
    std::mutex mu;
    bool release_source = false;
    std::vector<std::shared_ptr<void>> arenas;
  };
  std::shared_ptr<Packs> packs = std::make_shared<Packs>();
};

// Repacks every linear layer's weights into the packed layout of the active
// kernel set (kernels()), if it reads one: one copy, not one per set the CPU
// runs (a 135M-parameter model is 135 MB per int8 copy). Call once after
// filling the pointers. release_source: the weights lie in a read-only file
// mapping, so each source tensor's pages are dropped (madvise) once packed,
// keeping peak RSS near one copy; a later ensure_packed reads them again
// from the file. Never set it for weights in ordinary (anonymous) memory.
void pack_model(Model& m, bool release_source = false);
// Whether kernel set k's linear kernels read a packed copy of L (its weight
// format has a packed kernel in k).
bool reads_packed(const Kernels& k, const Linear& L);
// Packs the layout kernel set k reads if this model lacks it (a set chosen
// after load); every forward calls it first. Thread-safe.
void ensure_packed(const Model& m, const Kernels& k);

// Drops the whole pages inside [p, p + n) of a read-only file mapping (a
// later read faults them back in from the file); a no-op elsewhere. Used by
// pack_model and the loader (loader.h) for mapped weights.
void release_pages(const void* p, int64_t n);

// Rows per forward pass: forward_rows runs longer calls in pieces of this
// many rows (a prefill split anywhere gives the same bits), which bounds the
// activation buffers (as llama.cpp's n_ubatch does) and the positions one
// pass adds to a sliding window's ring.
constexpr int64_t kForwardRows = 512;

// KV cache for one sequence: int8 rows plus one absmax scale per (pos, kv
// head). Layer l keeps cap[l] positions from row off[l]: max_len, or for a
// sliding-window layer (Gemma 3's local layers) a ring of window +
// kForwardRows, position p in row off[l] + p % cap[l]. A ring is exact: a
// row at p reads positions p - window + 1..p, and a call adds at most
// kForwardRows positions, so no slot it reads is overwritten in that call.
//
// Layout: each layer's rows are a block [n_kv, cap, D] (head-major), so one
// KV head's keys are contiguous: a decode row's attention tile streams its
// head's keys from memory instead of one cache line in n_kv (1.5-2x faster
// from DRAM or L3 at n_kv 3). `at` gives a (layer, row, head)'s index.
struct KVCache {
  int64_t max_len = 0, n_kv = 0;
  std::vector<int64_t> cap, off;  // [L]
  std::vector<int8_t> k, v;       // [L][n_kv, cap[l], D]
  std::vector<int32_t> ka, va;    // [L][n_kv, cap[l]]
  // Every layer full length (no rings).
  void init(const Config& c, int64_t len) { init_caps(c, len, std::vector<int64_t>((size_t)c.n_layers, len)); }
  // Rings for m's sliding-window layers.
  void init(const Model& m, int64_t len) {
    std::vector<int64_t> caps((size_t)m.cfg.n_layers, len);
    for (int64_t l = 0; l < m.cfg.n_layers; ++l)
      if (m.layers[(size_t)l].window && m.layers[(size_t)l].window + kForwardRows < len)
        caps[(size_t)l] = m.layers[(size_t)l].window + kForwardRows;
    init_caps(m.cfg, len, caps);
  }
  // The cache row of (layer, position).
  int64_t row(int64_t l, int64_t pos) const { return off[(size_t)l] + pos % cap[(size_t)l]; }
  // Index of (layer l, cache row r of that layer, KV head g) in ka / va; times
  // D in k / v. Rows r, r + 1, ... of one head are consecutive.
  int64_t at(int64_t l, int64_t r, int64_t g) const {
    const int64_t o = off[(size_t)l];
    return o * n_kv + g * cap[(size_t)l] + (r - o);
  }
  bool has_ring() const {
    for (int64_t c : cap)
      if (c < max_len) return true;
    return false;
  }

 private:
  void init_caps(const Config& c, int64_t len, std::vector<int64_t> caps) {
    max_len = len;
    n_kv = c.n_kv;
    cap = std::move(caps);
    off.assign(cap.size(), 0);
    int64_t rows = 0;
    for (size_t l = 0; l < cap.size(); ++l) {
      off[l] = rows;
      rows += cap[l];
    }
    k.assign((size_t)(rows * c.n_kv * c.head_dim), 0);
    v.assign(k.size(), 0);
    ka.assign((size_t)(rows * c.n_kv), 0);
    va.assign(ka.size(), 0);
  }
};

// One row of a forward call: a token of sequence `seq` (an index into the
// caches array) at absolute position `pos`. Rows of several sequences mix
// freely in one call (batched decode, mixed prefill); every row's logits are
// the same bits as when its sequence runs alone, since each op is per row.
struct Row {
  int64_t seq, pos;
  int32_t token;
  bool want_logits;
};
// Logits int32 [rows with want_logits, V] in row order.
void forward_rows(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits);

// Runs tokens [T] at absolute positions start..start+T-1, appending to the
// cache; writes logits int32 [T_out, V] where T_out = all_logits ? T : 1
// (the last position only).
void forward(const Model& m, KVCache& kv, const int32_t* tokens, int64_t T, int64_t start, bool all_logits,
             int32_t* logits);

}  // namespace intdet
