// pybind11 module intdet._cuda: the CUDA backend with the API of intdet._core
// (Model, State, forward, forward_batch), so python/intdet/model.py's Engine
// uses either one. Built only when CMake finds nvcc (INTDET_CUDA); it imports
// without a GPU, and device_count() then says 0 and why.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../bindings/model_bindings.h"
#include "engine.h"
#include "intdet/intmath.h"
#include "intdet/model.h"

namespace py = pybind11;
using namespace intdet;

namespace {

// A host Model pointing into the Python arrays (valid while `t` lives),
// checked by the one loader, then the CUDA kernels' own index range.
Model host_model(const py::object& cfg, const py::dict& t, const std::string& cfg_path, const std::string& st_path) {
  Model m = pybind::load(cfg, t, cfg_path, st_path, false);
  const Config& c = m.cfg;
  if (c.vocab >= ((int64_t)1 << 31) || c.ffn >= ((int64_t)1 << 24) || c.n_heads * c.head_dim >= ((int64_t)1 << 24))
    throw std::invalid_argument("model config has sizes beyond the CUDA kernels' index range");
  return m;
}

struct PyModel {
  cuda::ModelPtr dev;
  Config cfg;
};

struct PyState {
  cuda::StatePtr dev;
  int64_t n_past = 0;
  int64_t max_len = 0;
  PyModel* model = nullptr;  // kept alive by the State's keep_alive
};

// The CUDA backend for pybind::bind_forward.
struct Gpu {
  using PyModel = ::PyModel;
  using PyState = ::PyState;
  static int64_t max_len(const PyState& s) { return s.max_len; }
  static void run(PyModel& pm, std::vector<PyState*>& states, const Row* rows, int64_t T, int32_t* logits) {
    std::vector<cuda::DeviceState*> devs;
    for (PyState* s : states) devs.push_back(s->dev.get());
    cuda::forward_rows(*pm.dev, devs.data(), (int64_t)devs.size(), rows, T, logits);
  }
  // The logits arrays in page-locked memory from the pinned pool (the copies
  // from the device run at full speed and asynchronously); each array owns
  // its block through a capsule that gives it back. Pageable numpy memory
  // when the runtime cannot pin more.
  static py::array_t<int32_t> alloc_logits(int64_t rows, int64_t V) {
    void* p = cuda::pinned_alloc((size_t)(rows * V) * sizeof(int32_t));
    if (!p) return py::array_t<int32_t>({rows, V});
    py::capsule owner(p, [](void* q) { cuda::pinned_release(q); });
    return py::array_t<int32_t>({rows, V}, {V * (int64_t)sizeof(int32_t), (int64_t)sizeof(int32_t)},
                                static_cast<int32_t*>(p), owner);
  }
};

bool env_graphs() {
  const char* v = std::getenv("INTDET_CUDA_GRAPHS");
  return v && *v && std::string(v) != "0";
}

using pybind::Arr;

}  // namespace

#ifndef INTDET_CUDA_MODULE_NAME
#define INTDET_CUDA_MODULE_NAME _cuda  // _cuda_emu for the host emulation build (tests)
#endif

PYBIND11_MODULE(INTDET_CUDA_MODULE_NAME, mod) {
  mod.doc() = "intdet integer engine, CUDA backend (same logits as intdet._core, bit for bit)";
  mod.def(
      "device_count", []() { return cuda::device_count(); }, "CUDA devices visible (0 without a driver or GPU).");
  mod.def(
      "no_device_reason",
      []() {
        std::string why;
        return cuda::device_count(&why) ? std::string() : why;
      },
      "Why device_count() is 0 ('' when a device is visible).");
  mod.def("device_name", &cuda::device_name, py::arg("device") = 0);
  mod.def("isa", []() { return std::string("cuda"); });
  mod.def("launch_count", &cuda::launch_count,
          "Kernel launches enqueued by this process so far (a graph replay adds none).");

  py::class_<PyModel>(mod, "Model")
      .def(py::init([](const py::object& cfg, const py::dict& tensors, py::object graphs, const std::string& cfg_path,
                       const std::string& st_path) {
             Model h = host_model(cfg, tensors, cfg_path, st_path);
             auto* pm = new PyModel();
             pm->cfg = h.cfg;
             {
               py::gil_scoped_release nogil;
               pm->dev = cuda::upload_model(h);
             }
             cuda::set_graphs(*pm->dev, graphs.is_none() ? env_graphs() : graphs.cast<bool>());
             return pm;
           }),
           py::arg("config"), py::arg("tensors"), py::arg("cuda_graphs") = py::none(),
           py::arg("config_path") = "config.json", py::arg("tensors_path") = "model.safetensors",
           "Upload converted tensors (dict name -> numpy array, exact dtypes) to the GPU. cuda_graphs: replay "
           "decode steps from CUDA graphs (default: env INTDET_CUDA_GRAPHS=1).")
      .def_property(
          "cuda_graphs", [](const PyModel& m) { return cuda::graphs(*m.dev); },
          [](PyModel& m, bool on) { cuda::set_graphs(*m.dev, on); })
      .def_property_readonly("weight_bytes", [](const PyModel& m) { return cuda::weight_bytes(*m.dev); });

  py::class_<PyState>(mod, "State")
      .def(py::init([](PyModel& pm, int64_t max_len) {
             auto* s = new PyState();
             s->dev = cuda::new_state(*pm.dev, max_len);
             s->max_len = max_len;
             s->model = &pm;
             return s;
           }),
           py::arg("model"), py::arg("max_len"), py::keep_alive<1, 2>())
      .def_readonly("n_past", &PyState::n_past)
      .def("reset", [](PyState& s) { s.n_past = 0; })
      // Keep the first n cached positions: rows carry their positions, so the
      // next forward writes over the dropped ones (speculative decoding).
      .def("truncate", [](PyState& s, int64_t n) {
        if (n < 0 || n > s.n_past) throw std::invalid_argument("truncate: n outside [0, cached positions]");
        s.n_past = n;
      }, py::arg("n"))
      // Start an empty state from the first n cached positions of src (a
      // state of the same model): the prefix cache, as the CPU core's.
      .def("copy_prefix", [](PyState& s, const PyState& src, int64_t n) {
        if (s.n_past != 0) throw std::invalid_argument("copy_prefix: the state is not empty");
        if (s.model != src.model) throw std::invalid_argument("copy_prefix: the states belong to different models");
        if (n < 0 || n > src.n_past || n > s.max_len)
          throw std::invalid_argument("copy_prefix: n outside [0, min(cached positions, max_len)]");
        cuda::copy_prefix(*s.model->dev, *src.dev, *s.dev, n);
        s.n_past = n;
      }, py::arg("src"), py::arg("n"));

  pybind::bind_forward<Gpu>(mod);
  mod.def(
      "forward_trace",
      [](PyModel& pm, PyState& s, Arr<int32_t> tokens, int64_t start) {
        const int64_t T = tokens.size();
        const std::vector<Row> rows = pybind::trace_rows(pm.cfg, s.n_past, s.max_len, tokens, start);
        py::array_t<int32_t> out({T, pm.cfg.vocab});
        Trace tr;
        {
          py::gil_scoped_release nogil;
          cuda::DeviceState* devs[1] = {s.dev.get()};
          cuda::forward_rows_traced(*pm.dev, devs, 1, rows.data(), T, out.mutable_data(), tr);
        }
        s.n_past = start + T;
        py::dict named = pybind::trace_dict(tr);
        return py::make_tuple(out, named, tr.isa);
      },
      py::arg("model"), py::arg("state"), py::arg("tokens"), py::arg("start"),
      "forward(..., all_logits=True) that also returns the named intermediates, copied from the device after "
      "each step (never from a CUDA graph): (logits int32 [T, V], dict name -> int64 array in forward order, "
      "'cuda'). Names, order, shapes and values as intdet._core.forward_trace.");

  mod.def(
      "submit_pick",
      [](PyModel& pm, PyState& s, py::object tokens, int64_t start, int64_t t_num, int64_t t_den, uint64_t draw,
         int64_t top_k, int64_t p_num, int64_t p_den, int64_t m_num, int64_t m_den) {
        if (start != s.n_past) throw std::invalid_argument("submit_pick: start must equal the number of cached positions");
        Arr<int32_t> tk;
        int64_t T = 1;
        if (!tokens.is_none()) {
          tk = tokens.cast<Arr<int32_t>>();
          T = tk.size();
          if (T == 0) throw std::invalid_argument("submit_pick: empty tokens");
        }
        if (start + T > s.max_len) throw std::invalid_argument("sequence longer than the KV cache");
        {
          py::gil_scoped_release nogil;
          cuda::submit_pick(*pm.dev, *s.dev, tokens.is_none() ? nullptr : tk.data(), T, start,
                            cuda::Pick{t_num, t_den, draw, top_k, p_num, p_den, m_num, m_den});
        }
        s.n_past = start + T;
      },
      py::arg("model"), py::arg("state"), py::arg("tokens"), py::arg("start"), py::arg("t_num") = 0,
      py::arg("t_den") = 1, py::arg("draw") = 0, py::arg("top_k") = 0, py::arg("p_num") = 1, py::arg("p_den") = 1,
      py::arg("m_num") = 0, py::arg("m_den") = 1,
      "Enqueue a forward of tokens (int32 [T]; None: one row whose token is the one the previous submit_pick "
      "chose, read on the device) at positions start.., the choice of the last row's token on the device "
      "(t_num 0: greedy, the largest logit, the lowest id on ties; else temperature t_num / t_den sampling with "
      "the 64-bit draw for position start + T, top-k, top-p p_num / p_den, min-p m_num / m_den: Sampler.pick's "
      "token without a repetition penalty) and the copies of "
      "that row's logits and the token into pinned host memory; returns without waiting (wait_pick).");
  mod.def(
      "wait_pick",
      [](py::object model) {
        PyModel& pm = model.cast<PyModel&>();
        const int32_t* lg = nullptr;
        int32_t tok = 0;
        {
          py::gil_scoped_release nogil;
          tok = cuda::wait_pick(*pm.dev, &lg);
        }
        py::array_t<int32_t> view({(py::ssize_t)pm.cfg.vocab}, {(py::ssize_t)sizeof(int32_t)}, lg, model);
        py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        return py::make_tuple(tok, view);
      },
      py::arg("model"),
      "Wait for the last submit_pick: (token, its logits int32 [V], a read-only view of pinned memory valid "
      "until the second submit_pick after this one).");

  mod.def(
      "profile",
      [](PyModel& pm, PyState& s, Arr<int32_t> tokens, int64_t start) {
        const int64_t T = tokens.size();
        std::vector<Row> rows = pybind::trace_rows(pm.cfg, s.n_past, s.max_len, tokens, start);
        for (int64_t t = 0; t + 1 < T; ++t) rows[(size_t)t].want_logits = false;  // the last row's logits only
        py::array_t<int32_t> out({(int64_t)1, pm.cfg.vocab});
        std::vector<cuda::ProfStep> steps;
        {
          py::gil_scoped_release nogil;
          cuda::DeviceState* devs[1] = {s.dev.get()};
          steps = cuda::forward_rows_profiled(*pm.dev, devs, 1, rows.data(), T, out.mutable_data());
        }
        s.n_past = start + T;
        py::list l;
        for (const cuda::ProfStep& p : steps) l.append(py::make_tuple(p.name, p.ns, p.bytes, p.launches));
        return py::make_tuple(out, l);
      },
      py::arg("model"), py::arg("state"), py::arg("tokens"), py::arg("start"),
      "forward (the last row's logits, never from a CUDA graph) with a cudaEvent after every step: (logits "
      "int32 [1, V], [(step, nanoseconds, bytes read at least, launches), ...] in forward order; the steps of "
      "every layer repeat).");

  // ---- single ops on the device, for the bit-exact tests against intdet._core.ops ----
  py::module_ ops = mod.def_submodule("ops", "CUDA kernels on host arrays, for tests");
  ops.def(
      "linear",
      [](Arr<int16_t> q, Arr<int32_t> e, Arr<int8_t> w, Arr<int32_t> mant, Arr<int32_t> shift, py::object bias,
         int path, py::object residual) {
        if (q.ndim() != 2 || w.ndim() != 2 || w.shape(1) != q.shape(1) || e.size() != q.shape(0) ||
            mant.size() != w.shape(0) || shift.size() != w.shape(0))
          throw std::invalid_argument("linear: shape mismatch");
        const int64_t T = q.shape(0), K = q.shape(1), N = w.shape(0);
        Arr<int32_t> b;
        if (!bias.is_none()) {
          b = bias.cast<Arr<int32_t>>();
          if (b.size() != N) throw std::invalid_argument("linear: bias shape mismatch");
        }
        Arr<int32_t> init;
        if (!residual.is_none()) {
          init = residual.cast<Arr<int32_t>>();
          if (init.ndim() != 2 || init.shape(0) != T || init.shape(1) != N)
            throw std::invalid_argument("linear: residual shape mismatch");
        }
        std::vector<int32_t> o((size_t)(T * N));
        cuda::test::linear(q.data(), e.data(), T, K, w.data(), mant.data(), shift.data(),
                           bias.is_none() ? nullptr : b.data(), N, path, o.data(),
                           residual.is_none() ? nullptr : init.data());
        py::array_t<int64_t> out({T, N});
        std::copy(o.begin(), o.end(), out.mutable_data());
        return out;
      },
      py::arg("q"), py::arg("e"), py::arg("w"), py::arg("mant"), py::arg("shift"), py::arg("bias") = py::none(),
      py::arg("path") = 0, py::arg("residual") = py::none(),
      "int64 [T, N]; path 0 auto, 1 GEMV, 2 tensor-core (IMMA) GEMM, 3 __dp2a tiled GEMM, 4 skinny IMMA GEMM "
      "(decode batches, split-K); residual: int32 [T, N], then sat32(residual + linear) (the o / down-proj "
      "store).");
  ops.def(
      "linear_w4",
      [](Arr<int16_t> q, Arr<int32_t> e, Arr<uint8_t> w4, Arr<int16_t> gd, Arr<int16_t> gm, Arr<int32_t> mant,
         Arr<int32_t> shift, py::object bias, int path) {
        if (q.ndim() != 2 || w4.ndim() != 2 || gd.ndim() != 2 || gm.ndim() != 2) throw std::invalid_argument("linear_w4: shape mismatch");
        const int64_t T = q.shape(0), K = q.shape(1), N = w4.shape(0);
        if (K % 32 || w4.shape(1) != K / 2 || gd.shape(0) != N || gd.shape(1) != K / 32 || gm.shape(0) != N ||
            gm.shape(1) != K / 32 || e.size() != T || mant.size() != N || shift.size() != N)
          throw std::invalid_argument("linear_w4: shape mismatch");
        Arr<int32_t> b;
        if (!bias.is_none()) {
          b = bias.cast<Arr<int32_t>>();
          if (b.size() != N) throw std::invalid_argument("linear_w4: bias shape mismatch");
        }
        std::vector<int32_t> o((size_t)(T * N));
        cuda::test::linear_w4(q.data(), e.data(), T, K, w4.data(), gd.data(), gm.data(), mant.data(), shift.data(),
                              bias.is_none() ? nullptr : b.data(), N, path, o.data());
        py::array_t<int64_t> out({T, N});
        std::copy(o.begin(), o.end(), out.mutable_data());
        return out;
      },
      py::arg("q"), py::arg("e"), py::arg("w4"), py::arg("gd"), py::arg("gm"), py::arg("mant"), py::arg("shift"),
      py::arg("bias") = py::none(), py::arg("path") = 0,
      "int4 weights (codes w4 [N, K/2], gd, gm [N, K/32]); int64 [T, N]; path 0 auto, 1 GEMV, 2 tiled GEMM.");
  ops.def(
      "attend",
      [](Arr<int32_t> q, Arr<int8_t> kc, Arr<int32_t> ka, Arr<int8_t> vc, Arr<int32_t> va, int64_t score_mant,
         int64_t score_shift) {
        const int64_t n = kc.shape(0), D = kc.shape(1);
        if (kc.ndim() != 2 || q.size() != D || vc.shape(0) != n || vc.shape(1) != D || ka.size() != n ||
            va.size() != n || D > 256 || n < 1)
          throw std::invalid_argument("attend: shape mismatch");
        py::array_t<int64_t> out(D);
        cuda::test::attend(q.data(), 1, 1, D, kc.data(), ka.data(), vc.data(), va.data(), n, score_mant, score_shift,
                           0, out.mutable_data());
        return out;
      },
      "One int32 query head (quantized to int16 on the device) over n cached positions; int64 [D].");
  ops.def(
      "attend_gqa",
      [](Arr<int32_t> q, Arr<int8_t> kc, Arr<int32_t> ka, Arr<int8_t> vc, Arr<int32_t> va, int64_t score_mant,
         int64_t score_shift, int chunk) {
        if (q.ndim() != 2 || kc.ndim() != 3 || vc.ndim() != 3 || ka.ndim() != 2 || va.ndim() != 2)
          throw std::invalid_argument("attend_gqa: q [nh, D], kc/vc [n, nkv, D], ka/va [n, nkv]");
        const int64_t nh = q.shape(0), D = q.shape(1), n = kc.shape(0), nkv = kc.shape(1);
        if (kc.shape(2) != D || vc.shape(0) != n || vc.shape(1) != nkv || vc.shape(2) != D || ka.shape(0) != n ||
            ka.shape(1) != nkv || va.shape(0) != n || va.shape(1) != nkv || D > 256 || n < 1 || nkv < 1 || nh % nkv)
          throw std::invalid_argument("attend_gqa: shape mismatch");
        if (chunk < 0 || chunk > 512) throw std::invalid_argument("attend_gqa: chunk must be in [0, 512]");
        py::array_t<int64_t> out({nh, D});
        cuda::test::attend(q.data(), nh, nkv, D, kc.data(), ka.data(), vc.data(), va.data(), n, score_mant,
                           score_shift, chunk, out.mutable_data());
        return out;
      },
      py::arg("q"), py::arg("kc"), py::arg("ka"), py::arg("vc"), py::arg("va"), py::arg("score_mant"),
      py::arg("score_shift"), py::arg("chunk") = 0,
      "nh int32 query heads over an nkv-head cache (GQA); chunk > 0: the split path in chunks of that many "
      "positions, 0: the launcher's choice (one kernel up to 2048 positions); int64 [nh, D].");
  ops.def(
      "attend_rows",
      [](Arr<int32_t> q, Arr<int8_t> kc, Arr<int32_t> ka, Arr<int8_t> vc, Arr<int32_t> va, Arr<int32_t> pos,
         int64_t window, int64_t score_mant, int64_t score_shift, int path) {
        if (q.ndim() != 3 || kc.ndim() != 3 || vc.ndim() != 3 || ka.ndim() != 2 || va.ndim() != 2 || pos.ndim() != 1)
          throw std::invalid_argument("attend_rows: q [T, nh, D], kc/vc [n, nkv, D], ka/va [n, nkv], pos [T]");
        const int64_t T = q.shape(0), nh = q.shape(1), D = q.shape(2), n = kc.shape(0), nkv = kc.shape(1);
        if (kc.shape(2) != D || vc.shape(0) != n || vc.shape(1) != nkv || vc.shape(2) != D || ka.shape(0) != n ||
            ka.shape(1) != nkv || va.shape(0) != n || va.shape(1) != nkv || pos.shape(0) != T || D > 256 || n < 1 ||
            nkv < 1 || nh % nkv || T < 1 || window < 0)
          throw std::invalid_argument("attend_rows: shape mismatch");
        for (int64_t t = 0; t < T; ++t)
          if (pos.data()[t] < 0 || pos.data()[t] >= n) throw std::invalid_argument("attend_rows: pos out of [0, n)");
        if (path < 0 || path > 4) throw std::invalid_argument("attend_rows: path must be 0, 1, 2, 3 or 4");
        py::array_t<int64_t> out({T, nh, D});
        py::array_t<int16_t> act({T, nh * D});
        py::array_t<int32_t> act_e(T);
        cuda::test::attend_rows(q.data(), T, nh, nkv, D, kc.data(), ka.data(), vc.data(), va.data(), n, pos.data(),
                                window, score_mant, score_shift, path, out.mutable_data(), act.mutable_data(),
                                act_e.mutable_data());
        return py::make_tuple(out, act, act_e);
      },
      py::arg("q"), py::arg("kc"), py::arg("ka"), py::arg("vc"), py::arg("va"), py::arg("pos"), py::arg("window"),
      py::arg("score_mant"), py::arg("score_shift"), py::arg("path") = 0,
      "T query rows of one sequence (row t at position pos[t]) over an nkv-head cache; path 0 auto (flash tiles "
      "for > 32 rows, else one kernel up to 2048 positions, else the split), 1 flash-decoding split, 2 tensor "
      "cores (16-row tiles, score scratch), 3 one kernel per (row, kv head), 4 flash tiles (FA2 shape); (out int64 [T, nh, D], act int16 [T, nh*D], act_e [T]).");
  ops.def("set_attn_path", &cuda::test::set_attn_path, py::arg("path"),
          "Force the attention path of launches that would choose, where it can serve them (1 flash-decoding "
          "split, 2 tensor cores, 3 one kernel per (row, kv head), 4 flash tiles; 0 or anything else: the launcher's choice). "
          "Tests and the device check.");
  ops.def("set_logits_rows", &cuda::test::set_logits_rows, py::arg("slice"), py::arg("group"),
          "Force the rows per lm_head slice (each slice's logits copied on the copy stream) and per lm_head "
          "group (0: the built-in sizes, 32 rows and 256 MB of logits). Tests only.");
  ops.def("set_emu_stream_order", &cuda::test::set_emu_stream_order, py::arg("latest_first"),
          "Host emulator only: at a synchronization point run the latest-created stream's ready work first "
          "(True) or the earliest's (False, the default). Tests only.");
  ops.def(
      "pinned_stats",
      []() {
        const cuda::PinnedStats s = cuda::pinned_stats();
        py::dict d;
        d["allocs"] = s.allocs;
        d["reuses"] = s.reuses;
        d["frees"] = s.frees;
        d["kept_blocks"] = s.kept_blocks;
        d["kept_bytes"] = s.kept_bytes;
        d["live_blocks"] = s.live_blocks;
        return d;
      },
      "The pinned logits pool's counters: blocks pinned, requests served by a kept block, blocks freed, "
      "blocks and bytes kept now, blocks handed out. Tests only.");
  ops.def("set_gemv_split", &cuda::test::set_gemv_split, py::arg("wlg"),
          "Force the GEMV's warps per channel to 2**wlg (0..2; -1: the launcher's choice). Tests only.");
  ops.def("set_prefill_gemm", &cuda::test::set_prefill_gemm, py::arg("path"),
          "The GEMM of linears over 256 rows (prefill): 2 the earlier tiled IMMA GEMM (q, k, v, gate, up "
          "each its own launch), anything else the skinny GEMM (fused; the default). The device check's A/B "
          "timing and tests; the same bits.");
  ops.def("set_skinny_split", &cuda::test::set_skinny_split, py::arg("splits"),
          "Force the skinny GEMM's K splits (0: the launcher's choice; more than its K tiles: one per K tile). "
          "Tests only.");
  ops.def(
      "gemv_prologue",
      [](int kind, py::object x, py::object g, int64_t eps_q60, int in_frac, py::object a, int64_t T,
         Arr<int8_t> w, Arr<int32_t> mant, Arr<int32_t> shift, py::object bias) {
        if (w.ndim() != 2 || mant.size() != w.shape(0) || shift.size() != w.shape(0) || T < 1)
          throw std::invalid_argument("gemv_prologue: shape mismatch");
        const int64_t N = w.shape(0), K = w.shape(1);
        Arr<int32_t> xa, ba;
        Arr<int16_t> ga;
        Arr<int64_t> aa;
        if (kind == 1) {
          xa = x.cast<Arr<int32_t>>();
          ga = g.cast<Arr<int16_t>>();
          if (xa.ndim() != 2 || xa.shape(0) != T || xa.shape(1) != K || ga.size() != K)
            throw std::invalid_argument("gemv_prologue: x or g shape");
        } else {
          aa = a.cast<Arr<int64_t>>();
          if (aa.ndim() != 2 || aa.shape(0) != T || aa.shape(1) != K) throw std::invalid_argument("gemv_prologue: a shape");
        }
        if (!bias.is_none()) {
          ba = bias.cast<Arr<int32_t>>();
          if (ba.size() != N) throw std::invalid_argument("gemv_prologue: bias shape mismatch");
        }
        std::vector<int32_t> o((size_t)(T * N));
        cuda::test::gemv_prologue(kind, kind == 1 ? xa.data() : nullptr, kind == 1 ? ga.data() : nullptr, eps_q60, in_frac, kind == 1 ? nullptr : aa.data(),
                                  T, K, w.data(), mant.data(), shift.data(), bias.is_none() ? nullptr : ba.data(), N,
                                  o.data());
        py::array_t<int64_t> out({T, N});
        std::copy(o.begin(), o.end(), out.mutable_data());
        return out;
      },
      py::arg("kind"), py::arg("x"), py::arg("g"), py::arg("eps_q60"), py::arg("in_frac"),
      py::arg("a"), py::arg("T"), py::arg("w"), py::arg("mant"), py::arg("shift"), py::arg("bias") = py::none(),
      "int64 [T, N]: the decode GEMV whose prologue computes its input: kind 1 quant16(RMSNorm(x))"
      " (in_frac: x's fixed point), kind 2 quant16(a) (a [T, K] int64).");
  ops.def("norm_quant16", [](Arr<int32_t> x, Arr<int16_t> g, int64_t eps_q60) {
    if (x.ndim() != 2 || g.size() != x.shape(1) || x.shape(1) > 8192) throw std::invalid_argument("norm_quant16: shape");
    const int64_t R = x.shape(0), n = x.shape(1);
    py::array_t<int16_t> q({R, n});
    py::array_t<int32_t> e(R);
    cuda::test::norm_quant16(x.data(), g.data(), R, n, eps_q60, q.mutable_data(), e.mutable_data());
    return py::make_tuple(q, e);
  });
  ops.def("swiglu", [](Arr<int32_t> g, Arr<int32_t> u) {
    if (g.size() != u.size()) throw std::invalid_argument("swiglu: shape mismatch");
    py::array_t<int64_t> a(g.size());
    cuda::test::swiglu(g.data(), u.data(), g.size(), a.mutable_data());
    return a;
  });
  ops.def("geglu", [](Arr<int32_t> g, Arr<int32_t> u) {
    if (g.size() != u.size()) throw std::invalid_argument("geglu: shape mismatch");
    py::array_t<int64_t> a(g.size());
    cuda::test::geglu(g.data(), u.data(), g.size(), a.mutable_data());
    return a;
  });
  ops.def("argmax", [](Arr<int32_t> logits) {
    if (logits.ndim() != 2 || logits.shape(1) == 0) throw std::invalid_argument("argmax: logits must be [R, V], V > 0");
    py::array_t<int32_t> out(logits.shape(0));
    cuda::test::argmax(logits.data(), logits.shape(0), logits.shape(1), out.mutable_data());
    return out;
  });
  ops.def(
      "sample",
      [](Arr<int32_t> logits, int64_t t_num, int64_t t_den, uint64_t draw, int64_t top_k, int64_t p_num,
         int64_t p_den, int64_t m_num, int64_t m_den) {
        if (logits.ndim() != 1 || logits.size() == 0) throw std::invalid_argument("sample: logits must be [V], V > 0");
        return cuda::test::sample(logits.data(), logits.size(),
                                  cuda::Pick{t_num, t_den, draw, top_k, p_num, p_den, m_num, m_den});
      },
      py::arg("logits"), py::arg("t_num"), py::arg("t_den"), py::arg("draw"), py::arg("top_k") = 0,
      py::arg("p_num") = 1, py::arg("p_den") = 1, py::arg("m_num") = 0, py::arg("m_den") = 1,
      "Sampler.pick's token on the device (temperature t_num / t_den, the 64-bit draw, top-k, top-p "
      "p_num / p_den, min-p m_num / m_den).");
  ops.def("round_div", [](Arr<int64_t> a, Arr<int64_t> b) {
    if (a.size() != b.size()) throw std::invalid_argument("round_div: shape mismatch");
    py::array_t<int64_t> out(a.size());
    cuda::test::round_div(a.data(), b.data(), a.size(), out.mutable_data());
    return out;
  });
  ops.def(
      "div_bench",
      [](Arr<int64_t> a, Arr<int64_t> b, int reps, int mode) {
        if (a.size() != b.size()) throw std::invalid_argument("div_bench: shape mismatch");
        if (mode < 0 || mode > 3 || reps < 1) throw std::invalid_argument("div_bench: mode 0..3, reps >= 1");
        for (py::ssize_t i = 0; i < b.size(); ++i)
          if (b.data()[i] <= 0 || a.data()[i] < 0 || a.data()[i] > ((int64_t)1 << 62) || b.data()[i] > ((int64_t)1 << 62))
            throw std::invalid_argument("div_bench: needs 0 <= a <= 2^62, 1 <= b <= 2^62");
        py::array_t<int64_t> out(a.size());
        const int64_t ns = cuda::test::div_bench(a.data(), b.data(), a.size(), reps, mode, out.mutable_data());
        return py::make_tuple(out, ns);
      },
      py::arg("a"), py::arg("b"), py::arg("reps"), py::arg("mode"),
      "(sums, kernel ns): sum over r < reps of floor((a + r) / divisor), divisor b + r (mode 0 udiv_u64, "
      "1 DivBy per division) or b (mode 2 udiv_u64, 3 one DivBy); scripts/bench_div.py.");
  // udiv_u64, the bit-serial division (the device's before DivBy), run on the
  // host: the reference test_cuda.py holds it to.
  ops.def("floor_div_intonly", [](Arr<int64_t> a, Arr<int64_t> b) {
    if (a.size() != b.size()) throw std::invalid_argument("floor_div_intonly: shape mismatch");
    py::array_t<int64_t> out(a.size());
    for (py::ssize_t i = 0; i < a.size(); ++i) {
      if (b.data()[i] <= 0) throw std::invalid_argument("floor_div_intonly: divisor must be > 0");
      out.mutable_data()[i] = floor_div_intonly(a.data()[i], b.data()[i]);
    }
    return out;
  });
}
