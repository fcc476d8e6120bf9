// The tensor table of a converted model (layout.h): the only list of the
// per-layer tensors in the code base.
#include "intdet/layout.h"

#include <stdexcept>

namespace intdet {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
  }
  return "?";
}

int dtype_size(DType d) { return d == DType::I8 || d == DType::U8 ? 1 : d == DType::I16 ? 2 : 4; }

const char* param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::Embedding: return "embedding";
    case ParamKind::Rope: return "rope";
    case ParamKind::Norm: return "norm";
    case ParamKind::PostNorm: return "post_norm";
    case ParamKind::Linear: return "linear";
    case ParamKind::AttnScore: return "attn_score";
    case ParamKind::Softcap: return "softcap";
    case ParamKind::Router: return "router";
    case ParamKind::Experts: return "experts";
    case ParamKind::LmHead: return "lm_head";
  }
  return "?";
}

std::vector<Param> model_params(const ModelDesc& d) {
  const Config& c = d.cfg;
  const int64_t H = c.hidden, F = c.ffn, D = c.head_dim, qd = c.n_heads * c.head_dim, kvd = c.n_kv * c.head_dim;
  std::vector<Param> ps;
  auto add = [&](std::string name, ParamKind kind, int64_t rows, int64_t cols, int64_t layer) -> Param& {
    Param p;
    p.name = std::move(name);
    p.kind = kind;
    p.rows = rows;
    p.cols = cols;
    p.layer = layer;
    ps.push_back(std::move(p));
    return ps.back();
  };
  auto linear = [&](const std::string& name, int64_t N, int64_t K, int64_t l, Linear Layer::*slot,
                    const std::string& input, bool bias) {
    Param& p = add(name, ParamKind::Linear, N, K, l);
    p.linear = slot;
    p.input = input;
    p.bias = bias;
  };
  auto norm = [&](const std::string& name, int64_t n, int64_t l, const int16_t* Layer::*slot) {
    add(name, ParamKind::Norm, n, 0, l).norm = slot;
  };
  auto post_norm = [&](const std::string& name, int64_t l, const int16_t* Layer::*slot, int32_t Layer::*shift) {
    Param& p = add(name, ParamKind::PostNorm, H, 0, l);
    p.norm = slot;
    p.norm_shift = shift;
  };
  add("tok_embd", ParamKind::Embedding, c.vocab, H, -1);
  add("rope", ParamKind::Rope, c.ctx, D / 2, -1);
  for (const BlockDesc& b : d.blocks)
    if (b.rope == "rope_local") {  // the second table, once, when a block uses it
      add("rope_local", ParamKind::Rope, c.ctx, D / 2, -1);
      break;
    }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const BlockDesc& b = d.blocks[(size_t)l];
    const std::string p = "blk." + std::to_string(l) + ".";
    // --- attention block: RMSNorm, q/k/v, optional per-head q/k RMSNorm, scores, output projection
    // without pre-norms (OLMo 2) the linears read the residual stream ("residual") itself
    if (b.pre_norms) norm(p + "attn_norm", H, l, &Layer::attn_norm);
    const std::string attn_in = b.pre_norms ? p + "attn_norm" : std::string("residual");
    linear(p + "attn_q", qd, H, l, &Layer::q, attn_in, b.bias_q);
    linear(p + "attn_k", kvd, H, l, &Layer::k, attn_in, b.bias_k);
    linear(p + "attn_v", kvd, H, l, &Layer::v, attn_in, b.bias_v);
    if (b.qk_norm) {
      norm(p + "attn_q_norm", b.qk_norm_projection ? qd : D, l, &Layer::q_norm);
      norm(p + "attn_k_norm", b.qk_norm_projection ? kvd : D, l, &Layer::k_norm);
    }
    add(p + "attn_score", ParamKind::AttnScore, 1, 0, l);
    if (b.attn_softcap) add(p + "attn_softcap", ParamKind::Softcap, 1, 0, l).softcap = &Layer::attn_softcap;
    linear(p + "attn_output", H, qd, l, &Layer::o, p + "attn_out", b.bias_o);
    if (b.post_norms) post_norm(p + "post_attention_norm", l, &Layer::post_attn_norm, &Layer::post_attn_shift);
    // --- feed-forward block: RMSNorm, gate/up, SwiGLU or GeGLU, down
    if (b.pre_norms) norm(p + "ffn_norm", H, l, &Layer::ffn_norm);
    const std::string ffn_in = b.pre_norms ? p + "ffn_norm" : std::string("residual");
    if (b.n_experts) {  // MoE: router, then the experts' gate, up and down as [E, N, K]
      Param& r = add(p + "ffn_gate_inp", ParamKind::Router, b.n_experts, H, l);
      r.linear = &Layer::router;
      r.input = ffn_in;
      auto experts = [&](const std::string& name, int64_t N, int64_t K, std::vector<Linear> Layer::*slot,
                         const std::string& input) {
        Param& e = add(name, ParamKind::Experts, N, K, l);
        e.experts = b.n_experts;
        e.experts_slot = slot;
        e.input = input;
      };
      experts(p + "ffn_gate_exps", b.expert_ffn, H, &Layer::gate_exps, ffn_in);
      experts(p + "ffn_up_exps", b.expert_ffn, H, &Layer::up_exps, ffn_in);
      experts(p + "ffn_down_exps", H, b.expert_ffn, &Layer::down_exps, p + "ffn_act");
    } else {
      linear(p + "ffn_gate", F, H, l, &Layer::gate, ffn_in, false);
      linear(p + "ffn_up", F, H, l, &Layer::up, ffn_in, false);
      linear(p + "ffn_down", H, F, l, &Layer::down, p + "ffn_act", false);
    }
    if (b.post_norms) post_norm(p + "post_ffw_norm", l, &Layer::post_ffn_norm, &Layer::post_ffn_shift);
  }
  add("output_norm", ParamKind::Norm, H, 0, -1);
  add("output", ParamKind::LmHead, c.vocab, H, -1).input = "output_norm";
  if (d.final_softcap) add("output_softcap", ParamKind::Softcap, 1, 0, -1);
  return ps;
}

std::vector<TensorSpec> param_tensors(const Param& p, const ModelDesc& d) {
  const int64_t N = p.rows, K = p.cols;
  std::vector<TensorSpec> t;
  auto scale = [&] {  // per-row dyadic scale: mantissa and shift
    t.push_back({p.name + ".mant", DType::I32, {N}});
    t.push_back({p.name + ".shift", DType::I32, {N}});
  };
  switch (p.kind) {
    case ParamKind::Embedding:
      t.push_back({p.name + ".q", DType::I8, {N, K}});
      scale();
      break;
    case ParamKind::Rope:
      t.push_back({p.name + ".cos", DType::I16, {N, K}});
      t.push_back({p.name + ".sin", DType::I16, {N, K}});
      break;
    case ParamKind::Norm:
      t.push_back({p.name + ".g", DType::I16, {N}});
      break;
    case ParamKind::PostNorm:
      t.push_back({p.name + ".g", DType::I16, {N}});
      t.push_back({p.name + ".shift", DType::I32, {1}});
      break;
    case ParamKind::AttnScore:
      t.push_back({p.name + ".mant", DType::I32, {1}});
      t.push_back({p.name + ".shift", DType::I32, {1}});
      break;
    case ParamKind::Softcap:
      t.push_back({p.name + ".cap", DType::I32, {1}});
      t.push_back({p.name + ".inv_mant", DType::I32, {1}});
      t.push_back({p.name + ".inv_shift", DType::I32, {1}});
      break;
    case ParamKind::Linear:
      if (d.weights == WeightFormat::Int4) {  // codes, and per group of 32 inputs a step and an offset
        t.push_back({p.name + ".q4", DType::U8, {N, K / 2}});
        t.push_back({p.name + ".gd", DType::I16, {N, K / 32}});
        t.push_back({p.name + ".gm", DType::I16, {N, K / 32}});
      } else {
        t.push_back({p.name + ".q", DType::I8, {N, K}});
      }
      scale();
      if (p.bias) t.push_back({p.name + ".bias", DType::I32, {N}});
      break;
    case ParamKind::Router:
      t.push_back({p.name + ".q", DType::I8, {N, K}});
      scale();
      break;
    case ParamKind::Experts: {
      const int64_t E = p.experts;
      if (d.weights == WeightFormat::Int4) {
        t.push_back({p.name + ".q4", DType::U8, {E, N, K / 2}});
        t.push_back({p.name + ".gd", DType::I16, {E, N, K / 32}});
        t.push_back({p.name + ".gm", DType::I16, {E, N, K / 32}});
      } else {
        t.push_back({p.name + ".q", DType::I8, {E, N, K}});
      }
      t.push_back({p.name + ".mant", DType::I32, {E, N}});
      t.push_back({p.name + ".shift", DType::I32, {E, N}});
      break;
    }
    case ParamKind::LmHead:
      if (!d.tied_embeddings) t.push_back({p.name + ".q", DType::I8, {N, K}});  // tied: tok_embd.q
      scale();
      break;
  }
  return t;
}

}  // namespace intdet
