// Converted tensors (a dict name -> numpy array, from python/intdet/model.py)
// into a Model of borrowed pointers: shared by the _core and _cuda modules.
// Arrays are taken without conversion: a wrong dtype or a non-contiguous
// array is an error, never a silent copy.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "intdet/model.h"

namespace intdet {
namespace pydict {

namespace py = pybind11;

// A tensor of the dict, checked: present (unless optional), exact dtype,
// C-contiguous, the shape the config implies.
template <typename T>
inline const T* ptr_of(const py::dict& tensors, const std::string& name, std::vector<int64_t> shape, bool optional = false) {
  if (!tensors.contains(name)) {
    if (optional) return nullptr;
    throw std::invalid_argument("model tensor '" + name + "' is missing");
  }
  py::object obj = tensors[name.c_str()];
  if (!py::isinstance<py::array_t<T>>(obj))
    throw std::invalid_argument("model tensor '" + name + "' has the wrong dtype");
  py::array a = obj.cast<py::array>();
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument("model tensor '" + name + "' is not contiguous");
  if ((int64_t)a.ndim() != (int64_t)shape.size())
    throw std::invalid_argument("model tensor '" + name + "' has the wrong rank");
  for (size_t i = 0; i < shape.size(); ++i)
    if (a.shape(i) != shape[i]) throw std::invalid_argument("model tensor '" + name + "' has the wrong shape");
  return static_cast<const T*>(a.data());
}

inline Linear make_linear(const py::dict& t, const std::string& name, int64_t N, int64_t K, bool bias,
                   const std::string& wname = "") {
  Linear L;
  L.N = N;
  L.K = K;
  if (wname.empty() && t.contains(name + ".q4")) {  // int4 weights (docs/format.md)
    if (K % 32) throw std::invalid_argument("model tensor '" + name + ".q4': input size is not a multiple of 32");
    L.w4 = ptr_of<uint8_t>(t, name + ".q4", {N, K / 2});
    L.gd = ptr_of<int16_t>(t, name + ".gd", {N, K / 32});
    L.gm = ptr_of<int16_t>(t, name + ".gm", {N, K / 32});
    for (int64_t i = 0; i < N * (K / 32); ++i) {  // the bound the kernels' int32 blocks rely on
      const int32_t d = L.gd[i], m = L.gm[i];
      if (d < 0 || m < -2047 || m > 2047 || m + 15 * d > 2047)
        throw std::invalid_argument("model tensor '" + name + ".gm': int4 group outside |gd * u + gm| <= 2047");
    }
  } else {
    L.w = ptr_of<int8_t>(t, wname.empty() ? name + ".q" : wname, {N, K});
  }
  L.mant = ptr_of<int32_t>(t, name + ".mant", {N});
  L.shift = ptr_of<int32_t>(t, name + ".shift", {N});
  L.bias = ptr_of<int32_t>(t, name + ".bias", {N}, !bias);
  return L;
}

// A Model pointing into the Python arrays (valid while `t` lives); nothing
// packed yet. Throws std::invalid_argument naming the tensor or config value.
inline Model model_from_dict(const py::dict& cfg, const py::dict& t) {
  Model m;
  Config& c = m.cfg;
  c.hidden = cfg["hidden_size"].cast<int64_t>();
  c.ffn = cfg["intermediate_size"].cast<int64_t>();
  c.n_layers = cfg["num_layers"].cast<int64_t>();
  c.n_heads = cfg["num_heads"].cast<int64_t>();
  c.n_kv = cfg["num_kv_heads"].cast<int64_t>();
  c.head_dim = cfg["head_dim"].cast<int64_t>();
  c.vocab = cfg["vocab_size"].cast<int64_t>();
  c.ctx = cfg["context_length"].cast<int64_t>();
  c.qk_norm = cfg["qk_norm"].cast<bool>();
  py::dict eps = cfg["rms_eps_q60"];
  c.eps_hidden = eps["hidden"].cast<int64_t>();
  c.eps_head = eps["head"].cast<int64_t>();
  const bool bias = cfg["attn_bias"].cast<bool>();
  const int64_t H = c.hidden, D = c.head_dim;
  if (c.n_heads <= 0 || c.n_kv <= 0 || c.n_heads % c.n_kv || D % 2 || D > 256 || H > 8192)
    throw std::invalid_argument("model config has unsupported head or hidden sizes");
  m.tok_embd = ptr_of<int8_t>(t, "tok_embd.q", {c.vocab, H});
  m.embd_mant = ptr_of<int32_t>(t, "tok_embd.mant", {c.vocab});
  m.embd_shift = ptr_of<int32_t>(t, "tok_embd.shift", {c.vocab});
  m.rope_cos = ptr_of<int16_t>(t, "rope.cos", {c.ctx, D / 2});
  m.rope_sin = ptr_of<int16_t>(t, "rope.sin", {c.ctx, D / 2});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = ptr_of<int16_t>(t, p + "attn_norm.g", {H});
    L.q = make_linear(t, p + "attn_q", c.n_heads * D, H, bias);
    L.k = make_linear(t, p + "attn_k", c.n_kv * D, H, bias);
    L.v = make_linear(t, p + "attn_v", c.n_kv * D, H, bias);
    L.o = make_linear(t, p + "attn_output", H, c.n_heads * D, t.contains(p + "attn_output.bias"));
    if (c.qk_norm) {
      L.q_norm = ptr_of<int16_t>(t, p + "attn_q_norm.g", {D});
      L.k_norm = ptr_of<int16_t>(t, p + "attn_k_norm.g", {D});
    }
    L.score_mant = ptr_of<int32_t>(t, p + "attn_score.mant", {1})[0];
    L.score_shift = ptr_of<int32_t>(t, p + "attn_score.shift", {1})[0];
    L.ffn_norm = ptr_of<int16_t>(t, p + "ffn_norm.g", {H});
    L.gate = make_linear(t, p + "ffn_gate", c.ffn, H, false);
    L.up = make_linear(t, p + "ffn_up", c.ffn, H, false);
    L.down = make_linear(t, p + "ffn_down", H, c.ffn, false);
    m.layers.push_back(L);
  }
  m.out_norm = ptr_of<int16_t>(t, "output_norm.g", {H});
  const bool tied = !t.contains("output.q");
  m.output = make_linear(t, "output", c.vocab, H, false, tied ? "tok_embd.q" : "output.q");
  return m;
}

}  // namespace pydict
}  // namespace intdet
