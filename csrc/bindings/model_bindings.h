// What the _core and _cuda modules share: the loader called on Python's
// tensors (dict name -> numpy array), the tensor table for Python, and one
// template for the forward / forward_batch bindings of either backend.
// Arrays are taken without conversion: a wrong dtype or a non-contiguous
// array is an error, never a silent copy.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "intdet/loader.h"
#include "intdet/model.h"
#include "intdet/trace.h"

namespace intdet {
namespace pybind {

namespace py = pybind11;

template <class T>
using Arr = py::array_t<T, py::array::c_style>;

// config.json as text: a str as it is, a dict through json.dumps.
inline std::string config_text(const py::object& cfg) {
  if (py::isinstance<py::str>(cfg)) return cfg.cast<std::string>();
  return py::module_::import("json").attr("dumps")(cfg).cast<std::string>();
}

// The array's dtype (native byte order only: array_t's check is numpy's
// PyArray_EquivTypes, which tells '>i2' from '<i2').
inline DType dtype_of(const py::array& a, const std::string& name) {
  if (py::isinstance<py::array_t<int8_t>>(a)) return DType::I8;
  if (py::isinstance<py::array_t<uint8_t>>(a)) return DType::U8;
  if (py::isinstance<py::array_t<int16_t>>(a)) return DType::I16;
  if (py::isinstance<py::array_t<int32_t>>(a)) return DType::I32;
  throw std::invalid_argument("model tensor '" + name + "' has dtype " + py::str(a.dtype()).cast<std::string>() +
                              " (a model holds int8, uint8, int16 and int32 tensors in host byte order only)");
}

// Views of the dict's arrays (valid while the dict lives).
inline TensorMap tensor_map(const py::dict& t) {
  TensorMap m;
  for (const auto& [k, v] : t) {
    const std::string name = k.cast<std::string>();
    if (!py::isinstance<py::array>(v)) throw std::invalid_argument("model tensor '" + name + "' is not a numpy array");
    py::array a = v.cast<py::array>();
    if (!(a.flags() & py::array::c_style)) throw std::invalid_argument("model tensor '" + name + "' is not contiguous");
    TensorView tv{dtype_of(a, name), std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), a.data()};
    m.emplace(name, std::move(tv));
  }
  return m;
}

// The loader on Python inputs; the paths only name things in messages.
inline Model load(const py::object& cfg, const py::dict& tensors, const std::string& cfg_path,
                  const std::string& st_path, bool release_source) {
  const ModelDesc d = parse_config(config_text(cfg), cfg_path);
  const TensorMap m = tensor_map(tensors);
  py::gil_scoped_release nogil;  // the checks read every weight: let Python threads (the sha256) run meanwhile
  return build_model(d, m, st_path, release_source);
}

// Adds model_params(config) and check_model(config, tensors) to a module.
inline void bind_loader(py::module_& mod) {
  mod.def(
      "model_params",
      [](const py::object& cfg, const std::string& cfg_path) {
        const ModelDesc d = parse_config(config_text(cfg), cfg_path);
        py::list out;
        for (const Param& p : model_params(d)) {
          py::list ts;
          for (const TensorSpec& s : param_tensors(p, d)) ts.append(py::make_tuple(s.name, dtype_name(s.dtype), s.shape));
          py::dict e;
          e["name"] = p.name;
          e["kind"] = param_kind_name(p.kind);
          e["shape"] = p.experts ? py::tuple(py::make_tuple(p.experts, p.rows, p.cols))
                       : p.cols  ? py::tuple(py::make_tuple(p.rows, p.cols))
                                 : py::tuple(py::make_tuple(p.rows));
          e["bias"] = p.bias;
          e["input"] = p.input;
          e["layer"] = p.layer;
          e["tensors"] = ts;
          out.append(e);
        }
        return out;
      },
      py::arg("config"), py::arg("config_path") = "config.json",
      "The model's parameters in forward order (the one tensor table, csrc/model/layout.cpp): dicts with name, kind "
      "(embedding, rope, norm, post_norm, linear, attn_score, router, experts, lm_head), float shape, bias, input, layer and the stored tensors "
      "[(name, dtype, shape)]. Raises ValueError for a bad config.");
  mod.def(
      "check_model",
      [](const py::object& cfg, const py::dict& tensors, const std::string& cfg_path, const std::string& st_path,
         bool mapped) { (void)load(cfg, tensors, cfg_path, st_path, mapped); },
      py::arg("config"), py::arg("tensors"), py::arg("config_path") = "config.json",
      py::arg("tensors_path") = "model.safetensors", py::arg("mapped") = false,
      "Run every loader check on converted tensors (what Model() checks) without building an engine; ValueError "
      "naming the file and the tensor or key.");
}

// The rows of a traced call (forward_trace of either module): tokens at
// positions start.., one sequence, every row with logits; arguments checked.
inline std::vector<Row> trace_rows(const Config& c, int64_t n_past, int64_t max_len, const Arr<int32_t>& tokens,
                                   int64_t start) {
  const int64_t T = tokens.size();
  if (T == 0) throw std::invalid_argument("forward_trace needs at least one token");
  if (start != n_past) throw std::invalid_argument("start must equal the number of cached positions");
  if (start + T > max_len) throw std::invalid_argument("sequence longer than the KV cache");
  std::vector<Row> rows((size_t)T);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = tokens.data()[t];
    if (tok < 0 || tok >= c.vocab) throw std::invalid_argument("token id out of range");
    rows[t] = Row{0, start + t, tok, true};
  }
  return rows;
}

// A trace as Python's dict name -> int64 array (insertion order = forward order).
inline py::dict trace_dict(const Trace& tr) {
  py::dict named;
  for (const Trace::Tensor& x : tr.tensors) {
    Arr<int64_t> a(std::vector<py::ssize_t>(x.shape.begin(), x.shape.end()));
    std::copy(x.values.begin(), x.values.end(), a.mutable_data());
    named[py::str(x.name)] = a;
  }
  return named;
}

// A new logits array [rows, V]: B::alloc_logits(rows, V) where the backend
// has one (CUDA: page-locked memory), else numpy's.
template <class B>
py::array_t<int32_t> new_logits(int64_t rows, int64_t V) {
  if constexpr (requires { B::alloc_logits(rows, V); })
    return B::alloc_logits(rows, V);
  else
    return py::array_t<int32_t>({rows, V});
}

// forward and forward_batch for a backend B with
//   B::PyModel (member cfg: Config), B::PyState (member n_past),
//   B::max_len(const PyState&), and
//   B::run(PyModel&, std::vector<PyState*>&, const Row*, int64_t T, int32_t* logits), GIL released;
//   optionally B::alloc_logits(rows, V) (new_logits).
template <class B>
void bind_forward(py::module_& mod) {
  using PM = typename B::PyModel;
  using PS = typename B::PyState;
  // Rows of one call: each state's tokens at its next positions.
  struct Call {
    std::vector<Row> rows;
    std::vector<int64_t> nout;
    int64_t total = 0;
  };
  // all_logits[i]: state i returns the logits of every row (else of its last).
  auto plan = [](const Config& c, const std::vector<PS*>& states, const std::vector<Arr<int32_t>>& toks,
                 const std::vector<bool>& all_logits) {
    if (states.size() != toks.size() || states.empty())
      throw std::invalid_argument("forward_batch needs one token array per state");
    if (all_logits.size() != states.size())
      throw std::invalid_argument("forward_batch: all_logits needs one flag per state");
    Call call;
    for (size_t i = 0; i < states.size(); ++i) {
      for (size_t j = 0; j < i; ++j)
        if (states[j] == states[i]) throw std::invalid_argument("forward_batch: a state appears twice");
      const int64_t T = toks[i].size();
      if (T == 0) throw std::invalid_argument("forward needs at least one token");
      if (states[i]->n_past + T > B::max_len(*states[i])) throw std::invalid_argument("sequence longer than the KV cache");
      for (int64_t t = 0; t < T; ++t) {
        const int32_t tok = toks[i].data()[t];
        if (tok < 0 || tok >= c.vocab) throw std::invalid_argument("token id out of range");
        call.rows.push_back(Row{(int64_t)i, states[i]->n_past + t, tok, all_logits[i] || t == T - 1});
      }
      call.nout.push_back(all_logits[i] ? T : 1);
      call.total += all_logits[i] ? T : 1;
    }
    return call;
  };
  // The logits buffer of a call: a new [rows, V] array, or the caller's
  // (reused across calls, so a prefill's 50 MB of logits is not mapped and
  // faulted in afresh each time), checked before anything runs.
  auto logits_out = [](const py::object& o, int64_t rows, int64_t V) -> py::array_t<int32_t> {
    if (o.is_none()) return new_logits<B>(rows, V);
    if (!py::isinstance<py::array_t<int32_t>>(o))
      throw std::invalid_argument("out: an int32 numpy array expected");
    py::array a = o.cast<py::array>();
    if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != V)
      throw std::invalid_argument("out: shape [" + std::to_string(rows) + ", " + std::to_string(V) + "] expected");
    if (!(a.flags() & py::array::c_style) || !a.writeable())
      throw std::invalid_argument("out: a writable C-contiguous array expected");
    return py::reinterpret_borrow<py::array_t<int32_t>>(a);
  };
  mod.def(
      "forward",
      [plan, logits_out](PM& pm, PS& s, Arr<int32_t> tokens, int64_t start, bool all_logits, py::object out_arg) {
        if (start != s.n_past) throw std::invalid_argument("start must equal the number of cached positions");
        std::vector<PS*> states{&s};
        const Call call = plan(pm.cfg, states, {tokens}, {all_logits});
        py::array_t<int32_t> out = logits_out(out_arg, call.total, pm.cfg.vocab);
        int32_t* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          B::run(pm, states, call.rows.data(), (int64_t)call.rows.size(), o);
        }
        s.n_past += tokens.size();
        return out;
      },
      py::arg("model"), py::arg("state"), py::arg("tokens"), py::arg("start"), py::arg("all_logits") = false,
      py::arg("out") = py::none(),
      "Prefill or decode tokens (int32 [T]) at positions start..start+T-1; returns int32 logits [T or 1, V] (Q16), "
      "written into out (a writable C-contiguous int32 array of that shape) when given.");
  mod.def(
      "forward_batch",
      [plan, logits_out](PM& pm, std::vector<PS*> states, std::vector<Arr<int32_t>> toks, py::object all_logits,
                         py::object out_arg) {
        std::vector<bool> flags;
        if (py::isinstance<py::bool_>(all_logits))
          flags.assign(states.size(), all_logits.cast<bool>());
        else
          flags = all_logits.cast<std::vector<bool>>();
        const Call call = plan(pm.cfg, states, toks, flags);
        const int64_t V = pm.cfg.vocab;
        // One array for the whole call; each sequence gets a view of its rows
        // (no copy: the logits of a decode step are V int32 per row).
        py::array_t<int32_t> out = logits_out(out_arg, call.total, V);
        int32_t* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          B::run(pm, states, call.rows.data(), (int64_t)call.rows.size(), o);
        }
        py::list res;
        int64_t off = 0;
        for (size_t i = 0; i < states.size(); ++i) {
          res.append(py::array_t<int32_t>({call.nout[i], V}, {V * (int64_t)sizeof(int32_t), (int64_t)sizeof(int32_t)},
                                          o + off * V, out));
          off += call.nout[i];
          states[i]->n_past += toks[i].size();
        }
        return res;
      },
      py::arg("model"), py::arg("states"), py::arg("tokens"), py::arg("all_logits") = false,
      py::arg("out") = py::none(),
      "Advance several sequences in one call (batched decode / mixed prefill); all_logits: a bool for every "
      "sequence or one per sequence. Returns one int32 logits array per sequence ([T_i or 1, V], views of one "
      "buffer: out, a writable C-contiguous int32 array of [sum of the rows, V], when given), each identical "
      "to running that sequence alone.");
}

}  // namespace pybind
}  // namespace intdet
