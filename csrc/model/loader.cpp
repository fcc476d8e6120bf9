// The one model loader (loader.h): config checks, then the tensor table
// (layout.cpp) against the tensors given, then a Model of borrowed pointers.
// The bounds it checks are derived in docs/format.md.
#include "intdet/loader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace intdet {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

std::string show(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

int64_t get_int(const json& o, const std::string& key, const std::string& where, int64_t lo, int64_t hi,
                const std::string& prefix = "") {
  auto it = o.find(key);
  if (it == o.end()) fail(where, prefix + key + " is missing");
  if (!it->is_number_integer()) fail(where, prefix + key + " = " + show(*it) + " is not an integer");
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > (uint64_t)INT64_MAX ? INT64_MAX : it->get<int64_t>();
  if (v < lo || v > hi)
    fail(where, prefix + key + " = " + show(*it) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

bool get_bool(const json& o, const std::string& key, const std::string& where, const std::string& prefix = "") {
  auto it = o.find(key);
  if (it == o.end()) fail(where, prefix + key + " is missing");
  if (!it->is_boolean()) fail(where, prefix + key + " = " + show(*it) + " is not true or false");
  return it->get<bool>();
}

std::string get_str(const json& o, const std::string& key, const std::string& where, const std::string& prefix = "") {
  auto it = o.find(key);
  if (it == o.end()) fail(where, prefix + key + " is missing");
  if (!it->is_string()) fail(where, prefix + key + " = " + show(*it) + " is not a string");
  return it->get<std::string>();
}

BlockDesc parse_block(const json& b, const std::string& where, int64_t l) {
  const std::string at = "layers[" + std::to_string(l) + "].";
  if (!b.is_object()) fail(where, "layers[" + std::to_string(l) + "] is not an object");
  static const std::set<std::string> keys = {"norms", "qk_norm", "qk_norm_span", "bias", "activation",
                                             "attention_window", "rope", "moe", "attn_softcap"};
  for (const auto& [k, v] : b.items())
    if (!keys.count(k)) fail(where, at + k + ": unknown block feature (this engine implements: norms, qk_norm, "
                                          "qk_norm_span, bias, activation, attention_window, rope, moe, attn_softcap)");
  BlockDesc d;
  auto norms = b.find("norms");
  if (norms == b.end() || !norms->is_array()) fail(where, at + "norms is missing or not a list");
  std::vector<std::string> ns;
  for (const auto& n : *norms) {
    if (!n.is_string()) fail(where, at + "norms holds " + show(n) + ", not a name");
    ns.push_back(n.get<std::string>());
  }
  static const std::vector<std::string> both = {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"};
  static const std::vector<std::string> post = {"post_attention_norm", "post_ffw_norm"};
  if (ns != d.norms && ns != both && ns != post)
    fail(where, at + "norms " + show(*norms) + ": this engine implements [\"attn_norm\", \"ffn_norm\"], "
                                              "[\"attn_norm\", \"post_attention_norm\", \"ffn_norm\", \"post_ffw_norm\"] "
                                              "and [\"post_attention_norm\", \"post_ffw_norm\"]");
  d.pre_norms = ns != post;
  d.post_norms = ns != d.norms;
  d.norms = ns;
  d.qk_norm = get_bool(b, "qk_norm", where, at);
  if (b.find("qk_norm_span") != b.end()) {  // absent: per head
    const std::string span = get_str(b, "qk_norm_span", where, at);
    if (span != "head" && span != "projection")
      fail(where, at + "qk_norm_span '" + span + "': this engine implements 'head' and 'projection'");
    if (!d.qk_norm) fail(where, at + "qk_norm_span without qk_norm");
    d.qk_norm_projection = span == "projection";
  }
  auto bias = b.find("bias");
  if (bias == b.end() || !bias->is_array()) fail(where, at + "bias is missing or not a list");
  for (const auto& n : *bias) {
    const std::string s = n.is_string() ? n.get<std::string>() : "";
    bool* flag = s == "attn_q" ? &d.bias_q : s == "attn_k" ? &d.bias_k : s == "attn_v" ? &d.bias_v
               : s == "attn_output" ? &d.bias_o : nullptr;
    if (!flag) fail(where, at + "bias holds " + show(n) + " (choose from attn_q, attn_k, attn_v, attn_output)");
    if (*flag) fail(where, at + "bias names " + s + " twice");
    *flag = true;
  }
  d.activation = get_str(b, "activation", where, at);
  if (d.activation != "silu" && d.activation != "gelu_tanh")
    fail(where, at + "activation '" + d.activation + "': this engine implements silu (SwiGLU) and gelu_tanh (GeGLU)");
  // 0: full causal attention; W >= 1: the last W positions (sliding window)
  d.attention_window = get_int(b, "attention_window", where, 0, INT32_MAX, at);
  auto moe = b.find("moe");
  if (moe != b.end()) {  // absent: a dense FFN
    if (!moe->is_object()) fail(where, at + "moe is not an object");
    static const std::set<std::string> mk = {"experts", "experts_per_token", "expert_ffn_size", "norm_topk_prob"};
    for (const auto& [k, v] : moe->items())
      if (!mk.count(k)) fail(where, at + "moe." + k + ": unknown (experts, experts_per_token, expert_ffn_size, norm_topk_prob)");
    d.n_experts = get_int(*moe, "experts", where, 1, 4096, at + "moe.");
    d.n_experts_used = get_int(*moe, "experts_per_token", where, 1, d.n_experts, at + "moe.");
    d.expert_ffn = get_int(*moe, "expert_ffn_size", where, 1, ((int64_t)1 << 24) - 1, at + "moe.");
    d.norm_topk = get_bool(*moe, "norm_topk_prob", where, at + "moe.");
    if (d.activation != "silu") fail(where, at + "moe: experts implement SwiGLU (activation silu) only");
  }
  d.attn_softcap = b.find("attn_softcap") != b.end() && get_bool(b, "attn_softcap", where, at);  // absent: none
  d.rope = get_str(b, "rope", where, at);
  if (d.rope != "rope" && d.rope != "rope_local" && d.rope != "none")
    fail(where, at + "rope '" + d.rope + "': this engine implements the tables 'rope' and 'rope_local', and 'none'");
  return d;
}

std::string shape_str(DType dt, const std::vector<int64_t>& s) {
  std::string out = std::string(dtype_name(dt)) + "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

bool ends_with(const std::string& s, const char* suf) {
  const std::string t(suf);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The value ranges the overflow bounds rely on (docs/format.md).
void check_values(const std::string& st, const TensorSpec& s, const void* data) {
  const int64_t n = count(s.shape);
  if (ends_with(s.name, ".mant")) {
    const int32_t* p = static_cast<const int32_t*>(data);
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < 0 || p[i] > (1 << 15)) fail(st, "tensor '" + s.name + "' has a dyadic mantissa outside [0, 2^15]");
  } else if (ends_with(s.name, ".shift")) {
    const int32_t* p = static_cast<const int32_t*>(data);
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < -64 || p[i] > 200) fail(st, "tensor '" + s.name + "' has a shift outside [-64, 200]");
  } else if (ends_with(s.name, ".cap") || ends_with(s.name, ".inv_mant")) {  // softcap: |x| * inv_mant < 2^62
    const int32_t v = *static_cast<const int32_t*>(data);
    if (v < 1) fail(st, "tensor '" + s.name + "' must be positive (soft-capping constant)");
  } else if (ends_with(s.name, ".inv_shift")) {
    const int32_t v = *static_cast<const int32_t*>(data);
    if (v < 5 || v > 62) fail(st, "tensor '" + s.name + "' is outside [5, 62] (soft-capping shift)");
  } else if (s.dtype == DType::I8) {
    const int8_t* p = static_cast<const int8_t*>(data);
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < -127) fail(st, "tensor '" + s.name + "' holds -128 (weights are symmetric int8)");
  }
}

// |gd * u + gm| <= 2047 for every code u in 0..15, gd >= 0: the int32 bound
// of the kernels' blocks of 32 products (docs/format.md, int4 weights).
void check_int4(const std::string& st, const std::string& name, const int16_t* gd, const int16_t* gm, int64_t N,
                int64_t G) {
  for (int64_t i = 0; i < N * G; ++i) {
    const int32_t d = gd[i], m = gm[i];
    if (d < 0 || m < -2047 || m > 2047 || m + 15 * d > 2047)
      fail(st, "tensors '" + name + ".gd/.gm' group [" + std::to_string(i / G) + ", " + std::to_string(i % G) +
                   "]: gd " + std::to_string(d) + ", gm " + std::to_string(m) +
                   " break the int4 bound gd >= 0, |gd * u + gm| <= 2047");
  }
}

}  // namespace

ModelDesc parse_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(where, std::string("cannot read JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != "intdet")
    fail(where, "not an intdet config (convert the model with `intdet convert` first)");
  ModelDesc d;
  auto fv = j.find("format_version");
  d.format_version = fv != j.end() && fv->is_number_integer() ? fv->get<int64_t>() : -1;
  if (d.format_version != kFormatVersion)
    fail(where, "format_version " + (fv == j.end() ? std::string("(missing)") : show(*fv)) + " is not " +
                    std::to_string(kFormatVersion) + "; re-convert the model");
  Config& c = d.cfg;
  const int64_t big = ((int64_t)1 << 31) - 1;
  c.hidden = get_int(j, "hidden_size", where, 1, big);
  c.ffn = get_int(j, "intermediate_size", where, 1, big);
  c.n_layers = get_int(j, "num_layers", where, 1, big);
  c.n_heads = get_int(j, "num_heads", where, 1, big);
  c.n_kv = get_int(j, "num_kv_heads", where, 1, big);
  c.head_dim = get_int(j, "head_dim", where, 1, big);
  c.vocab = get_int(j, "vocab_size", where, 1, big);
  c.ctx = get_int(j, "context_length", where, 1, big);
  if (c.n_heads % c.n_kv || c.head_dim % 2 || c.head_dim > 256 || c.hidden > 8192)
    fail(where, "head counts/sizes outside the overflow-checked range (docs/format.md)");
  if (std::max(c.ffn, c.n_heads * c.head_dim) >= ((int64_t)1 << 24) || c.ctx >= ((int64_t)1 << 19))
    fail(where, "a linear input of 2^24 features or a context of 2^19 positions could overflow an accumulator");
  auto eps = j.find("rms_eps_q60");
  if (eps == j.end() || !eps->is_object()) fail(where, "rms_eps_q60 is missing or not an object");
  c.eps_hidden = get_int(*eps, "hidden", where, 0, INT64_MAX, "rms_eps_q60.");
  c.eps_head = get_int(*eps, "head", where, 0, INT64_MAX, "rms_eps_q60.");
  // Residual stream format (absent: Q16); 8..16 keeps the RMSNorm eps term in range (docs/format.md).
  c.residual_frac = j.contains("residual_frac_bits") ? get_int(j, "residual_frac_bits", where, 8, 16) : 16;
  d.tied_embeddings = get_bool(j, "tied_embeddings", where);
  d.final_softcap = j.contains("final_logit_softcap") && get_bool(j, "final_logit_softcap", where);  // absent: none
  const std::string wf = j.contains("weight_format") ? get_str(j, "weight_format", where) : "int8";
  if (wf != "int8" && wf != "int4") fail(where, "weight_format '" + wf + "' is not int8 or int4");
  d.weights = wf == "int4" ? WeightFormat::Int4 : WeightFormat::Int8;
  if (d.weights == WeightFormat::Int4) {
    auto gs = j.find("weight_group_size");
    bool ok = gs != j.end() && gs->is_number_integer() && gs->get<int64_t>() == 32;
    for (int64_t k : {c.hidden, c.ffn, c.n_heads * c.head_dim}) ok = ok && k % 32 == 0 && k < ((int64_t)1 << 21);
    if (!ok)
      fail(where, "int4 weights need weight_group_size 32, linear inputs that are multiples of 32 and below 2^21");
  }
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) fail(where, "layers (the per-layer block description) is missing");
  if ((int64_t)layers->size() != c.n_layers)
    fail(where, "layers describes " + std::to_string(layers->size()) + " blocks but num_layers is " +
                    std::to_string(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) d.blocks.push_back(parse_block((*layers)[(size_t)l], where, l));
  for (const BlockDesc& b : d.blocks)
    if (b.n_experts && d.weights == WeightFormat::Int4 && (b.expert_ffn % 32 || b.expert_ffn >= ((int64_t)1 << 21)))
      fail(where, "int4 weights need moe.expert_ffn_size a multiple of 32 and below 2^21");
  for (const BlockDesc& b : d.blocks)
    if (b.qk_norm_projection) {  // its own epsilons (n = nh*D, nkv*D) and the RMSNorm bound n <= 2^13
      if (c.n_heads * c.head_dim > 8192)
        fail(where, "a projection-wide q/k RMSNorm over more than 8192 features could overflow its sum of squares");
      c.eps_q = get_int(*eps, "q_proj", where, 0, INT64_MAX, "rms_eps_q60.");
      c.eps_k = get_int(*eps, "k_proj", where, 0, INT64_MAX, "rms_eps_q60.");
      break;
    }
  return d;
}

Model build_model(const ModelDesc& d, const TensorMap& tensors, const std::string& st, bool release_source) {
  // Weights of the other format first: the config's weight_format is then
  // what is wrong, not the tensors it would miss.
  const bool int4 = d.weights == WeightFormat::Int4;
  for (const auto& [name, v] : tensors)
    if (name.rfind("blk.", 0) == 0 && ends_with(name, int4 ? ".q" : ".q4") && !ends_with(name, "ffn_gate_inp.q"))  // routers: int8
      fail(st, "tensor '" + name + "' is " + (int4 ? "int8" : "int4") + " weights but config.json says weight_format " +
                   (int4 ? "int4" : "int8"));
  std::set<std::string> wanted;
  std::map<std::string, const void*> ptr;
  for (const Param& p : model_params(d)) {
    for (const TensorSpec& s : param_tensors(p, d)) {
      wanted.insert(s.name);
      auto it = tensors.find(s.name);
      if (it == tensors.end()) fail(st, "missing tensor '" + s.name + "'");
      const TensorView& v = it->second;
      if (v.dtype != s.dtype || v.shape != s.shape)
        fail(st, "tensor '" + s.name + "' is " + shape_str(v.dtype, v.shape) + ", expected " + shape_str(s.dtype, s.shape));
      check_values(st, s, v.data);
      ptr[s.name] = v.data;
    }
    if ((p.kind == ParamKind::Linear || p.kind == ParamKind::Experts) && d.weights == WeightFormat::Int4)
      check_int4(st, p.name, static_cast<const int16_t*>(ptr[p.name + ".gd"]),
                 static_cast<const int16_t*>(ptr[p.name + ".gm"]), std::max<int64_t>(p.experts, 1) * p.rows,
                 p.cols / 32);
    if (release_source && (p.kind == ParamKind::Linear || p.kind == ParamKind::Embedding || p.kind == ParamKind::LmHead)) {
      // Checked: drop the big weight's pages until the engine reads (or packs) it.
      const std::string w = d.weights == WeightFormat::Int4 && p.kind == ParamKind::Linear ? ".q4" : ".q";
      auto it = ptr.find(p.name + w);
      if (it != ptr.end()) release_pages(it->second, p.kind == ParamKind::Linear && w == ".q4" ? p.rows * p.cols / 2 : p.rows * p.cols);
    }
  }
  for (const auto& [name, v] : tensors)
    if (!wanted.count(name))
      fail(st, "tensor '" + name + "' is not part of the model config.json describes (no engine would use it)");
  auto I8 = [&](const std::string& n) { return static_cast<const int8_t*>(ptr.at(n)); };
  auto I16 = [&](const std::string& n) { return static_cast<const int16_t*>(ptr.at(n)); };
  auto I32 = [&](const std::string& n) { return static_cast<const int32_t*>(ptr.at(n)); };
  auto opt32 = [&](const std::string& n) { auto it = ptr.find(n); return it == ptr.end() ? nullptr : static_cast<const int32_t*>(it->second); };
  auto linear = [&](const std::string& n, int64_t N, int64_t K, const std::string& wname = "") {
    Linear L;
    L.N = N;
    L.K = K;
    if (wname.empty() && d.weights == WeightFormat::Int4) {
      L.w4 = static_cast<const uint8_t*>(ptr.at(n + ".q4"));
      L.gd = I16(n + ".gd");
      L.gm = I16(n + ".gm");
    } else {
      L.w = I8(wname.empty() ? n + ".q" : wname);
    }
    L.mant = I32(n + ".mant");
    L.shift = I32(n + ".shift");
    L.bias = opt32(n + ".bias");
    return L;
  };
  Model m;
  m.cfg = d.cfg;
  m.layers.resize((size_t)d.cfg.n_layers);
  for (const Param& p : model_params(d)) {  // each parameter into its slot
    Layer* L = p.layer >= 0 ? &m.layers[(size_t)p.layer] : nullptr;
    switch (p.kind) {
      case ParamKind::Embedding:
        m.tok_embd = I8(p.name + ".q");
        m.embd_mant = I32(p.name + ".mant");
        m.embd_shift = I32(p.name + ".shift");
        break;
      case ParamKind::Rope:
        (p.name == "rope_local" ? m.rope_local_cos : m.rope_cos) = I16(p.name + ".cos");
        (p.name == "rope_local" ? m.rope_local_sin : m.rope_sin) = I16(p.name + ".sin");
        break;
      case ParamKind::Norm:
        (L ? L->*p.norm : m.out_norm) = I16(p.name + ".g");
        break;
      case ParamKind::PostNorm:
        L->*p.norm = I16(p.name + ".g");
        L->*p.norm_shift = I32(p.name + ".shift")[0];
        break;
      case ParamKind::Linear:
        L->*p.linear = linear(p.name, p.rows, p.cols);
        break;
      case ParamKind::AttnScore:
        L->score_mant = I32(p.name + ".mant")[0];
        L->score_shift = I32(p.name + ".shift")[0];
        break;
      case ParamKind::Softcap:
        (L ? L->*p.softcap : m.final_softcap) =
            Softcap{I32(p.name + ".cap")[0], I32(p.name + ".inv_mant")[0], I32(p.name + ".inv_shift")[0]};
        break;
      case ParamKind::Router:
        L->*p.linear = linear(p.name, p.rows, p.cols, p.name + ".q");  // always int8
        break;
      case ParamKind::Experts: {  // expert e: a view at row e * N of the [E, N, K] tensors
        const Linear all = linear(p.name, p.rows, p.cols);
        const int64_t N = p.rows, K = p.cols;
        std::vector<Linear>& v = L->*p.experts_slot;
        for (int64_t e = 0; e < p.experts; ++e) {
          Linear x = all;
          if (x.w) x.w += e * N * K;
          if (x.w4) x.w4 += e * N * (K / 2), x.gd += e * N * (K / 32), x.gm += e * N * (K / 32);
          x.mant += e * N;
          x.shift += e * N;
          v.push_back(x);
        }
        break;
      }
      case ParamKind::LmHead:
        m.output = linear(p.name, p.rows, p.cols, d.tied_embeddings ? "tok_embd.q" : p.name + ".q");
        break;
    }
  }
  for (int64_t l = 0; l < d.cfg.n_layers; ++l) {  // the block features that are not tensors
    const BlockDesc& b = d.blocks[(size_t)l];
    Layer& L = m.layers[(size_t)l];
    L.geglu = b.activation == "gelu_tanh";
    L.window = b.attention_window;
    const bool local = b.rope == "rope_local", nope = b.rope == "none";
    L.rope_cos = nope ? nullptr : local ? m.rope_local_cos : m.rope_cos;
    L.rope_sin = nope ? nullptr : local ? m.rope_local_sin : m.rope_sin;
    L.qk_norm_projection = b.qk_norm_projection;
    L.n_experts_used = b.n_experts_used;
    L.norm_topk = b.norm_topk;
  }
  return m;
}

}  // namespace intdet
