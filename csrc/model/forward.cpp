// The decoder forward pass (Llama / Qwen2 / Qwen3 / Gemma 3), integer only.
// Mirrors python/intdet/ref/model.py line for line; formats in comments.
#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "intdet/attention.h"
#include "intdet/intmath.h"
#include "intdet/kernels.h"
#include "intdet/model.h"
#include "intdet/ops.h"
#include "intdet/pool.h"
#include "intdet/trace.h"


namespace intdet {
namespace {

// Rows [0, T) in about 4 chunks per thread, f(t0, t1) per chunk, on the pool
// (intdet/pool.h): for row-wise ops, whose rows do not depend on each other.
template <class F>
void over_rows(int nt, int64_t T, F&& f) {
  const int64_t chunks = std::min<int64_t>(T, 4 * (int64_t)nt);
  parallel_tasks(T > 1 ? nt : 1, chunks, [&](int64_t i) { f(T * i / chunks, T * (i + 1) / chunks); });
}

// int16 activations of T rows (one exponent per row) for the next linear
// layer; with a kernel set that has ActPlanes (kernels.h) and T >= its
// min_rows, also their hi/lo planes (ld > 0), made once here for every
// linear that reads them.
struct Act16 {
  std::vector<int16_t> q;
  std::vector<int32_t> e;
  std::vector<int8_t> hi;
  std::vector<uint8_t> lo;
  int64_t ld = 0;  // plane row bytes; 0: no planes for these rows
  // Sizes q, e and (when the set wants them) the planes for T rows of n.
  void resize(const Kernels& ks, int64_t T, int64_t n) {
    q.resize((size_t)(T * n));
    e.resize((size_t)T);
    ld = ks.planes.linear && T >= ks.planes.min_rows ? ks.planes.ld(n) : 0;
    if (ld) {  // whole blocks of kPlaneRows: the rows past T are read, their results dropped
      const int64_t rows = (T + kPlaneRows - 1) / kPlaneRows * kPlaneRows;
      hi.resize((size_t)(rows * ld));
      lo.resize((size_t)(rows * ld));
    }
  }
  // Row t's exponent and int16 values from x (n values), and its planes.
  void quant_row(const Kernels& ks, const int64_t* x, int64_t t, int64_t n) {
    e[t] = ks.quant16(x, n, q.data() + t * n);
    if (ld) ks.planes.split_row(q.data() + t * n, n, hi.data() + t * ld, lo.data() + t * ld);
  }
  void from_rows(int nt, const Kernels& ks, const int64_t* x, int64_t T, int64_t n) {
    resize(ks, T, n);
    over_rows(nt, T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quant_row(ks, x + t * n, t, n);
    });
  }
};

// Output channels are split into tasks of 16 to 64 channels (16-aligned:
// packed layouts start channel groups there, kernels.h), about 8 or more per
// thread, taken from the pool's shared counter: a thread the OS preempts on a
// shared machine delays the op by at most the block it holds. Each output is
// computed whole by one kernel call on one thread, so neither the split nor
// the thread count can change a bit.
// Prefill (T >= kPrefillRows rows) takes larger blocks, about 4 per thread
// (64 to 512 channels): a call streams all T rows' activations through L2
// once per block, and with 64-channel blocks 512 rows (590 KB at K = 576)
// were re-read from L3 24 times per layer by both cores at once.
constexpr int64_t kPrefillRows = 64;

// The channel blocks of one linear op: block b is [lo(b), hi(b)), 16-aligned.
// Prefill cuts the 16-channel groups into n blocks as equal as possible
// (fixed 80-channel blocks of N = 576 at 2 threads, seven of 80 and one of
// 16, gave one thread 320 channels and the other 256); decode keeps
// power-of-two blocks.
struct Blocks {
  int64_t N, n, groups, rows;  // rows > 0: fixed blocks of `rows` channels
  int64_t lo(int64_t b) const { return rows ? b * rows : 16 * (groups * b / n); }
  int64_t hi(int64_t b) const { return std::min(N, rows ? lo(b) + rows : 16 * (groups * (b + 1) / n)); }
};

inline Blocks channel_blocks(int64_t N, int nt, int64_t T) {
  const int64_t groups = (N + 15) / 16;
  if (T >= kPrefillRows) {
    // about 4 per thread, 64 to 512 channels each
    const int64_t n = std::max<int64_t>(1, std::min(std::max<int64_t>(4 * nt, (groups + 31) / 32), groups / 4));
    return {N, n, groups, 0};
  }
  int64_t rows = 64;
  while (rows > 16 && (N + rows - 1) / rows < 8 * (int64_t)nt) rows /= 2;
  return {N, (N + rows - 1) / rows, groups, rows};
}

// Output channels [lo, hi) of the kernel set's linear layer for L's weight
// format (int8 or int4), on its packed layout when the set reads one: one
// kernel call, on the calling thread. out points at row 0's channel lo;
// rows are ldo apart.
void linear_range(const Kernels& k, const Linear& L, const Act16& a, int64_t T, int64_t* out, int64_t ldo,
                  int64_t lo, int64_t hi) {
  const int16_t* q = a.q.data();
  const int32_t* e = a.e.data();
  const int64_t K = L.K, j0 = lo, n = hi - lo;
  const int32_t* bias = L.bias ? L.bias + j0 : nullptr;
  const void* packed = reads_packed(k, L) ? L.packed[k.packing->id] : nullptr;
  if (L.w4 && packed) {
    const uint8_t* w = static_cast<const uint8_t*>(packed);
    const int64_t row = k.packing->w4.channel_bytes(K);
    k.linear_w4_packed(q, e, T, K, w + j0 * row, nullptr, nullptr, L.mant + j0, L.shift + j0, bias, n, out, ldo);
  } else if (L.w4) {
    const int64_t G = K / kW4Group;
    k.linear_w4(q, e, T, K, L.w4 + j0 * (K / 2), L.gd + j0 * G, L.gm + j0 * G, L.mant + j0, L.shift + j0, bias, n,
                out, ldo);
  } else if (packed && a.ld) {  // the set's planes path (AMX)
    const int8_t* w = static_cast<const int8_t*>(packed) + j0 * k.packing->w8.channel_bytes(K);
    k.planes.linear(a.hi.data(), a.lo.data(), a.ld, e, T, K, w, L.mant + j0, L.shift + j0, bias, n, out, ldo);
  } else {
    const LinearFn fn = packed ? k.linear_packed : k.linear;
    const int8_t* w = packed ? static_cast<const int8_t*>(packed) : L.w;
    const int64_t row = packed ? k.packing->w8.channel_bytes(K) : K;  // bytes per channel
    fn(q, e, T, K, w + j0 * row, L.mant + j0, L.shift + j0, bias, n, out, ldo);
  }
}

// Linear layers of the same output size reading the same activations
// (gate and up; or one layer) in one pool job: a block of channels of every
// layer per task, then post(lo, hi) on that block by the same thread,
// so a channel-wise op (SwiGLU, the residual add, the logits copy) needs no
// pass or barrier of its own.
template <size_t NL, class Post>
void run_linears(int nt, const Kernels& k, const std::array<const Linear*, NL>& Ls, const Act16& a, int64_t T,
                 const std::array<int64_t*, NL>& outs, Post&& post) {
  const int64_t N = Ls[0]->N;
  for (const Linear* L : Ls)
    if (L->N != N) throw std::logic_error("run_linears: layers of different output sizes");
  const Blocks bl = channel_blocks(N, nt, T);
  parallel_tasks(nt, bl.n, [&](int64_t b) {
    const int64_t lo = bl.lo(b), hi = bl.hi(b);
    for (size_t i = 0; i < NL; ++i) linear_range(k, *Ls[i], a, T, outs[i] + lo, N, lo, hi);
    post(lo, hi);
  });
}

// Q, K and V (GQA: K and V smaller) in one pool job: the blocks of all
// three in one task list.
void run_qkv(int nt, const Kernels& k, const Layer& L, const Act16& a, int64_t T, int64_t* q, int64_t* kk,
             int64_t* v) {
  const Linear* Ls[3] = {&L.q, &L.k, &L.v};
  int64_t* outs[3] = {q, kk, v};
  Blocks bl[3];
  int64_t first[4] = {0, 0, 0, 0};  // blocks of layer i are [first[i], first[i+1])
  for (int i = 0; i < 3; ++i) {
    bl[i] = channel_blocks(Ls[i]->N, nt, T);
    first[i + 1] = first[i] + bl[i].n;
  }
  parallel_tasks(nt, first[3], [&](int64_t b) {
    const int i = b < first[1] ? 0 : b < first[2] ? 1 : 2;
    const int64_t lo = bl[i].lo(b - first[i]), hi = bl[i].hi(b - first[i]);
    linear_range(k, *Ls[i], a, T, outs[i] + lo, Ls[i]->N, lo, hi);
  });
}

// Row-wise ops run rows in parallel: each row's result depends on that row
// alone, so the split cannot change a bit.
void norm_rows(int nt, const Kernels& ks, const int64_t* x, const int16_t* g, int64_t T, int64_t n, int64_t eps,
               int in_frac, std::vector<int64_t>& y) {
  y.resize((size_t)(T * n));
  over_rows(nt, T, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> row((size_t)n);
    for (int64_t t = t0; t < t1; ++t) {
      ks.rms_norm(x + t * n, g, n, eps, in_frac, row.data());
      for (int64_t i = 0; i < n; ++i) y[t * n + i] = row[i];
    }
  });
}

// RMSNorm of each row into y (norm units, kept for the trace), then its
// int16 activations, in one pass per row: one pool job, not two.
void norm_quant_rows(int nt, const Kernels& ks, const int64_t* x, const int16_t* g, int64_t T, int64_t n,
                     int64_t eps, int in_frac, std::vector<int64_t>& y, Act16& a) {
  y.resize((size_t)(T * n));
  a.resize(ks, T, n);
  over_rows(nt, T, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> row((size_t)n);
    for (int64_t t = t0; t < t1; ++t) {
      ks.rms_norm(x + t * n, g, n, eps, in_frac, row.data());
      for (int64_t i = 0; i < n; ++i) y[t * n + i] = row[i];
      a.quant_row(ks, y.data() + t * n, t, n);
    }
  });
}

// x[t, lo:hi] = sat32(x + d) for every row: the residual add over one block
// of channels (run_linears' post step).
inline void add_residual_range(const Kernels& ks, int64_t* x, const int64_t* d, int64_t T, int64_t n, int64_t lo,
                               int64_t hi) {
  for (int64_t t = 0; t < T; ++t) ks.add_sat32(x + t * n + lo, d + t * n + lo, hi - lo);
}

// Gemma's post-norm: RMSNorm of a branch output d (Q16) into norm units h,
// then x += shift_round_sat32(h, shift) (to the residual's Q R), saturating.
void add_post_norm(int nt, const Kernels& ks, std::vector<int64_t>& x, const std::vector<int64_t>& d, const int16_t* g,
                   int32_t shift,
                   int64_t T, int64_t H, int64_t eps, std::vector<int64_t>& h) {
  norm_rows(nt, ks, d.data(), g, T, H, eps, 16, h);
  over_rows(nt, T, [&](int64_t t0, int64_t t1) {
    for (int64_t i = t0 * H; i < t1 * H; ++i) x[i] = sat32(x[i] + shift_round_sat32(h[i], shift));
  });
}

// The experts chosen for each row and their weights (Q16): the n_experts_used
// largest router outputs z (Q16 log2 units), ties to the lowest expert id,
// in that order; weights softmax_q16 over those k (norm_topk) or the full
// softmax's entries. Row by row, so no split can change a bit.
void moe_route(int nt, const Layer& L, const int64_t* z, int64_t T, int64_t* sel, int64_t* w) {
  const int64_t E = L.router.N, k = L.n_experts_used;
  over_rows(nt, T, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> idx((size_t)E), zs((size_t)std::max(E, k)), p((size_t)E);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t* zt = z + t * E;
      for (int64_t e = 0; e < E; ++e) idx[(size_t)e] = e;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int64_t a, int64_t b) { return zt[a] != zt[b] ? zt[a] > zt[b] : a < b; });
      if (L.norm_topk) {
        for (int64_t j = 0; j < k; ++j) zs[(size_t)j] = zt[idx[(size_t)j]];
        softmax_q16_row(zs.data(), k, p.data());
        for (int64_t j = 0; j < k; ++j) w[t * k + j] = p[(size_t)j];
      } else {
        softmax_q16_row(zt, E, p.data());
        for (int64_t j = 0; j < k; ++j) w[t * k + j] = p[(size_t)idx[(size_t)j]];
      }
      for (int64_t j = 0; j < k; ++j) sel[t * k + j] = idx[(size_t)j];
    }
  });
}

// Mixture-of-experts FFN of T rows (a: their int16 FFN input) into out
// [T, H]: router, moe_route, then per expert (ascending id) its SwiGLU FFN on
// just the rows that chose it (decode reads only the chosen experts'
// weights), and per row out = round_shift(sum_j w_j * down_j, 16) in exact
// int64 (the grouping cannot change a bit: every linear is row-wise).
// Format of out: the expert down's (Q R, or Q16 before a post-norm).
void moe_ffn(int nt, const Kernels& ks, const Layer& L, const Act16& a, int64_t T, int64_t H,
             std::vector<int64_t>& out, std::vector<int64_t>& z) {
  const int64_t E = L.router.N, k = L.n_experts_used, Fm = L.gate_exps[0].N;
  z.resize((size_t)(T * E));
  run_linears<1>(nt, ks, {&L.router}, a, T, {z.data()}, [](int64_t, int64_t) {});
  std::vector<int64_t> sel((size_t)(T * k)), w((size_t)(T * k));
  moe_route(nt, L, z.data(), T, sel.data(), w.data());
  std::vector<std::vector<int64_t>> slots((size_t)E);  // expert -> t * k + j of the rows choosing it
  for (int64_t i = 0; i < T * k; ++i) slots[(size_t)sel[(size_t)i]].push_back(i);
  std::vector<int64_t> acc((size_t)(T * H), 0), g, u, d;
  Act16 sub, act2;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& sl = slots[(size_t)e];
    const int64_t n = (int64_t)sl.size();
    if (n == 0) continue;
    sub.resize(ks, n, H);  // the rows' int16 inputs (quant16 is per row: the same values)
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = sl[(size_t)r] / k;
      std::copy(a.q.begin() + t * H, a.q.begin() + (t + 1) * H, sub.q.begin() + r * H);
      sub.e[(size_t)r] = a.e[(size_t)t];
      if (sub.ld) ks.planes.split_row(sub.q.data() + r * H, H, sub.hi.data() + r * sub.ld, sub.lo.data() + r * sub.ld);
    }
    g.resize((size_t)(n * Fm));
    u.resize((size_t)(n * Fm));
    run_linears<2>(nt, ks, {&L.gate_exps[(size_t)e], &L.up_exps[(size_t)e]}, sub, n, {g.data(), u.data()},
                   [&](int64_t lo, int64_t hi) {
                     for (int64_t r = 0; r < n && hi > lo; ++r)
                       ks.swiglu(g.data() + r * Fm + lo, u.data() + r * Fm + lo, hi - lo, g.data() + r * Fm + lo);
                   });
    act2.from_rows(nt, ks, g.data(), n, Fm);
    d.resize((size_t)(n * H));
    run_linears<1>(nt, ks, {&L.down_exps[(size_t)e]}, act2, n, {d.data()}, [](int64_t, int64_t) {});
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = sl[(size_t)r] / k, wt = w[(size_t)sl[(size_t)r]];
      for (int64_t i = 0; i < H; ++i) acc[(size_t)(t * H + i)] += wt * d[(size_t)(r * H + i)];
    }
  }
  out.resize((size_t)(T * H));
  for (int64_t i = 0; i < T * H; ++i) out[(size_t)i] = round_shift(acc[(size_t)i], kProbFrac);
}

// Op timer for set_op_profile (trace.h): mark(op, layer) charges the time
// since the previous mark to (layer, op). Reads no clock while profiling is off.
class OpClock {
 public:
  OpClock() : on_(op_profile_on()) {
    if (on_) start_ = last_ = std::chrono::steady_clock::now();
  }
  void mark(const char* op, int64_t layer) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    times_.push_back({op, layer, 1, std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count()});
    last_ = now;
  }
  ~OpClock() {
    if (!on_) return;
    times_.push_back({"forward", -1, 1,
                      std::chrono::duration_cast<std::chrono::nanoseconds>(last_ - start_).count()});
    op_profile_add(times_);
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point start_, last_;
  std::vector<OpTime> times_;
};

// The forward pass on kernel set ks; tr, when not null, receives the named
// intermediates (one test per site and layer when null, nothing per row).
// Parallel structure (intdet/pool.h, not OpenMP): each linear op is one pool
// job over blocks of output channels (run_linears), Q/K/V and gate/up share one, and SwiGLU, the
// residual adds and the logits copy run inside them on each block; RMSNorm
// and the int16 quantization of its output are one row-parallel pass. The
// caller takes tasks and waits only for tasks in flight: no team barrier.
void forward_impl(const Model& m, KVCache* const* caches, const Row* rows, int64_t T, int32_t* logits,
                  const Kernels& ks, Trace* tr) {
  ensure_packed(m, ks);  // the set's packed copies (made now if the set was chosen after load)
  OpClock clk;
  const int nt = forward_threads();  // fixed, or auto: fewer when other processes hold cores
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
  // The activations live in this thread's buffers from one forward to the
  // next (about 30 MB at 512 rows of SmolLM2): fresh vectors were zeroed and
  // page-faulted in again on every call. Every element a forward reads it
  // writes first, so nothing depends on what a previous call left.
  struct Buffers {
    std::vector<int64_t> x, h, q, k, v, o, tmp, gate, up, qn;
    Act16 act;
  };
  thread_local Buffers buf;
  std::vector<int64_t>& x = buf.x;  // residual [T, H] int32 values, Q16
  std::vector<int64_t> &h = buf.h, &q = buf.q, &k = buf.k, &v = buf.v, &o = buf.o, &tmp = buf.tmp;
  std::vector<int64_t> &gate = buf.gate, &up = buf.up, &qn = buf.qn;
  x.resize((size_t)(T * H));
  q.resize((size_t)(T * nh * D));
  k.resize((size_t)(T * nkv * D));
  v.resize((size_t)(T * nkv * D));
  o.resize((size_t)(T * nh * D));
  tmp.resize((size_t)(T * H));
  gate.resize((size_t)(T * F));
  up.resize((size_t)(T * F));
  Act16& act = buf.act;

  // Embedding: int8 row times its dyadic scale -> residual Q R.
  over_rows(nt, T, [&](int64_t t0, int64_t t1) {
    std::vector<int8_t> buf(m.tok_embd_packed ? (size_t)H : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t tok = rows[t].token;
      const int8_t* e = m.tok_embd + tok * H;
      if (m.tok_embd_packed) {
        m.tok_embd_row(m.tok_embd_packed, H, tok, buf.data());
        e = buf.data();
      }
      for (int64_t i = 0; i < H; ++i) x[t * H + i] = shift_round_sat32((int64_t)e[i] * m.embd_mant[tok], m.embd_shift[tok]);
    }
  });
  if (tr) rec("tok_embd", x, {T, H});
  clk.mark("embed", -1);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = m.layers[l];
    const std::string blk = tr ? "blk." + std::to_string(l) + "." : "";
    // --- attention block ---
    if (L.attn_norm)
      norm_quant_rows(nt, ks, x.data(), L.attn_norm, T, H, c.eps_hidden, R, h, act);  // [T, H] norm units, int16
    else
      act.from_rows(nt, ks, x.data(), T, H);  // no pre-norm (OLMo 2): the residual (Q R) itself, int16
    clk.mark("attn_norm", l);
    run_qkv(nt, ks, L, act, T, q.data(), k.data(), v.data());  // Q16
    clk.mark("attn_qkv", l);
    if (tr) {
      if (L.attn_norm) rec(blk + "attn_norm", h, {T, H});
      rec(blk + "attn_q", q, {T, nh, D});
      rec(blk + "attn_k", k, {T, nkv, D});
      rec(blk + "attn_v", v, {T, nkv, D});
    }
    if (L.q_norm && L.qk_norm_projection) {  // q/k RMSNorm over the whole projection (OLMo 2)
      norm_rows(nt, ks, q.data(), L.q_norm, T, nh * D, c.eps_q, 16, qn);
      q.swap(qn);
      norm_rows(nt, ks, k.data(), L.k_norm, T, nkv * D, c.eps_k, 16, qn);
      k.swap(qn);
      clk.mark("qk_norm", l);
    } else if (L.q_norm) {  // the block has per-head q/k RMSNorm (Qwen3, Gemma 3)
      norm_rows(nt, ks, q.data(), L.q_norm, T * nh, D, c.eps_head, 16, qn);
      q.swap(qn);
      norm_rows(nt, ks, k.data(), L.k_norm, T * nkv, D, c.eps_head, 16, qn);
      k.swap(qn);
      clk.mark("qk_norm", l);
    }
    // RoPE, then append K, V to the row's int8 cache (own position). Runs
    // of consecutive rows per task: a prompt's positions are adjacent in
    // the cache's int32 scales (16 to a cache line), which tasks of one row
    // each wrote from both threads at once.
    over_rows(nt, T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t pos = rows[t].pos;
        KVCache& kv = *caches[rows[t].seq];
        if (L.rope_cos) {  // null: a NoPE layer (SmolLM3)
          ks.rope(q.data() + t * nh * D, nh, D, L.rope_cos + pos * half, L.rope_sin + pos * half);
          ks.rope(k.data() + t * nkv * D, nkv, D, L.rope_cos + pos * half, L.rope_sin + pos * half);
        }
        const int64_t r = kv.row(l, pos);
        for (int64_t g = 0; g < nkv; ++g) {
          const int64_t i = kv.at(l, r, g);
          kv.ka[i] = ks.quant8_row(k.data() + (t * nkv + g) * D, D, kv.k.data() + i * D);
          kv.va[i] = ks.quant8_row(v.data() + (t * nkv + g) * D, D, kv.v.data() + i * D);
        }
      }
    });
    clk.mark("rope_kv", l);
    // Every (row, head) in tiles of rows sharing their keys (attention.cpp).
    attend_layer(nt, ks, m, l, caches, rows, T, q.data(), o.data());
    clk.mark("attention", l);
    act.from_rows(nt, ks, o.data(), T, nh * D);
    if (tr) rec(blk + "attn_out", o, {T, nh * D});
    // [T, H] Q16; without a post-norm the residual add runs on each block as it is made
    const bool fuse_attn_add = !L.post_attn_norm && !tr;
    run_linears<1>(nt, ks, {&L.o}, act, T, {tmp.data()}, [&](int64_t lo, int64_t hi) {
      if (fuse_attn_add) add_residual_range(ks, x.data(), tmp.data(), T, H, lo, hi);
    });
    if (tr) rec(blk + "attn_output", tmp, {T, H});
    if (L.post_attn_norm)
      add_post_norm(nt, ks, x, tmp, L.post_attn_norm, L.post_attn_shift, T, H, c.eps_hidden, h);
    else if (!fuse_attn_add)
      add_residual_range(ks, x.data(), tmp.data(), T, H, 0, H);
    clk.mark("attn_output", l);
    // --- feed-forward block ---
    if (L.ffn_norm)
      norm_quant_rows(nt, ks, x.data(), L.ffn_norm, T, H, c.eps_hidden, R, h, act);
    else
      act.from_rows(nt, ks, x.data(), T, H);
    clk.mark("ffn_norm", l);
    if (!L.gate_exps.empty()) {  // mixture of experts
      if (tr && L.ffn_norm) rec(blk + "ffn_norm", h, {T, H});  // before a post-norm reuses h
      moe_ffn(nt, ks, L, act, T, H, tmp, up);
      if (L.post_ffn_norm)
        add_post_norm(nt, ks, x, tmp, L.post_ffn_norm, L.post_ffn_shift, T, H, c.eps_hidden, h);
      else
        add_residual_range(ks, x.data(), tmp.data(), T, H, 0, H);
      if (tr) {
        rec(blk + "ffn_gate_inp", up, {T, L.router.N});
        rec(blk + "ffn_down", tmp, {T, H});
        rec(blk + "residual", x, {T, H});
      }
      clk.mark("ffn_moe", l);
      continue;
    }
    const auto glu = L.geglu ? ks.geglu : ks.swiglu;
    // gate and up go in the same channel blocks, so the thread that made a
    // block runs SwiGLU / GeGLU on it (elementwise: the split cannot change a bit);
    // the trace needs gate before it is overwritten, so it runs GLU after.
    run_linears<2>(nt, ks, {&L.gate, &L.up}, act, T, {gate.data(), up.data()}, [&](int64_t lo, int64_t hi) {
      if (tr || hi <= lo) return;
      for (int64_t t = 0; t < T; ++t) glu(gate.data() + t * F + lo, up.data() + t * F + lo, hi - lo, gate.data() + t * F + lo);
    });
    if (tr) {
      if (L.ffn_norm) rec(blk + "ffn_norm", h, {T, H});
      rec(blk + "ffn_gate", gate, {T, F});  // before SwiGLU overwrites it
      rec(blk + "ffn_up", up, {T, F});
      over_rows(nt, T, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) glu(gate.data() + t * F, up.data() + t * F, F, gate.data() + t * F);
      });
    }
    clk.mark("ffn_gate_up", l);
    act.from_rows(nt, ks, gate.data(), T, F);  // SwiGLU / GeGLU output was Q32
    const bool fuse_ffn_add = !L.post_ffn_norm;
    run_linears<1>(nt, ks, {&L.down}, act, T, {tmp.data()}, [&](int64_t lo, int64_t hi) {
      if (fuse_ffn_add) add_residual_range(ks, x.data(), tmp.data(), T, H, lo, hi);
    });
    if (L.post_ffn_norm) add_post_norm(nt, ks, x, tmp, L.post_ffn_norm, L.post_ffn_shift, T, H, c.eps_hidden, h);
    if (tr) {
      rec(blk + "ffn_swiglu", gate, {T, F});
      rec(blk + "ffn_down", tmp, {T, H});
      rec(blk + "residual", x, {T, H});
    }
    clk.mark("ffn_down", l);
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
  norm_quant_rows(nt, ks, xs.data(), m.out_norm, Tout, H, c.eps_hidden, R, h, act);
  const int64_t V = c.vocab;
  // Logits [Tout, V] Q16, int32 (the epilogue saturates to int32): each
  // block of channels made into the task's own Tout x block scratch and
  // copied out by the thread that made it. A whole [Tout, V] int64 array
  // (100 MB at 256 rows of a 49k vocab, as compression's prefill asks)
  // was zero-filled by one thread, then written and read once more.
  const Blocks bl = channel_blocks(V, nt, Tout);
  parallel_tasks(nt, bl.n, [&](int64_t b) {
    const int64_t lo = bl.lo(b), hi = bl.hi(b), n = hi - lo;
    thread_local std::vector<int64_t> blk;
    if ((int64_t)blk.size() < Tout * n) blk.resize((size_t)(Tout * n));
    linear_range(ks, m.output, act, Tout, blk.data(), n, lo, hi);
    const Softcap& sc = m.final_softcap;  // Gemma 2: c tanh(logits / c), still Q16
    for (int64_t r = 0; r < Tout; ++r)
      for (int64_t i = 0; i < n; ++i)
        logits[r * V + lo + i] =
            (int32_t)(sc.cap ? softcap(blk[r * n + i], sc) : blk[r * n + i]);
  });
  if (tr) rec("output", std::vector<int64_t>(logits, logits + Tout * V), {Tout, V});
  clk.mark("output", -1);
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
