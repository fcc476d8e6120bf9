// The model description and its tensor table: the ONE definition of which
// tensors a converted model holds (names, dtypes, shapes), read by the
// loader (loader.h), by Python (intdet._core.model_params: the converter and
// python/intdet/model.py ask it instead of keeping lists) and by the numpy
// spec through the tensors the loader accepted. Formats: docs/format.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "intdet/model.h"

namespace intdet {

enum class DType { I8, U8, I16, I32 };
const char* dtype_name(DType d);  // safetensors' names: "I8", "U8", "I16", "I32"
int dtype_size(DType d);

enum class WeightFormat { Int8, Int4 };

// One decoder block as config.json "layers"[l] describes it (format_version 2).
// Only what some engine computes is accepted; the loader refuses other
// values by name, so a converter cannot write a feature an engine ignores.
struct BlockDesc {
  // The block's RMSNorms, in order: {"attn_norm", "ffn_norm"} (pre-norm),
  // with Gemma's post-norms {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"},
  // or post-norms only (OLMo 2) {"post_attention_norm", "post_ffw_norm"}.
  std::vector<std::string> norms{"attn_norm", "ffn_norm"};
  bool pre_norms = true;                                     // attn_norm / ffn_norm before each branch
  bool post_norms = false;                                   // branch RMSNorm before each residual add
  bool qk_norm = false;                                      // RMSNorm of q and k before RoPE (Qwen3, Gemma 3, OLMo 2)
  bool qk_norm_projection = false;                           // ... over the whole projection (OLMo 2), not per head
  bool bias_q = false, bias_k = false, bias_v = false, bias_o = false;  // linear biases (Qwen2: q, k, v)
  std::string activation = "silu";                           // gated FFN: "silu" SwiGLU, "gelu_tanh" GeGLU
  int64_t attention_window = 0;                              // 0: full causal attention; W: the last W positions
  // Mixture of experts (Qwen3-MoE, Mixtral), else n_experts 0 (a dense FFN):
  // a router linear to Q16 log2 units, the n_experts_used largest (ties:
  // lowest expert id), their weights softmax over those k (norm_topk) or the
  // full softmax's entries, and the weighted sum of the chosen experts' SwiGLU FFNs.
  int64_t n_experts = 0, n_experts_used = 0, expert_ffn = 0;
  bool norm_topk = false;
  bool attn_softcap = false;  // soft-capped attention scores (Gemma 2): tensor <blk>.attn_softcap
  std::string rope = "rope";  // RoPE table: "rope" or "rope_local" (<rope>.cos / .sin); "none": no RoPE (SmolLM3's NoPE layers)
};

// config.json of a converted model, checked (parse_config in loader.h).
struct ModelDesc {
  int64_t format_version = 0;
  Config cfg;  // sizes, eps, residual format
  WeightFormat weights = WeightFormat::Int8;
  bool tied_embeddings = false;
  bool final_softcap = false;  // soft-capped logits (Gemma 2): tensor output_softcap
  std::vector<BlockDesc> blocks;  // one per layer
};

// A parameter of the model as the converter sees it: one float tensor of the
// source (or a derived table), stored as one or more integer tensors.
enum class ParamKind {
  Embedding,  // tok_embd: int8 rows + per-row dyadic scale
  Rope,       // rope: int16 Q14 cos/sin tables [ctx, D/2]
  Norm,       // RMSNorm gamma int16
  PostNorm,   // RMSNorm of a branch output straight to the residual: gamma int16 + shift to Q R (Gemma)
  Linear,     // decoder linear: int8 or int4 weights, per-channel dyadic scale, optional bias
  AttnScore,  // attention score scale (dyadic, one per layer)
  Softcap,    // soft-capping constants: .cap, .inv_mant, .inv_shift (one int32 each; Gemma 2)
  Router,     // MoE router: int8 [E, H] + per-expert dyadic scale to Q16 log2 units (always int8)
  Experts,    // MoE expert linears: [E, N, K] in the file's weight format, per-(expert, channel) dyadic scale
  LmHead,     // output: int8 (or tok_embd's when tied) + per-row dyadic scale
};
const char* param_kind_name(ParamKind k);

struct Param {
  std::string name;       // GGUF-style: "blk.3.attn_q"
  ParamKind kind;
  int64_t rows = 0;       // float shape [rows, cols]; cols 0 for a vector
  int64_t cols = 0;
  int64_t experts = 0;    // Experts: the float shape is [experts, rows, cols]
  bool bias = false;      // Linear: has "<name>.bias"
  std::string input;      // Linear/LmHead: the activation it reads (e.g. "blk.3.attn_norm", "blk.3.attn_out")
  int64_t layer = -1;     // -1 for model-level parameters
  // Where the loader puts a block parameter in intdet::Layer (so no second
  // list of names exists): a Linear's or a Norm's member.
  Linear Layer::*linear = nullptr;
  const int16_t* Layer::*norm = nullptr;
  int32_t Layer::*norm_shift = nullptr;  // PostNorm: its shift to the residual
  std::vector<Linear> Layer::*experts_slot = nullptr;  // Experts: one Linear per expert
  Softcap Layer::*softcap = nullptr;  // Softcap of a layer (null: the model's final_softcap)
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every parameter, in forward order.
std::vector<Param> model_params(const ModelDesc& d);
// The stored tensors of one parameter.
std::vector<TensorSpec> param_tensors(const Param& p, const ModelDesc& d);

}  // namespace intdet
