// The decoder forward pass (Llama / Qwen2 / Qwen3 / Gemma 3), integer only.
// Mirrors python/intdet/ref/model.py line for line; formats in comments.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "intdet/attention.h"
#include "intdet/intmath.h"
#include "intdet/kernels.h"
#include "intdet/model.h"
#include "intdet/ops.h"
#include "intdet/trace.h"

namespace intdet {
namespace {

// int16 activations of T rows (one exponent per row) for the next linear layer.
struct Act16 {
  std::vector<int16_t> q;
  std::vector<int32_t> e;
  void from_rows(const Kernels& ks, const int64_t* x, int64_t T, int64_t n) {
    q.resize((size_t)(T * n));
    e.resize((size_t)T);
    const auto quant = ks.quant16;
#pragma omp parallel for schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; ++t) e[t] = quant(x + t * n, n, q.data() + t * n);
  }
};

// Output channels are split into blocks across threads; each output is
// computed by exactly one thread, so the thread count cannot change a bit.
// Blocks of 64 rows, halved (down to 16) until every thread gets about 4:
// small layers (GQA's K and V) would otherwise leave threads idle. Blocks
// start at multiples of 16, as packed layouts require (kernels.h); each output is
// computed whole by one call, so the split cannot change a bit.
template <class F>
void over_row_blocks(int64_t N, F&& f) {
  int64_t rows = 64;
  while (rows > 16 && (N + rows - 1) / rows < 4 * (int64_t)team_threads()) rows /= 2;
  const int64_t nblk = (N + rows - 1) / rows;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblk; ++b) f(b * rows, b * rows + rows < N ? rows : N - b * rows);
}

// Whether k's linear kernel for L's weight format reads a packed copy.
bool reads_packed(const Kernels& k, const Linear& L) {
  return L.w4 ? k.linear_w4_packed != nullptr : k.linear_packed != nullptr;
}

// Every packed copy the kernel set reads exists, checked before the forward
// writes anything (pack_model made them for every set this CPU runs).
void check_packed(const Model& m, const Kernels& k) {
  auto check = [&](const Linear& L) {
    if (reads_packed(k, L) && !L.packed[k.packing->id])
      throw std::logic_error(std::string("linear weights not packed for kernel set ") + k.name +
                             " (pack_model not called)");
  };
  for (const Layer& L : m.layers)
    for (const Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) check(*x);
  check(m.output);
}

// The kernel set's linear layer for L's weight format (int8 or int4), on its
// packed layout when the set reads one.
void run_linear(const Kernels& k, const Linear& L, const Act16& a, int64_t T, int64_t* out) {
  const int16_t* q = a.q.data();
  const int32_t* e = a.e.data();
  const int64_t K = L.K;
  auto bias = [&](int64_t j0) { return L.bias ? L.bias + j0 : nullptr; };
  const void* packed = reads_packed(k, L) ? L.packed[k.packing->id] : nullptr;
  if (L.w4 && packed) {
    const uint8_t* w = static_cast<const uint8_t*>(packed);
    const int64_t row = k.packing->w4.channel_bytes(K);
    over_row_blocks(L.N, [&](int64_t j0, int64_t n) {
      k.linear_w4_packed(q, e, T, K, w + j0 * row, nullptr, nullptr, L.mant + j0, L.shift + j0, bias(j0), n,
                         out + j0, L.N);
    });
  } else if (L.w4) {
    const int64_t G = K / kW4Group;
    over_row_blocks(L.N, [&](int64_t j0, int64_t n) {
      k.linear_w4(q, e, T, K, L.w4 + j0 * (K / 2), L.gd + j0 * G, L.gm + j0 * G, L.mant + j0, L.shift + j0,
                  bias(j0), n, out + j0, L.N);
    });
  } else {
    const LinearFn fn = packed ? k.linear_packed : k.linear;
    const int8_t* w = packed ? static_cast<const int8_t*>(packed) : L.w;
    const int64_t row = packed ? k.packing->w8.channel_bytes(K) : K;  // bytes per channel
    over_row_blocks(L.N, [&](int64_t j0, int64_t n) {
      fn(q, e, T, K, w + j0 * row, L.mant + j0, L.shift + j0, bias(j0), n, out + j0, L.N);
    });
  }
}

// Row-wise ops run rows in parallel: each row's result depends on that row
// alone, so the split cannot change a bit.
void norm_rows(const int64_t* x, const int16_t* g, int64_t T, int64_t n, int64_t eps, int in_frac,
               std::vector<int64_t>& y) {
  y.resize((size_t)(T * n));
#pragma omp parallel if (T > 1)
  {
    std::vector<int32_t> row((size_t)n);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      rms_norm_row(x + t * n, g, n, eps, in_frac, row.data());
      for (int64_t i = 0; i < n; ++i) y[t * n + i] = row[i];
    }
  }
}

void add_residual(std::vector<int64_t>& x, const std::vector<int64_t>& d, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) x[i] = sat32(x[i] + d[i]);
}

// Gemma's post-norm: RMSNorm of a branch output d (Q16) into norm units h,
// then x += shift_round_sat32(h, shift) (to the residual's Q R), saturating.
void add_post_norm(std::vector<int64_t>& x, const std::vector<int64_t>& d, const int16_t* g, int32_t shift, int64_t T,
                   int64_t H, int64_t eps, std::vector<int64_t>& h) {
  norm_rows(d.data(), g, T, H, eps, 16, h);
#pragma omp parallel for schedule(static) if (T * H > 4096)
  for (int64_t i = 0; i < T * H; ++i) x[i] = sat32(x[i] + shift_round_sat32(h[i], shift));
}

// The forward pass on kernel set ks; tr, when not null, receives the named
// intermediates (one test per site and layer when null, nothing per row).
void forward_impl(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits,
                  const Kernels& ks, Trace* tr) {
  check_packed(m, ks);
  forward_threads();  // fixed, or auto: fewer when other processes hold cores
  if (tr) tr->isa = ks.name;
  auto rec = [tr](std::string name, const std::vector<int64_t>& a, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tr->tensors.push_back({std::move(name), std::move(shape), std::vector<int64_t>(a.begin(), a.begin() + n)});
  };
  const Config& c = m.cfg;
  const int64_t H = c.hidden, F = c.ffn, nh = c.n_heads, nkv = c.n_kv, D = c.head_dim;
  const int64_t half = D / 2;
  const int R = (int)c.residual_frac;  // residual stream Q R
  std::vector<int64_t> x((size_t)(T * H));  // residual [T, H] int32 values, Q16
  std::vector<int64_t> h, q((size_t)(T * nh * D)), k((size_t)(T * nkv * D)), v((size_t)(T * nkv * D));
  std::vector<int64_t> o((size_t)(T * nh * D)), tmp((size_t)(T * H));
  std::vector<int64_t> gate((size_t)(T * F)), up((size_t)(T * F));
  std::vector<int64_t> qn;
  Act16 act;

  // Embedding: int8 row times its dyadic scale -> residual Q R.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = rows[t].token;
    for (int64_t i = 0; i < H; ++i)
      x[t * H + i] = shift_round_sat32((int64_t)m.tok_embd[tok * H + i] * m.embd_mant[tok], m.embd_shift[tok]);
  }
  if (tr) rec("tok_embd", x, {T, H});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = m.layers[l];
    const std::string blk = tr ? "blk." + std::to_string(l) + "." : "";
    // --- attention block ---
    norm_rows(x.data(), L.attn_norm, T, H, c.eps_hidden, R, h);  // [T, H] norm units
    act.from_rows(ks, h.data(), T, H);                        // int16 + exponent per token
    run_linear(ks, L.q, act, T, q.data());                    // [T, nh*D] Q16
    run_linear(ks, L.k, act, T, k.data());                    // [T, nkv*D] Q16
    run_linear(ks, L.v, act, T, v.data());                    // [T, nkv*D] Q16
    if (tr) {
      rec(blk + "attn_norm", h, {T, H});
      rec(blk + "attn_q", q, {T, nh, D});
      rec(blk + "attn_k", k, {T, nkv, D});
      rec(blk + "attn_v", v, {T, nkv, D});
    }
    if (L.q_norm) {  // the block has per-head q/k RMSNorm (Qwen3, Gemma 3)
      norm_rows(q.data(), L.q_norm, T * nh, D, c.eps_head, 16, qn);
      q.swap(qn);
      norm_rows(k.data(), L.k_norm, T * nkv, D, c.eps_head, 16, qn);
      k.swap(qn);
    }
#pragma omp parallel for schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; ++t) {  // RoPE, then append K, V to the row's int8 cache (own position)
      const int64_t pos = rows[t].pos;
      KVCache& kv = *caches[rows[t].seq];
      rope_row(q.data() + t * nh * D, nh, D, L.rope_cos + pos * half, L.rope_sin + pos * half);
      rope_row(k.data() + t * nkv * D, nkv, D, L.rope_cos + pos * half, L.rope_sin + pos * half);
      const int64_t base = kv.row(l, pos) * nkv;  // [rows, nkv] index of (l, pos, 0)
      for (int64_t g = 0; g < nkv; ++g) {
        kv.ka[base + g] = quant8_row(k.data() + (t * nkv + g) * D, D, kv.k.data() + (base + g) * D);
        kv.va[base + g] = quant8_row(v.data() + (t * nkv + g) * D, D, kv.v.data() + (base + g) * D);
      }
    }
    // Every (row, head) in tiles of rows sharing their keys (attention.cpp).
    attend_layer(ks, m, l, caches, rows, T, q.data(), o.data());
    act.from_rows(ks, o.data(), T, nh * D);
    run_linear(ks, L.o, act, T, tmp.data());  // [T, H] Q16
    if (tr) {
      rec(blk + "attn_out", o, {T, nh * D});
      rec(blk + "attn_output", tmp, {T, H});
    }
    if (L.post_attn_norm)
      add_post_norm(x, tmp, L.post_attn_norm, L.post_attn_shift, T, H, c.eps_hidden, h);
    else
      add_residual(x, tmp, T * H);
    // --- feed-forward block ---
    norm_rows(x.data(), L.ffn_norm, T, H, c.eps_hidden, R, h);
    act.from_rows(ks, h.data(), T, H);
    run_linear(ks, L.gate, act, T, gate.data());  // [T, F] Q16
    run_linear(ks, L.up, act, T, up.data());      // [T, F] Q16
    if (tr) {
      rec(blk + "ffn_norm", h, {T, H});
      rec(blk + "ffn_gate", gate, {T, F});  // before SwiGLU overwrites it
      rec(blk + "ffn_up", up, {T, F});
    }
    const auto glu = L.geglu ? ks.geglu : ks.swiglu;
#pragma omp parallel for schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; ++t) glu(gate.data() + t * F, up.data() + t * F, F, gate.data() + t * F);
    act.from_rows(ks, gate.data(), T, F);  // SwiGLU / GeGLU output was Q32
    run_linear(ks, L.down, act, T, tmp.data());
    if (L.post_ffn_norm)
      add_post_norm(x, tmp, L.post_ffn_norm, L.post_ffn_shift, T, H, c.eps_hidden, h);
    else
      add_residual(x, tmp, T * H);
    if (tr) {
      rec(blk + "ffn_swiglu", gate, {T, F});
      rec(blk + "ffn_down", tmp, {T, H});
      rec(blk + "residual", x, {T, H});
    }
  }
  // Final norm and lm_head only for the rows that want logits.
  std::vector<int64_t> sel;
  for (int64_t t = 0; t < T; ++t)
    if (rows[t].want_logits) sel.push_back(t);
  const int64_t Tout = (int64_t)sel.size();
  if (Tout == 0) return;
  std::vector<int64_t> xs((size_t)(Tout * H));
  for (int64_t r = 0; r < Tout; ++r)
    for (int64_t i = 0; i < H; ++i) xs[r * H + i] = x[sel[r] * H + i];
  norm_rows(xs.data(), m.out_norm, Tout, H, c.eps_hidden, R, h);
  act.from_rows(ks, h.data(), Tout, H);
  std::vector<int64_t> lg((size_t)(Tout * c.vocab));
  run_linear(ks, m.output, act, Tout, lg.data());  // [Tout, V] Q16
  if (tr) rec("output", lg, {Tout, c.vocab});
  for (int64_t i = 0; i < Tout * c.vocab; ++i) logits[i] = (int32_t)lg[i];
}

}  // namespace

void forward_rows(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits) {
  // One kernel set for the whole call, whatever set_isa() does meanwhile.
  const Kernels& ks = kernels();
  // Pieces of kForwardRows rows need each sequence's rows in position order
  // (a row reads every earlier position of its sequence); a call with rows
  // out of order runs whole, unless a ring forbids it.
  bool ordered = true, ring = false;
  std::vector<int64_t> last;
  for (int64_t t = 0; t < T; ++t) {
    const size_t s = (size_t)rows[t].seq;
    if (s >= last.size()) last.resize(s + 1, -1);
    ordered = ordered && rows[t].pos > last[s];
    last[s] = rows[t].pos;
    ring = ring || caches[s]->has_ring();
  }
  if (T <= kForwardRows || (!ordered && !ring)) {
    forward_impl(m, caches, rows, T, logits, ks, nullptr);
    return;
  }
  if (!ordered) throw std::invalid_argument("forward_rows: a sequence's rows are not in position order");
  // Split anywhere: every row's logits are the same bits (each op is per row).
  for (int64_t t0 = 0; t0 < T; t0 += kForwardRows) {
    const int64_t n = std::min(kForwardRows, T - t0);
    forward_impl(m, caches, rows + t0, n, logits, ks, nullptr);
    for (int64_t t = t0; t < t0 + n; ++t)
      if (rows[t].want_logits) logits += m.cfg.vocab;
  }
}

void forward_rows_traced(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits,
                         const Kernels& ks, Trace& trace) {
  trace = Trace{};
  forward_impl(m, caches, rows, T, logits, ks, &trace);
}

void forward(const Model& m, KVCache& kv, const int32_t* tokens, int64_t T, int64_t start, bool all_logits,
             int32_t* logits) {
  std::vector<Row> rows((size_t)T);
  for (int64_t t = 0; t < T; ++t) rows[t] = Row{0, start + t, tokens[t], all_logits || t == T - 1};
  KVCache* caches[1] = {&kv};
  forward_rows(m, caches, rows.data(), T, logits);
}

}  // namespace intdet
