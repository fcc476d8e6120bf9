// The CUDA engine's forward pass: enqueues csrc/model/forward.cpp's steps
// kernel by kernel (kernels in kernels_*.cu; launch shapes in
// launch_shapes.cuh), captures decode steps once per shape into CUDA graphs
// and replays them; traced and profiled calls.
#include "engine_state.h"

namespace intdet {
namespace cuda {
namespace {

void lin(DeviceModel& m, const DevLinear& L, int64_t T, int32_t* out, bool residual) {
  if (L.w4) {
    launch_linear_w4(m.ws.act.p, m.ws.act_e.p, (int)T, (int)L.K, L.w4, L.gd, L.gm, L.mant, L.shift, L.bias, (int)L.N,
                     out, L.N, residual, kLinearAuto, m.stream);
    return;
  }
  const GemmScratch sc{m.ws.gemm_part.p, m.ws.gemm_cnt.p};
  launch_linear(m.ws.act.p, m.ws.act_e.p, (int)T, (int)L.K, L.w, L.mant, L.shift, L.bias, (int)L.N, out, L.N, residual,
                kLinearAuto, m.stream, sc.part ? &sc : nullptr);
}

// Bytes of weights a linear layer reads (int8, or int4 codes + group step and offset).
int64_t lin_bytes(const DevLinear& L) { return L.w ? L.N * L.K : L.N * L.K / 2 + L.N * (L.K / 32) * 4; }
void mark(DeviceModel& m, const char* name, int64_t bytes) {
  if (m.prof) m.prof->mark(name, bytes, m.stream);
}

// Decode-sized calls with int8 weights fuse linear layers into one GEMV
// launch (the GEMV's rows; more rows take the skinny GEMM layer by layer).
bool fused_gemv(const DevLinear& L, int64_t T) { return L.w && T <= kGemvDecodeRows; }
GemvSeg seg(const DevLinear& L, int32_t* out) {
  return GemvSeg{L.w, L.mant, L.shift, L.bias, out, L.N, (int)L.N, 0};
}

// A GEMV's input computed in its prologue by every block (kernels.cuh
// GemvIn) instead of a separate launch before it: the RMSNorm + quant16 of
// the residual x with gamma g, or the quant16 of the
// GLU rows a. Only for GEMV-sized calls (T <= kPrologueRows, int8 weights,
// the rows in shared memory) and never when tracing (the trace records the
// normed rows that the separate launch stores).
GemvIn norm_in(const DeviceModel& m, const int16_t* g) {
  return GemvIn{kGemvNorm, m.ws.x.p, g, m.cfg.eps_hidden, (int)m.cfg.residual_frac, nullptr};
}
GemvIn quant_in(const DeviceModel& m) { return GemvIn{kGemvQuant, nullptr, nullptr, 0, 0, m.ws.a.p}; }
bool prologue_ok(const DevLinear& L, int64_t T, const GemvIn& in, const Tracer* tr) {
  return L.w && !tr && gemv_prologue_fits(in.kind, (int)T, (int)L.K);
}
// One linear layer as a GEMV whose prologue computes its input (in).
void lin_in(DeviceModel& m, const DevLinear& L, int64_t T, int32_t* out, bool residual, const GemvIn& in) {
  GemvSegs s{};
  s.s[0] = seg(L, out);
  s.n = 1;
  launch_gemv(m.ws.act.p, m.ws.act_e.p, (int)T, (int)L.K, s, residual, m.stream, in);
}

// Mixture-of-experts FFN of T rows (act: their int16 FFN input) into the
// residual x: router, route (device top-k), the chosen experts' SwiGLU FFNs
// on the T * k gathered rows, the weighted sum. Fixed launch shapes for T,
// so a decode step is graph-captured as a dense one; only the chosen
// experts' weight rows are read.
void enqueue_moe(DeviceModel& m, const DevLayer& L, int64_t T, Tracer* tr, const std::string& blk) {
  Workspace& w = m.ws;
  const cudaStream_t st = m.stream;
  const int E = (int)L.n_experts, k = (int)L.n_experts_used, Fm = L.gate_exps.N, H = (int)m.cfg.hidden;
  const int G = (int)(T * k);
  lin(m, L.router, T, w.moe_z.p, false);  // [T, E] Q16 log2 units
  launch_moe_route(w.moe_z.p, (int)T, E, k, L.norm_topk, w.moe_sel.p, w.moe_w.p, st);
  launch_moe_linear(w.act.p, w.act_e.p, G, k, L.gate_exps, w.moe_sel.p, w.moe_g.p, st);  // [G, Fm] Q16
  launch_moe_linear(w.act.p, w.act_e.p, G, k, L.up_exps, w.moe_sel.p, w.moe_u.p, st);
  launch_swiglu(w.moe_g.p, w.moe_u.p, (int64_t)G * Fm, w.moe_a.p, st);  // Q32 int64
  launch_quant16_i64(w.moe_a.p, G, Fm, w.moe_act.p, w.moe_act_e.p, st);
  launch_moe_linear(w.moe_act.p, w.moe_act_e.p, G, 1, L.down_exps, w.moe_sel.p, w.moe_d.p, st);  // [G, H]
  launch_moe_combine(w.moe_d.p, w.moe_w.p, (int)T, k, H, w.x.p, tr ? w.moe_comb.p : nullptr, st);
  if (tr) {
    tr->rec(blk + "ffn_gate_inp", w.moe_z.p, {T, E});
    tr->rec(blk + "ffn_down", w.moe_comb.p, {T, H});
    tr->rec(blk + "residual", w.x.p, {T, H});
  }
  const auto exp_bytes = [&](const MoeLinear& X) {
    return (int64_t)(X.w ? X.N * X.K : X.N * X.K / 2 + X.N * (X.K / 32) * 4);
  };
  mark(m, "ffn_moe", lin_bytes(L.router) + (int64_t)k * (exp_bytes(L.gate_exps) + exp_bytes(L.up_exps) + exp_bytes(L.down_exps)));
}

// All layers for T rows (metadata already on the device); no host sync
// unless tr (then each named step is copied to the host after it runs).
void enqueue_body(DeviceModel& m, int64_t T, int64_t sstride, int64_t rows_per, Tracer* tr) {
  const Config& c = m.cfg;
  Workspace& w = m.ws;
  const AttnScratch asc{w.scratch.p, sstride, w.zpart.p, w.shifts.p, w.counters.p, w.oacc.p, rows_per,
                        attn_max_splits(sstride), w.attn_npos};
  const cudaStream_t st = m.stream;
  const int H = (int)c.hidden, nh = (int)c.n_heads, nkv = (int)c.n_kv, D = (int)c.head_dim;
  const int64_t F = c.ffn;
  int32_t* normed = tr ? w.traced.p : nullptr;  // the norms also store their int32 rows when tracing
  const int R = (int)c.residual_frac;  // residual Q R
  launch_embed(w.tokens(), m.tok_embd, m.embd_mant, m.embd_shift, (int)T, H, w.x.p, st);
  if (tr) tr->rec("tok_embd", w.x.p, {T, H});
  mark(m, "embed", T * H);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const DevLayer& L = m.layers[(size_t)l];
    const std::string blk = tr ? "blk." + std::to_string(l) + "." : "";
    // --- attention block ---
    const bool qkv_fused = fused_gemv(L.q, T) && L.k.w && L.v.w && L.k.K == L.q.K && L.v.K == L.q.K;
    GemvIn qkv_in{};  // attn_norm in the q+k+v GEMV's prologue, else act from a launch here
    if (L.attn_norm && qkv_fused && prologue_ok(L.q, T, norm_in(m, L.attn_norm), tr))
      qkv_in = norm_in(m, L.attn_norm);
    else if (!L.attn_norm)  // no pre-norm (OLMo 2): the residual itself to int16
      launch_quant16_i32(w.x.p, (int)T, H, w.act.p, w.act_e.p, st);
    else
      launch_norm_quant16(w.x.p, nullptr, L.attn_norm, (int)T, H, c.eps_hidden, R, w.act.p, w.act_e.p, st, normed);
    if (tr && L.attn_norm) tr->rec(blk + "attn_norm", normed, {T, H});
    mark(m, "attn_norm", T * H * 4);
    // decode batches and prefill: q, k, v in one skinny GEMM launch
    const bool skinny = T > kGemvDecodeRows && (T <= kSkinnyMaxRows || prefill_gemm() == kLinearSkinny);
    const bool qkv_skinny = !qkv_fused && L.q.w && L.k.w && L.v.w && skinny && L.k.K == L.q.K && L.v.K == L.q.K;
    if (qkv_fused || qkv_skinny) {  // q, k, v: one launch
      GemvSegs s{};
      s.s[0] = seg(L.q, w.qb.p);
      s.s[1] = seg(L.k, w.kb.p);
      s.s[2] = seg(L.v, w.vb.p);
      s.n = 3;
      if (qkv_fused) {
        launch_gemv(w.act.p, w.act_e.p, (int)T, (int)L.q.K, s, false, st, qkv_in);
      } else {
        const GemmScratch sc{w.gemm_part.p, w.gemm_cnt.p};
        launch_skinny(w.act.p, w.act_e.p, (int)T, (int)L.q.K, s, false, st, &sc);
      }
    } else {
      lin(m, L.q, T, w.qb.p, false);  // [T, nh*D] Q16
      lin(m, L.k, T, w.kb.p, false);  // [T, nkv*D]
      lin(m, L.v, T, w.vb.p, false);
    }
    mark(m, "qkv", lin_bytes(L.q) + lin_bytes(L.k) + lin_bytes(L.v));
    if (tr) {  // before norm_rope rewrites q and k in place
      tr->rec(blk + "attn_q", w.qb.p, {T, nh, D});
      tr->rec(blk + "attn_k", w.kb.p, {T, nkv, D});
      tr->rec(blk + "attn_v", w.vb.p, {T, nkv, D});
    }
    // q_norm / k_norm are null unless the block has per-head q/k RMSNorm.
    // q/k norm + RoPE of q and k, and the KV append: one launch.
    // Decode rows of distinct sequences (w.fold_rope): the attention's scores
    // kernel runs it instead (RopeFold), one launch fewer.
    // A projection-wide q/k norm (OLMo 2) runs first, on whole rows; the
    // per-head step then has no norm.
    const int16_t* head_q_norm = L.qk_norm_projection ? nullptr : L.q_norm;
    const int16_t* head_k_norm = L.qk_norm_projection ? nullptr : L.k_norm;
    if (L.q_norm && L.qk_norm_projection) {
      launch_norm_rows(w.qb.p, L.q_norm, (int)T, nh * D, c.eps_q, st);
      launch_norm_rows(w.kb.p, L.k_norm, (int)T, nkv * D, c.eps_k, st);
    }
    RopeFold rf{};
    if (w.fold_rope && !tr)
      rf = RopeFold{1, head_q_norm, head_k_norm, c.eps_head, L.rope_cos, L.rope_sin, w.kb.p, w.vb.p};
    else
      launch_rope_append(w.qb.p, w.kb.p, w.vb.p, (int)T, nh, nkv, D, head_q_norm, head_k_norm, c.eps_head, w.pos(),
                         L.rope_cos, L.rope_sin, (int)l, w.seq(), w.kvs.p, st);
    mark(m, "rope_append", T * (nh + 2 * nkv) * D * 4);
    for (int64_t r0 = 0; r0 < T; r0 += rows_per)
      launch_attention(w.qb.p, (int)r0, (int)std::min(rows_per, T - r0), nh, nkv, D, (int)l, w.seq(), w.pos(),
                       w.kvs.p, L.score_mant, L.score_shift, asc, w.o.p, w.act.p, w.act_e.p, st, L.window, 0,
                       kAttnAuto, rf, L.attn_softcap);
    mark(m, "attention", m.prof ? m.prof->attn_bytes : 0);
    if (tr) tr->rec(blk + "attn_out", w.o.p, {T, nh * D});
    if (L.post_attn_norm) {  // o-proj (Q16), its RMSNorm, then into the residual
      lin(m, L.o, T, w.branch.p, false);
      if (tr) tr->rec(blk + "attn_output", w.branch.p, {T, H});
      launch_post_norm_add(w.branch.p, L.post_attn_norm, (int)T, H, c.eps_hidden, L.post_attn_shift, w.x.p, st);
    } else {
      if (tr) {  // the projection alone: the same kernel once more, storing instead of adding
        lin(m, L.o, T, w.traced.p, false);
        tr->rec(blk + "attn_output", w.traced.p, {T, H});
      }
      lin(m, L.o, T, w.x.p, true);  // x = sat32(x + o-proj)
    }
    mark(m, "o_proj", lin_bytes(L.o));
    // --- feed-forward block ---
    const bool gate_up_fused = !L.n_experts && fused_gemv(L.gate, T) && L.up.w && L.up.K == L.gate.K &&
                               L.up.N == L.gate.N;
    GemvIn ffn_in{};  // ffn_norm in the gate+up GEMV's prologue, else act from a launch here
    if (L.ffn_norm && gate_up_fused && prologue_ok(L.gate, T, norm_in(m, L.ffn_norm), tr))
      ffn_in = norm_in(m, L.ffn_norm);
    else if (!L.ffn_norm)
      launch_quant16_i32(w.x.p, (int)T, H, w.act.p, w.act_e.p, st);
    else
      launch_norm_quant16(w.x.p, nullptr, L.ffn_norm, (int)T, H, c.eps_hidden, R, w.act.p, w.act_e.p, st, normed);
    if (tr && L.ffn_norm) tr->rec(blk + "ffn_norm", normed, {T, H});
    mark(m, "ffn_norm", T * H * 4);
    if (L.n_experts) {  // mixture of experts: forward.cpp moe_ffn's values, routed on the device
      enqueue_moe(m, L, T, tr, blk);
      continue;
    }
    // decode batches and prefill: gate and up in one skinny GEMM launch, the GLU in its epilogue
    const bool gate_up_skinny = !gate_up_fused && L.gate.w && L.up.w && skinny && L.up.K == L.gate.K &&
                                L.up.N == L.gate.N;
    if (gate_up_fused || gate_up_skinny) {  // gate and up in one launch, SwiGLU / GeGLU of each pair in its epilogue
      GemvSegs s{};
      s.s[0] = seg(L.gate, w.gate.p);
      s.s[1] = seg(L.up, w.up.p);
      s.n = 2;
      s.glu = L.geglu ? 2 : 1;
      s.glu_out = w.a.p;
      s.glu_ldo = F;
      if (gate_up_fused) {
        launch_gemv(w.act.p, w.act_e.p, (int)T, (int)L.gate.K, s, false, st, ffn_in);
      } else {
        const GemmScratch sc{w.gemm_part.p, w.gemm_cnt.p};
        launch_skinny(w.act.p, w.act_e.p, (int)T, (int)L.gate.K, s, false, st, &sc);
      }
    } else {
      lin(m, L.gate, T, w.gate.p, false);  // [T, F] Q16
      lin(m, L.up, T, w.up.p, false);
      if (L.geglu)
        launch_geglu(w.gate.p, w.up.p, T * F, w.a.p, st);  // Q32 int64
      else
        launch_swiglu(w.gate.p, w.up.p, T * F, w.a.p, st);
    }
    mark(m, "gate_up_glu", lin_bytes(L.gate) + lin_bytes(L.up));
    // quant16 of the GLU rows in the down-proj GEMV's prologue, else here
    const bool down_in = prologue_ok(L.down, T, quant_in(m), tr);
    if (!down_in) launch_quant16_i64(w.a.p, (int)T, (int)F, w.act.p, w.act_e.p, st);
    mark(m, "quant16_ffn", down_in ? 0 : T * F * 8);
    if (tr) {
      tr->rec(blk + "ffn_gate", w.gate.p, {T, F});
      tr->rec(blk + "ffn_up", w.up.p, {T, F});
      tr->rec(blk + "ffn_swiglu", w.a.p, {T, F});
    }
    if (L.post_ffn_norm) {
      if (down_in)
        lin_in(m, L.down, T, w.branch.p, false, quant_in(m));
      else
        lin(m, L.down, T, w.branch.p, false);
      if (tr) tr->rec(blk + "ffn_down", w.branch.p, {T, H});
      launch_post_norm_add(w.branch.p, L.post_ffn_norm, (int)T, H, c.eps_hidden, L.post_ffn_shift, w.x.p, st);
    } else {
      if (tr) {
        lin(m, L.down, T, w.traced.p, false);
        tr->rec(blk + "ffn_down", w.traced.p, {T, H});
      }
      if (down_in)
        lin_in(m, L.down, T, w.x.p, true, quant_in(m));  // x = sat32(x + down-proj)
      else
        lin(m, L.down, T, w.x.p, true);
    }
    mark(m, "down_proj", lin_bytes(L.down));
    if (tr) tr->rec(blk + "residual", w.x.p, {T, H});
  }
}

// Final norm and lm_head for selected rows r0..r0+nr-1 (w.sel) into w.logits
// rows at..at+nr-1.
void enqueue_head(DeviceModel& m, int64_t r0, int64_t nr, int64_t at = 0) {
  Workspace& w = m.ws;
  int32_t* out = w.logits.p + at * m.cfg.vocab;
  // A launch of its own: in the lm_head GEMV's prologue every one of its
  // V / 8 blocks would repeat the norm (Qwen3: 19k times, more issue time
  // than the 156 MB of weights take).
  launch_norm_quant16(w.x.p, w.sel() + r0, m.out_norm, (int)nr, (int)m.cfg.hidden, m.cfg.eps_hidden,
                      (int)m.cfg.residual_frac, w.act.p, w.act_e.p, m.stream);
  mark(m, "out_norm", nr * m.cfg.hidden * 4);
  lin(m, m.output, nr, out, false);  // [nr, V] Q16
  if (m.final_softcap.cap) launch_softcap(out, nr * m.cfg.vocab, m.final_softcap, m.stream);  // Gemma 2
  mark(m, "lm_head", lin_bytes(m.output));
}

// The logits path (docs/cuda.md): nr rows of w.logits for host rows
// logits[0..nr). One slice (at most logits_slice_rows() rows): the lm_head,
// then one copy on m.stream. More: the lm_head slice by slice, an event
// after each (in a capture an external event record node, recorded by every
// launch of the graph), then copy_slices.
int64_t n_slices(int64_t nr) { return (nr + logits_slice_rows() - 1) / logits_slice_rows(); }

void make_slice_events(DeviceModel& m, int64_t n) {
  if (!m.copy_stream) {
    ck(cudaStreamCreateWithFlags(&m.copy_stream, cudaStreamNonBlocking), "cudaStreamCreate (logits copies)");
    ck(cudaEventCreateWithFlags(&m.copies_done, cudaEventDisableTiming), "cudaEventCreate");
  }
  while ((int64_t)m.slice_done.size() < n) {
    cudaEvent_t e = nullptr;
    ck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    m.slice_done.push_back(e);
  }
}

void enqueue_head_slices(DeviceModel& m, int64_t r0, int64_t nr, bool capturing) {
  const int64_t S = logits_slice_rows(), n = n_slices(nr);
  if (n == 1) return enqueue_head(m, r0, nr);
  for (int64_t i = 0; i < n; ++i) {
    enqueue_head(m, r0 + i * S, std::min(S, nr - i * S), i * S);
    ck(cudaEventRecordWithFlags(m.slice_done[(size_t)i], m.stream, capturing ? cudaEventRecordExternal : 0),
       "cudaEventRecord (lm_head slice)");
  }
}

// The copies of a head's nr rows: one on m.stream, or (several slices) each
// slice's on the copy stream once its event has run, then copies_done.
void copy_slices(DeviceModel& m, int32_t* logits, int64_t nr) {
  const int64_t V = m.cfg.vocab, S = logits_slice_rows(), n = n_slices(nr);
  Workspace& w = m.ws;
  if (n == 1) {
    ck(cudaMemcpyAsync(logits, w.logits.p, (size_t)(nr * V) * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
       "cudaMemcpyAsync (logits)");
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ns = std::min(S, nr - i * S);
    ck(cudaStreamWaitEvent(m.copy_stream, m.slice_done[(size_t)i], 0), "cudaStreamWaitEvent");
    ck(cudaMemcpyAsync(logits + i * S * V, w.logits.p + i * S * V, (size_t)(ns * V) * sizeof(int32_t),
                       cudaMemcpyDeviceToHost, m.copy_stream),
       "cudaMemcpyAsync (logits slice)");
  }
  ck(cudaEventRecord(m.copies_done, m.copy_stream), "cudaEventRecord");
}

// m.stream waits for the copies of copy_slices (w.logits is free again).
void wait_copies(DeviceModel& m, int64_t nr) {
  if (n_slices(nr) > 1) ck(cudaStreamWaitEvent(m.stream, m.copies_done, 0), "cudaStreamWaitEvent");
}

void forward_chunk(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                   int32_t* logits, Tracer* tr, const ChunkOpts* opt = nullptr) {
  const Config& c = m.cfg;
  Workspace& w = m.ws;
  const int64_t H = c.hidden, F = c.ffn, nh = c.n_heads, nkv = c.n_kv, D = c.head_dim, V = c.vocab;
  int64_t Tout = 0, nmax = 1, maxlen = 1;
  for (int64_t t = 0; t < T; ++t) {
    Tout += rows[t].want_logits ? 1 : 0;
    nmax = std::max(nmax, rows[t].pos + 1);
  }
  for (int64_t i = 0; i < n_states; ++i) maxlen = std::max(maxlen, states[i]->kv.max_len);
  // Rows of distinct sequences (decode): the decode attention with the
  // rope_append folded in (RopeFold), and a graph up to kDecodeGraphRows rows.
  bool distinct = T <= kDecodeGraphRows;
  for (int64_t t = 1; t < T && distinct; ++t)
    for (int64_t u = 0; u < t; ++u)
      if (rows[u].seq == rows[t].seq) {
        distinct = false;
        break;
      }
  // traced or profiled: no graph; other calls up to kGemvMaxRows rows (short
  // prefill chunks) too, as before
  const bool graph = m.use_graphs && (T <= kGemvMaxRows || distinct) && !tr && !m.prof;
  // Scratch row stride: the longest cache for graphs (replayed as sequences
  // grow), else this call's longest row, rounded up.
  const int64_t sstride = graph ? maxlen : (nmax + 255) / 256 * 256;
  const int64_t rows_per = std::max<int64_t>(1, std::min<int64_t>({T, 65535, kScratchBudget / (nh * sstride * 4)}));
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(Tout, logits_group_rows(V)));
  const int64_t cap = std::max(T, w.rows);
  bool moved = false;
  if (cap > w.rows || !w.meta.p) {
    moved |= w.meta.grow((size_t)(4 * cap));
    w.h_meta.grow((size_t)(4 * cap));
    w.rows = cap;
  }
  const int64_t kmax = std::max({H, nh * D, F});
  moved |= w.kvs.grow((size_t)std::max<int64_t>(n_states, 1));
  w.h_kvs.grow((size_t)std::max<int64_t>(n_states, 1));
  moved |= w.x.grow((size_t)(cap * H));
  moved |= w.branch.grow((size_t)(cap * H));
  moved |= w.act.grow((size_t)(cap * kmax));
  moved |= w.act_e.grow((size_t)cap);
  moved |= w.qb.grow((size_t)(cap * nh * D));
  moved |= w.kb.grow((size_t)(cap * nkv * D));
  moved |= w.vb.grow((size_t)(cap * nkv * D));
  moved |= w.o.grow((size_t)(cap * nh * D));
  moved |= w.gate.grow((size_t)(cap * F));
  moved |= w.up.grow((size_t)(cap * F));
  moved |= w.a.grow((size_t)(cap * F));
  moved |= w.logits.grow((size_t)(std::max<int64_t>(group, 1) * V));
  if (m.moe_E) {
    const size_t g = (size_t)(cap * m.moe_k);  // gathered rows
    moved |= w.moe_z.grow((size_t)(cap * m.moe_E));
    moved |= w.moe_sel.grow(g);
    moved |= w.moe_w.grow(g);
    moved |= w.moe_g.grow(g * (size_t)m.moe_F);
    moved |= w.moe_u.grow(g * (size_t)m.moe_F);
    moved |= w.moe_a.grow(g * (size_t)m.moe_F);
    moved |= w.moe_act.grow(g * (size_t)std::max(m.moe_F, H));
    moved |= w.moe_act_e.grow(g);
    moved |= w.moe_d.grow(g * (size_t)H);
    moved |= w.moe_comb.grow((size_t)(cap * H));
  }
  moved |= w.scratch.grow((size_t)(rows_per * nh * sstride));
  moved |= w.zpart.grow((size_t)(rows_per * nh * attn_max_splits(sstride)));
  moved |= w.shifts.grow((size_t)(rows_per * nh));
  if (w.counters.grow((size_t)(rows_per * (nkv + 1)))) {
    moved = true;
    ck(cudaMemsetAsync(w.counters.p, 0, w.counters.n * sizeof(int), m.stream), "cudaMemsetAsync");
  }
  if (w.oacc.grow((size_t)(rows_per * nh * D))) {
    moved = true;
    ck(cudaMemsetAsync(w.oacc.p, 0, w.oacc.n * sizeof(unsigned long long), m.stream), "cudaMemsetAsync");
  }
  if (w.gemm_part.grow((size_t)kSkinnyPartElems)) {  // once: a fixed size
    moved = true;
    ck(cudaMemsetAsync(w.gemm_part.p, 0, w.gemm_part.n * sizeof(unsigned long long), m.stream), "cudaMemsetAsync");
  }
  if (w.gemm_cnt.grow((size_t)kSkinnyPartTiles)) {
    moved = true;
    ck(cudaMemsetAsync(w.gemm_cnt.p, 0, w.gemm_cnt.n * sizeof(int), m.stream), "cudaMemsetAsync");
  }
  if (moved) m.drop_graphs();
  if (tr) w.traced.grow((size_t)(cap * H));  // no graph reads it

  // Row metadata and the caches of this call to the device.
  int32_t* hm = w.h_meta.p;
  int64_t r = 0;
  for (int64_t t = 0; t < T; ++t) {
    hm[t] = rows[t].token;
    hm[w.rows + t] = (int32_t)rows[t].seq;
    hm[2 * w.rows + t] = (int32_t)rows[t].pos;
    if (rows[t].want_logits) hm[3 * w.rows + r++] = (int32_t)t;
  }
  for (int64_t i = 0; i < n_states; ++i) w.h_kvs.p[i] = states[i]->kv;
  w.fold_rope = distinct && !tr;
  // A graph serves every length up to attn_fused_max_pos in one bucket (the
  // one-kernel attention), longer ones in another (the split).
  const int64_t fmax = attn_fused_max_pos((int)(nh / nkv));
  w.attn_npos = !graph ? nmax : nmax <= fmax ? std::min(maxlen, fmax) : maxlen;
  for (int k = 0; k < 4; ++k)
    ck(cudaMemcpyAsync(w.meta.p + k * w.rows, hm + k * w.rows, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice,
                       m.stream),
       "cudaMemcpyAsync (rows)");
  ck(cudaMemcpyAsync(w.kvs.p, w.h_kvs.p, (size_t)n_states * sizeof(DevKV), cudaMemcpyHostToDevice, m.stream),
     "cudaMemcpyAsync (caches)");
  if (opt && opt->token_from)  // stream order: after the rows' upload, before the embedding reads it
    ck(cudaMemcpyAsync(w.tokens(), opt->token_from, sizeof(int32_t), cudaMemcpyDeviceToDevice, m.stream),
       "cudaMemcpyAsync (device token)");

  const int64_t slices = Tout ? n_slices(std::min(Tout, group)) : 0;
  if (slices > 1) make_slice_events(m, slices);  // before a capture names them
  if (graph && Tout <= group) {
    const auto key = std::make_tuple(T, Tout, sstride, rows_per, w.fold_rope, w.attn_npos, logits_slice_rows());
    auto it = m.graphs.find(key);
    if (it == m.graphs.end()) {
      cudaGraph_t g = nullptr;
      ck(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        enqueue_body(m, T, sstride, rows_per, nullptr);
        if (Tout) enqueue_head_slices(m, 0, Tout, true);
      } catch (...) {
        cudaStreamEndCapture(m.stream, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      ck(cudaStreamEndCapture(m.stream, &g), "cudaStreamEndCapture");
      cudaGraphExec_t ex = nullptr;
      const cudaError_t err = cudaGraphInstantiate(&ex, g, 0);
      cudaGraphDestroy(g);
      ck(err, "cudaGraphInstantiate");
      it = m.graphs.emplace(key, ex).first;
    }
    ck(cudaGraphLaunch(it->second, m.stream), "cudaGraphLaunch");
    if (Tout) {
      copy_slices(m, logits, Tout);  // the graph's slice events, recorded by this launch
      wait_copies(m, Tout);
    }
    if (opt && opt->pipe) enqueue_pick(m, *opt->pipe);
  } else {
    if (m.prof) {
      m.prof->attn_bytes = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t win = m.layers.empty() ? 0 : m.layers[0].window;
        const int64_t n = win && rows[t].pos + 1 > win ? win : rows[t].pos + 1;
        m.prof->attn_bytes += n * nkv * (2 * D + 8);  // K and V rows and their scales
      }
      m.prof->mark("start", 0, m.stream);
    }
    enqueue_body(m, T, sstride, rows_per, tr);
    for (int64_t r0 = 0; r0 < Tout; r0 += group) {
      const int64_t nr = std::min(group, Tout - r0);
      enqueue_head_slices(m, r0, nr, false);
      copy_slices(m, logits + r0 * V, nr);
      wait_copies(m, nr);  // before the next group's lm_head overwrites w.logits
    }
    if (opt && opt->pipe) enqueue_pick(m, *opt->pipe);
  }
  if (opt && opt->pipe) {  // submit_pick: the host waits on the event later (wait_pick)
    ck(cudaEventRecord(opt->pipe->done, m.stream), "cudaEventRecord");
    return;
  }
  ck(cudaStreamSynchronize(m.stream), "forward");
  if (tr && Tout) tr->add("output", {Tout, V}, std::vector<int64_t>(logits, logits + Tout * V));
}

}  // namespace

namespace {
int64_t g_slice_rows = 0, g_group_rows = 0;  // test::set_logits_rows
}  // namespace

int64_t logits_slice_rows() { return g_slice_rows > 0 ? g_slice_rows : kLogitsSliceRows; }
int64_t logits_group_rows(int64_t vocab) { return g_group_rows > 0 ? g_group_rows : kLogitsBudget / (vocab * 4); }
void test::set_logits_rows(int64_t slice, int64_t group) {
  g_slice_rows = slice;
  g_group_rows = group;
}

void forward_rows_impl(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                       int32_t* logits, Trace* trace, const ChunkOpts* opt) {
  if (T <= 0) return;
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  // A submitted greedy step still reads the workspace and the pinned row
  // buffers: finish it first (wait_pick still returns it).
  if (m.greedy.pending) ck(cudaEventSynchronize(m.greedy.done), "greedy step");
  for (int64_t i = 0; i < n_states; ++i)
    if (!states[i] || states[i]->device != m.device) throw std::invalid_argument("forward: a state of another device");
  for (int64_t t = 0; t < T; ++t) {
    const Row& r = rows[t];
    if (r.seq < 0 || r.seq >= n_states) throw std::invalid_argument("forward: row of an unknown sequence");
    if (r.pos < 0 || r.pos >= states[r.seq]->kv.max_len) throw std::invalid_argument("sequence longer than the KV cache");
    if (r.token < 0 || r.token >= m.cfg.vocab) throw std::invalid_argument("token id out of range");
  }
  for (int64_t c0 = 0; c0 < T; c0 += kMaxChunkRows) {
    const int64_t n = std::min(kMaxChunkRows, T - c0);
    if (trace) {
      Tracer tr{*trace, m.stream, 0, c0 > 0};
      forward_chunk(m, states, n_states, rows + c0, n, logits, &tr);
    } else {
      forward_chunk(m, states, n_states, rows + c0, n, logits, nullptr, c0 + n == T ? opt : nullptr);
    }
    for (int64_t t = c0; t < c0 + n; ++t)
      if (rows[t].want_logits) logits += m.cfg.vocab;
  }
}

void forward_rows(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                  int32_t* logits) {
  forward_rows_impl(m, states, n_states, rows, T, logits, nullptr);
}

void forward_rows_traced(DeviceModel& m, DeviceState* const* states, int64_t n_states, const Row* rows, int64_t T,
                         int32_t* logits, Trace& trace) {
  trace = Trace{};
  trace.isa = "cuda";
  forward_rows_impl(m, states, n_states, rows, T, logits, &trace);
}

std::vector<ProfStep> forward_rows_profiled(DeviceModel& m, DeviceState* const* states, int64_t n_states,
                                            const Row* rows, int64_t T, int32_t* logits) {
  if (T > kMaxChunkRows) throw std::invalid_argument("profile: at most 4096 rows");
  Profiler pf;
  m.prof = &pf;
  try {
    forward_rows_impl(m, states, n_states, rows, T, logits, nullptr);
  } catch (...) {
    m.prof = nullptr;
    throw;
  }
  m.prof = nullptr;
  std::vector<ProfStep> out;
  for (size_t i = 1; i < pf.marks.size(); ++i) {
    float ms = 0;  // timing (analysis), not the numerical path
    ck(cudaEventElapsedTime(&ms, pf.marks[i - 1].ev, pf.marks[i].ev), "cudaEventElapsedTime");
    out.push_back({pf.marks[i].name, (int64_t)(ms * 1e6f), pf.marks[i].bytes,
                   pf.marks[i].launches - pf.marks[i - 1].launches});
  }
  return out;
}

}  // namespace cuda
}  // namespace intdet
