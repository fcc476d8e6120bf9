// pybind11 module intdet._core: the model, its KV cache state, and each op
// exposed row-wise for the bit-exact tests against the numpy spec.
// Arrays are taken as pybind's array_t gives them: a C-contiguous array of
// the declared dtype is used in place; other integer widths, bools and
// strided arrays are converted by numpy (a copy); floats and other types
// are refused with pybind's TypeError. These bindings serve the tests.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "intdet/attention.h"
#include "intdet/intmath.h"
#include "intdet/kernels.h"
#include "intdet/model.h"
#include "intdet/ops.h"
#include "intdet/trace.h"
#include "compress_bindings.h"
#include "model_bindings.h"
#include "op_args.h"

namespace py = pybind11;
using namespace intdet;

namespace {

// Owns the Python arrays the Model points into.
struct PyModel {
  Model m;
  Config cfg;
  py::dict keep;
};

struct PyState {
  KVCache kv;
  int64_t n_past = 0;
};

// The CPU backend for pybind::bind_forward.
struct Cpu {
  using PyModel = ::PyModel;
  using PyState = ::PyState;
  static int64_t max_len(const PyState& s) { return s.kv.max_len; }
  static void run(PyModel& pm, std::vector<PyState*>& states, const Row* rows, int64_t T, int32_t* logits) {
    std::vector<KVCache*> caches;
    for (PyState* s : states) caches.push_back(&s->kv);
    forward_rows(pm.m, caches.data(), rows, T, logits);
  }
};

// Positions [0, n) of src into dst (caches of one model, maybe of different
// lengths): per layer the last min(n, cap) positions, as a ring layer keeps
// only those (a layer's window is at most its cap - kForwardRows).
void copy_kv_prefix(const KVCache& src, KVCache& dst, int64_t n) {
  if (src.cap.size() != dst.cap.size() || src.n_kv != dst.n_kv || src.k.size() * dst.ka.size() != dst.k.size() * src.ka.size())
    throw std::invalid_argument("copy_prefix: the states belong to different models");
  const int64_t D = src.ka.empty() ? 0 : (int64_t)(src.k.size() / src.ka.size());
  for (size_t l = 0; l < src.cap.size(); ++l) {
    const int64_t keep = std::min({n, src.cap[l], dst.cap[l]});
    for (int64_t pos = n - keep; pos < n; ++pos) {
      const int64_t rs = src.row((int64_t)l, pos), rd = dst.row((int64_t)l, pos);
      for (int64_t g = 0; g < src.n_kv; ++g) {
        const int64_t is = src.at((int64_t)l, rs, g), id = dst.at((int64_t)l, rd, g);
        std::memcpy(&dst.k[(size_t)(id * D)], &src.k[(size_t)(is * D)], (size_t)D);
        std::memcpy(&dst.v[(size_t)(id * D)], &src.v[(size_t)(is * D)], (size_t)D);
        dst.ka[(size_t)id] = src.ka[(size_t)is];
        dst.va[(size_t)id] = src.va[(size_t)is];
      }
    }
  }
}

using I64Arr = py::array_t<int64_t, py::array::c_style>;

I64Arr new_like(const I64Arr& a) {
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  return I64Arr(shape);
}

// Applies a row op to every row of a C-contiguous int64 array.
template <typename F>
I64Arr rows(const I64Arr& x, F f) {
  I64Arr out = new_like(x);
  const int64_t n = x.ndim() ? x.shape(x.ndim() - 1) : 1;
  const int64_t R = n ? x.size() / n : 0;
  for (int64_t r = 0; r < R; ++r) f(x.data() + r * n, n, out.mutable_data() + r * n);
  return out;
}

}  // namespace

// The test-only SIMDe build (CMakeLists.txt) compiles this file again as _core_simde.
#ifndef INTDET_CORE_MODULE_NAME
#define INTDET_CORE_MODULE_NAME _core
#endif

PYBIND11_MODULE(INTDET_CORE_MODULE_NAME, mod) {
  mod.doc() = "intdet integer engine (portable scalar C++ backend)";
  py::class_<PyModel>(mod, "Model")
      .def(py::init([](const py::object& cfg, const py::dict& t, bool mapped, const std::string& cfg_path,
                       const std::string& st_path) {
             auto pm = std::make_unique<PyModel>();
             pm->keep = t;
             // mapped: the tensors are views of a read-only file mapping, so
             // pages may be dropped once checked and once packed.
             pm->m = pybind::load(cfg, t, cfg_path, st_path, mapped);
             pm->cfg = pm->m.cfg;
             {
               py::gil_scoped_release nogil;  // pure C++ on raw views: Python threads (the sha256) run meanwhile
               pack_model(pm->m, mapped);
             }
             return pm.release();
           }),
           py::arg("config"), py::arg("tensors"), py::arg("mapped") = false, py::arg("config_path") = "config.json",
           py::arg("tensors_path") = "model.safetensors",
           "Check and wrap converted tensors (config.json text or dict; dict name -> numpy array, exact dtypes) "
           "without copying; ValueError naming the file and the tensor or key.");
  py::class_<PyState>(mod, "State")
      .def(py::init([](const PyModel& pm, int64_t max_len) {
             if (max_len <= 0 || max_len > pm.m.cfg.ctx)
               throw std::invalid_argument("max_len must be in [1, context_length]");
             auto* s = new PyState();
             s->kv.init(pm.m, max_len);  // rings for sliding-window layers
             return s;
           }),
           py::arg("model"), py::arg("max_len"))
      .def_readonly("n_past", &PyState::n_past)
      .def("reset", [](PyState& s) { s.n_past = 0; })
      // Keep the first n cached positions: rows carry their positions, so the
      // next forward writes over the dropped ones (speculative decoding).
      .def("truncate", [](PyState& s, int64_t n) {
        if (n < 0 || n > s.n_past) throw std::invalid_argument("truncate: n outside [0, cached positions]");
        s.n_past = n;
      }, py::arg("n"))
      // Start an empty state from the first n cached positions of src (a
      // state of the same model): the prefix cache. The K/V rows and scales
      // of a position are what a forward writes for it, so the copy is the
      // KV a prefill of those tokens would make, bit for bit.
      .def("copy_prefix", [](PyState& s, const PyState& src, int64_t n) {
        if (s.n_past != 0) throw std::invalid_argument("copy_prefix: the state is not empty");
        if (n < 0 || n > src.n_past || n > s.kv.max_len)
          throw std::invalid_argument("copy_prefix: n outside [0, min(cached positions, max_len)]");
        copy_kv_prefix(src.kv, s.kv, n);
        s.n_past = n;
      }, py::arg("src"), py::arg("n"));
  pybind::bind_forward<Cpu>(mod);
  pybind::bind_loader(mod);

  // ---- primitives and ops, for bit-exact tests against ref/ ----
  // Each checks its arguments' ranks and shapes first (op_args.h): the
  // kernels trust them. Row kernels run on the active kernel set, taken once.
  namespace oa = intdet::op_args;
  py::module_ ops = mod.def_submodule("ops", "scalar C++ ops on int64 arrays, for tests");
  ops.def("round_shift", [](const I64Arr& x, const I64Arr& s) {
    oa::same_shape("round_shift", x, "x", s, "s");
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i) out.mutable_data()[i] = round_shift(x.data()[i], s.data()[i]);
    return out;
  });
  ops.def("shift_round_sat32", [](const I64Arr& x, const I64Arr& s) {
    oa::same_shape("shift_round_sat32", x, "x", s, "s");
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i) out.mutable_data()[i] = shift_round_sat32(x.data()[i], s.data()[i]);
    return out;
  });
  // round_div and the reciprocal divisions (intmath.h DivBy, the CUDA
  // device's '/': a DivBy per element here, so every (a, b) pair goes
  // through recip_u64 and udiv) share one shape: positive divisors
  // (floor_div's contract; 0 would trap), elementwise.
  auto def_div = [&ops](const char* name, int64_t (*f)(int64_t, int64_t)) {
    ops.def(name, [name, f](const I64Arr& a, const I64Arr& b) {
      oa::same_shape(name, a, "a", b, "b");
      for (py::ssize_t i = 0; i < b.size(); ++i)
        if (b.data()[i] <= 0) oa::fail(name, "divisors must be positive");
      I64Arr out = new_like(a);
      for (py::ssize_t i = 0; i < a.size(); ++i) out.mutable_data()[i] = f(a.data()[i], b.data()[i]);
      return out;
    });
  };
  def_div("round_div", [](int64_t a, int64_t b) { return round_div(a, b); });
  def_div("floor_div_recip", [](int64_t a, int64_t b) { return floor_div(a, div_by(b)); });
  def_div("round_div_recip", [](int64_t a, int64_t b) { return round_div(a, div_by(b)); });
  // recip_u64 of d >= 1: floor((2^64 - 1) / d), uint64.
  ops.def("recip_u64", [](const py::array_t<uint64_t, py::array::c_style>& d) {
    for (py::ssize_t i = 0; i < d.size(); ++i)
      if (d.data()[i] == 0) oa::fail("recip_u64", "divisors must be positive");
    py::array_t<uint64_t> out(std::vector<py::ssize_t>(d.shape(), d.shape() + d.ndim()));
    for (py::ssize_t i = 0; i < d.size(); ++i) out.mutable_data()[i] = recip_u64(d.data()[i]);
    return out;
  });
  ops.def("isqrt", [](const I64Arr& x) {
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i) {
      if (x.data()[i] < 0) oa::fail("isqrt", "negative input");
      out.mutable_data()[i] = isqrt(x.data()[i]);
    }
    return out;
  });
  ops.def("bitlen", [](const I64Arr& x) {
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i) {
      if (x.data()[i] < 0) oa::fail("bitlen", "negative input");
      out.mutable_data()[i] = bitlen(x.data()[i]);
    }
    return out;
  });
  ops.def("softcap", [](const I64Arr& x, int64_t cap, int64_t inv_mant, int64_t inv_shift) {  // intmath.h
    if (cap < 1 || cap > kInt32Max || inv_mant < 1 || inv_mant > kInt32Max || inv_shift < 5 || inv_shift > 62)
      oa::fail("softcap", "constants outside cap, inv_mant in [1, 2^31), inv_shift in [5, 62]");
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i) {
      if (iabs(x.data()[i]) > kInt32Max) oa::fail("softcap", "input outside the int32 range");
      out.mutable_data()[i] = softcap(x.data()[i], Softcap{cap, inv_mant, inv_shift});
    }
    return out;
  });
  ops.def("exp2_neg_q30", [](const I64Arr& x) {  // active ISA's row kernel
    I64Arr out = new_like(x);
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] < 0) oa::fail("exp2_neg_q30", "negative input");
    kernels().exp2_row(x.data(), (int64_t)x.size(), out.mutable_data());
    return out;
  });
  ops.def("rms_norm", [](const I64Arr& x, py::array_t<int16_t, py::array::c_style> g, int64_t eps, int in_frac) {
    oa::has_rows("rms_norm", x, "x");
    const py::ssize_t H = x.shape(x.ndim() - 1);
    oa::shape("rms_norm", g, "g", {H});
    if (H > 8192) oa::fail("rms_norm", "rows longer than 8192 overflow the int64 sum of squares");
    const auto norm = kernels().rms_norm;  // active ISA
    return rows(x, [&](const int64_t* r, int64_t n, int64_t* o) {
      std::vector<int32_t> y((size_t)n);
      norm(r, g.data(), n, eps, in_frac, y.data());
      for (int64_t i = 0; i < n; ++i) o[i] = y[i];
    });
  });
  ops.def("quant16", [](const I64Arr& x) {
    oa::has_rows("quant16", x, "x");
    const auto quant = kernels().quant16;  // active ISA
    std::vector<int64_t> es;
    I64Arr q = rows(x, [&](const int64_t* r, int64_t n, int64_t* o) {
      std::vector<int16_t> v((size_t)n);
      es.push_back(quant(r, n, v.data()));
      for (int64_t i = 0; i < n; ++i) o[i] = v[i];
    });
    return py::make_tuple(q, py::array_t<int64_t>((py::ssize_t)es.size(), es.data()));
  });
  ops.def("quant8_row", [](const I64Arr& x) {
    oa::has_rows("quant8_row", x, "x");
    for (py::ssize_t k = 0; k < x.size(); ++k)  // quant8_row's domain: its absmax is an int32
      if (x.data()[k] > kInt32Max || x.data()[k] < -kInt32Max)
        oa::fail("quant8_row", "x values must be within int32 (|x| <= 2^31 - 1)");
    std::vector<int64_t> as;
    I64Arr q = rows(x, [&](const int64_t* r, int64_t n, int64_t* o) {
      std::vector<int8_t> v((size_t)n);
      as.push_back(kernels().quant8_row(r, n, v.data()));  // active ISA
      for (int64_t i = 0; i < n; ++i) o[i] = v[i];
    });
    return py::make_tuple(q, py::array_t<int64_t>((py::ssize_t)as.size(), as.data()));
  });
  ops.def("softmax_q16", [](const I64Arr& z) {
    oa::has_rows("softmax_q16", z, "z");
    return rows(z, kernels().softmax);  // active ISA
  });
  ops.def("swiglu", [](const I64Arr& g, const I64Arr& u) {
    oa::same_shape("swiglu", g, "g", u, "u");
    I64Arr out = new_like(g);
    kernels().swiglu(g.data(), u.data(), g.size(), out.mutable_data());  // active ISA
    return out;
  });
  ops.def("add_sat32", [](const I64Arr& x, const I64Arr& d) {  // the residual add: sat32(x + d)
    oa::same_shape("add_sat32", x, "x", d, "d");
    constexpr int64_t lim = (int64_t)1 << 62;  // compared directly: iabs(INT64_MIN) is undefined
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] >= lim || x.data()[i] <= -lim || d.data()[i] >= lim || d.data()[i] <= -lim)
        oa::fail("add_sat32", "values must be below 2^62 in magnitude");
    I64Arr out = new_like(x);
    std::copy(x.data(), x.data() + x.size(), out.mutable_data());
    kernels().add_sat32(out.mutable_data(), d.data(), x.size());  // active ISA
    return out;
  });
  ops.def("geglu", [](const I64Arr& g, const I64Arr& u) {
    oa::same_shape("geglu", g, "g", u, "u");
    I64Arr out = new_like(g);
    kernels().geglu(g.data(), u.data(), g.size(), out.mutable_data());  // active ISA
    return out;
  });
  ops.def("rope", [](const I64Arr& x, py::array_t<int16_t, py::array::c_style> cos,
                     py::array_t<int16_t, py::array::c_style> sin) {
    // x [T, nh, D], cos/sin [T, D/2]
    oa::rank("rope", x, "x", 3);
    const int64_t T = x.shape(0), nh = x.shape(1), D = x.shape(2);
    if (D % 2) oa::fail("rope", "head size D = x.shape[2] must be even");
    oa::shape("rope", cos, "cos", {T, D / 2});
    oa::shape("rope", sin, "sin", {T, D / 2});
    constexpr int64_t lim = (int64_t)1 << 47;  // rope_row's bound: x * cos +- x * sin stays in int64
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] >= lim || x.data()[i] <= -lim) oa::fail("rope", "x values must be below 2^47 in magnitude");
    I64Arr out = new_like(x);
    std::copy(x.data(), x.data() + x.size(), out.mutable_data());
    for (int64_t t = 0; t < T; ++t)  // active ISA
      kernels().rope(out.mutable_data() + t * nh * D, nh, D, cos.data() + t * D / 2, sin.data() + t * D / 2);
    return out;
  });
  ops.def("linear", [](py::array_t<int16_t, py::array::c_style> q, py::array_t<int32_t, py::array::c_style> e,
                       py::array_t<int8_t, py::array::c_style> w, py::array_t<int32_t, py::array::c_style> mant,
                       py::array_t<int32_t, py::array::c_style> shift) {
    // q [T, K], e [T], w [N, K], mant/shift [N]
    oa::rank("linear", q, "q", 2);
    oa::rank("linear", w, "w", 2);
    const int64_t T = q.shape(0), K = q.shape(1), N = w.shape(0);
    if (T < 1 || K < 1 || N < 1) oa::fail("linear", "q and w must not be empty");
    oa::shape("linear", w, "w", {N, K});
    oa::shape("linear", e, "e", {T});
    oa::shape("linear", mant, "mant", {N});
    oa::shape("linear", shift, "shift", {N});
    I64Arr out({T, N});
    const Kernels& k = kernels();
    if (k.linear_packed) {  // this kernel set reads repacked weights, as after pack_model
      std::vector<int8_t> wp((size_t)k.packing->w8.size(N, K));
      k.packing->w8.pack(w.data(), N, K, wp.data());
      if (k.planes.linear && T >= k.planes.min_rows) {  // as the forward does (Act16 in forward.cpp)
        const int64_t ld = k.planes.ld(K), rows = (T + kPlaneRows - 1) / kPlaneRows * kPlaneRows;
        std::vector<int8_t> hi((size_t)(rows * ld));
        std::vector<uint8_t> lo((size_t)(rows * ld));
        for (int64_t t = 0; t < T; ++t) k.planes.split_row(q.data() + t * K, K, hi.data() + t * ld, lo.data() + t * ld);
        k.planes.linear(hi.data(), lo.data(), ld, e.data(), T, K, wp.data(), mant.data(), shift.data(), nullptr, N,
                        out.mutable_data(), N);
      } else {
        k.linear_packed(q.data(), e.data(), T, K, wp.data(), mant.data(), shift.data(), nullptr, N,
                        out.mutable_data(), N);
      }
    } else {
      k.linear(q.data(), e.data(), T, K, w.data(), mant.data(), shift.data(), nullptr, N, out.mutable_data(), N);
    }
    return out;
  });
  ops.def("packed_rows", [](py::array_t<int8_t, py::array::c_style> w) -> py::object {
    // w [N, K] packed in the active kernel set's int8 layout, then every row
    // read back with its row reader (W8Packer::row, how the embedding reads a
    // tied head's packed copy); None when the set reads row-major weights.
    oa::rank("packed_rows", w, "w", 2);
    const int64_t N = w.shape(0), K = w.shape(1);
    if (N < 1 || K < 1) oa::fail("packed_rows", "w must not be empty");
    const Kernels& k = kernels();
    if (!k.packing || !k.packing->w8.pack || !k.packing->w8.row) return py::none();
    std::vector<int8_t> wp((size_t)k.packing->w8.size(N, K));
    k.packing->w8.pack(w.data(), N, K, wp.data());
    py::array_t<int8_t> out({N, K});
    for (int64_t n = 0; n < N; ++n) k.packing->w8.row(wp.data(), K, n, out.mutable_data() + n * K);
    return std::move(out);
  });
  ops.def("linear_w4", [](py::array_t<int16_t, py::array::c_style> q, py::array_t<int32_t, py::array::c_style> e,
                          py::array_t<uint8_t, py::array::c_style> w4, py::array_t<int16_t, py::array::c_style> gd,
                          py::array_t<int16_t, py::array::c_style> gm, py::array_t<int32_t, py::array::c_style> mant,
                          py::array_t<int32_t, py::array::c_style> shift) {
    // Int4 linear with the active kernel set (docs/format.md): q [T, K], e [T],
    // w4 [N, K/2], gd/gm [N, K/32], mant/shift [N].
    oa::rank("linear_w4", q, "q", 2);
    oa::rank("linear_w4", w4, "w4", 2);
    const int64_t T = q.shape(0), K = q.shape(1), N = w4.shape(0);
    if (T < 1 || K < 1 || N < 1) oa::fail("linear_w4", "q and w4 must not be empty");
    if (K % 32) oa::fail("linear_w4", "K = q.shape[1] must be a multiple of 32");
    oa::shape("linear_w4", w4, "w4", {N, K / 2});
    oa::shape("linear_w4", gd, "gd", {N, K / 32});
    oa::shape("linear_w4", gm, "gm", {N, K / 32});
    oa::shape("linear_w4", e, "e", {T});
    oa::shape("linear_w4", mant, "mant", {N});
    oa::shape("linear_w4", shift, "shift", {N});
    I64Arr out({T, N});
    const Kernels& k = kernels();
    if (k.linear_w4_packed) {  // as after pack_model
      std::vector<uint8_t> wp((size_t)k.packing->w4.size(N, K));
      k.packing->w4.pack(w4.data(), gd.data(), gm.data(), N, K, wp.data());
      k.linear_w4_packed(q.data(), e.data(), T, K, wp.data(), nullptr, nullptr, mant.data(), shift.data(), nullptr, N,
                         out.mutable_data(), N);
    } else {
      k.linear_w4(q.data(), e.data(), T, K, w4.data(), gd.data(), gm.data(), mant.data(), shift.data(), nullptr, N,
                  out.mutable_data(), N);
    }
    return out;
  });
  ops.def("attend", [](py::array_t<int16_t, py::array::c_style> q, int e_q, py::array_t<int8_t, py::array::c_style> kc,
                       py::array_t<int32_t, py::array::c_style> ka, py::array_t<int8_t, py::array::c_style> vc,
                       py::array_t<int32_t, py::array::c_style> va, int64_t score_mant, int64_t score_shift) {
    // One query head (q [D]) over n positions (kc, vc [n, D]; ka, va [n]).
    oa::rank("attend", kc, "kc", 2);
    const int64_t n = kc.shape(0), D = kc.shape(1);
    if (n < 1 || D < 1) oa::fail("attend", "kc must not be empty");
    if (D > 256) oa::fail("attend", "head size D = kc.shape[1] must be at most 256");  // int32 score bound
    oa::shape("attend", q, "q", {D});
    oa::shape("attend", vc, "vc", {n, D});
    oa::shape("attend", ka, "ka", {n});
    oa::shape("attend", va, "va", {n});
    std::vector<int64_t> z((size_t)n), p((size_t)n);
    std::vector<int16_t> w((size_t)n);
    I64Arr out((py::ssize_t)D);
    // attend_head (ops_generic.cpp): the scalar reference of one (row, head),
    // against which the kernel sets' tiles and the CUDA kernels are tested.
    attend_head(q.data(), e_q, kc.data(), ka.data(), vc.data(), va.data(), n, D, D, score_mant, score_shift, z.data(),
                p.data(), w.data(), out.mutable_data());
    return out;
  });
  ops.def("attn_row_passes", [](const I64Arr& z, int64_t rr, py::array_t<int32_t, py::array::c_style> va, int e) {
    // The active set's softmax row passes (AttnRowFns, kernels.h) on one
    // row's scores z [n] (int32 range), with the caller's 2^62 / tot `rr`
    // and exponent `e` (so a test reaches every case): returns (zmax, u [n],
    // sum u, pmax, w16 [n]).
    const char* op = "attn_row_passes";
    oa::rank(op, z, "z", 1);
    const int64_t n = z.shape(0);
    if (n < 1) oa::fail(op, "z must not be empty");
    oa::shape(op, va, "va", {n});
    for (int64_t i = 0; i < n; ++i) {
      if (z.data()[i] < -kInt32Max || z.data()[i] > kInt32Max) oa::fail(op, "z must lie in [-(2^31 - 1), 2^31 - 1]");
      if (va.data()[i] < 0) oa::fail(op, "va must be >= 0 (absmax scales)");
    }
    if (rr < 1 || rr >= ((int64_t)1 << 33)) oa::fail(op, "rr must lie in [1, 2^33)");
    if (e < 0 || e > 40) oa::fail(op, "e must lie in [0, 40]");
    const AttnRowFns& f = kernels().attn_row;
    I64Arr u((py::ssize_t)n);
    std::copy(z.data(), z.data() + n, u.mutable_data());
    const int64_t zmax = f.max(z.data(), n);
    const int64_t tot = f.exp_sum(u.mutable_data(), n, zmax);
    const int64_t pmax = f.prob_max(u.data(), n, rr, va.data());
    std::vector<int16_t> w((size_t)n);
    f.prob_w16(u.data(), n, rr, va.data(), e, w.data());
    return py::make_tuple(zmax, u, tot, pmax, py::array_t<int16_t>((py::ssize_t)n, w.data()));
  });
  ops.def("attend_rows", [](py::array_t<int64_t, py::array::c_style> q, py::array_t<int8_t, py::array::c_style> kc,
                            py::array_t<int32_t, py::array::c_style> ka, py::array_t<int8_t, py::array::c_style> vc,
                            py::array_t<int32_t, py::array::c_style> va, py::array_t<int64_t, py::array::c_style> pos,
                            int64_t score_mant, int64_t score_shift, int64_t window) {
    // One layer's attention (attend_layer, the forward's tiles) for rows
    // at positions pos [T] of one sequence, queries q [T, nh, D] (Q16, before
    // quant16) over the cache kc, vc [P, nkv, D], ka, va [P, nkv]. The cache
    // is filled in position order up to the latest row, so a sliding window
    // (window > 0, P past window + kForwardRows) reads from a ring. Returns
    // out [T, nh, D].
    const char* op = "attend_rows";
    oa::rank(op, q, "q", 3);
    oa::rank(op, kc, "kc", 3);
    const int64_t T = q.shape(0), nh = q.shape(1), D = q.shape(2), P = kc.shape(0), nkv = kc.shape(1);
    if (T < 1 || P < 1 || nkv < 1 || D < 2) oa::fail(op, "q and kc must not be empty");
    if (D > 256 || D % 2) oa::fail(op, "head size D must be even and at most 256");
    if (nh % nkv) oa::fail(op, "query heads q.shape[1] must be a multiple of kv heads kc.shape[1]");
    oa::shape(op, kc, "kc", {P, nkv, D});
    oa::shape(op, vc, "vc", {P, nkv, D});
    oa::shape(op, ka, "ka", {P, nkv});
    oa::shape(op, va, "va", {P, nkv});
    oa::shape(op, pos, "pos", {T});
    if (window < 0) oa::fail(op, "window must be >= 0");
    for (int64_t i = 0; i < P * nkv; ++i)
      if (va.data()[i] < 0) oa::fail(op, "va must be >= 0 (absmax scales)");
    Model m;
    m.cfg.n_layers = 1;
    m.cfg.n_heads = nh;
    m.cfg.n_kv = nkv;
    m.cfg.head_dim = D;
    m.layers.resize(1);
    m.layers[0].score_mant = score_mant;
    m.layers[0].score_shift = score_shift;
    m.layers[0].window = window;
    std::vector<Row> rows((size_t)T);
    int64_t last = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (pos.data()[t] < 0 || pos.data()[t] >= P) oa::fail(op, "pos must lie in [0, kc.shape[0])");
      rows[t] = Row{0, pos.data()[t], 0, false};
      last = std::max(last, pos.data()[t]);
    }
    KVCache kv;
    kv.init(m, P);
    for (int64_t p = 0; p <= last; ++p) {  // as the forward leaves it: written up to the latest row
      const int64_t r = kv.row(0, p);
      for (int64_t g = 0; g < nkv; ++g) {  // [P, nkv, D] in, the cache's head-major layout out
        const int64_t i = kv.at(0, r, g), j = p * nkv + g;
        std::copy(kc.data() + j * D, kc.data() + (j + 1) * D, kv.k.data() + i * D);
        std::copy(vc.data() + j * D, vc.data() + (j + 1) * D, kv.v.data() + i * D);
        kv.ka[i] = ka.data()[j];
        kv.va[i] = va.data()[j];
      }
    }
    I64Arr out({T, nh, D});
    KVCache* caches[1] = {&kv};
    const int nt = forward_threads();
    try {
      attend_layer(nt, kernels(), m, 0, caches, rows.data(), T, q.data(), out.mutable_data());
    } catch (const std::logic_error& e) {
      oa::fail(op, e.what());
    }
    return out;
  });
  // ---- named intermediates (scripts/first_divergence.py) ----
  mod.def(
      "forward_trace",
      [](const PyModel& pm, PyState& s, py::array_t<int32_t, py::array::c_style> tokens, int64_t start,
         std::optional<std::string> isa) {
        const Kernels& ks = isa ? kernel_set(*isa) : kernels();  // this call only: no global switch
        const int64_t T = tokens.size();
        const std::vector<Row> rows = pybind::trace_rows(pm.m.cfg, s.n_past, s.kv.max_len, tokens, start);
        py::array_t<int32_t> out({T, pm.m.cfg.vocab});
        Trace tr;
        {
          py::gil_scoped_release nogil;
          KVCache* caches[1] = {&s.kv};
          forward_rows_traced(pm.m, caches, rows.data(), T, out.mutable_data(), ks, tr);
        }
        s.n_past = start + T;
        py::dict named = pybind::trace_dict(tr);
        return py::make_tuple(out, named, tr.isa);
      },
      py::arg("model"), py::arg("state"), py::arg("tokens"), py::arg("start"), py::arg("isa") = py::none(),
      "forward(..., all_logits=True) on kernel set `isa` (default: the active one) that also returns the "
      "named intermediates: (logits int32 [T, V], dict name -> int64 array in forward order, the kernel "
      "set's name). Names and values as the ref spec's trace (python/intdet/ref/model.py).");
  mod.def("set_op_profile", &set_op_profile, py::arg("on"),
          "Per-op wall time of every forward (scripts/profile_cpu.py): True clears the sums and starts, False stops.");
  mod.def(
      "op_profile",
      []() {
        py::list out;
        for (const OpTime& t : op_profile()) out.append(py::make_tuple(t.op, t.layer, t.calls, t.ns));
        return out;
      },
      "The sums since set_op_profile(True): list of (op, layer (-1: outside the layers), calls, ns), "
      "in forward order; ('forward', -1, ...) is the whole forward.");
  mod.def("available_isas", &available_isas, "Kernel sets this build has and this CPU runs (best last).");
  mod.def("set_isa", &set_isa, py::arg("name"), "Force a kernel set (scalar, avx2, ...).");
  mod.def("isa", []() { return std::string(kernels().name); }, "The active kernel set.");
  mod.def("kernels_ready", []() { (void)kernels(); }, "Select the kernel set now (raises ValueError for a bad INTDET_ISA).");
  mod.def("set_num_threads", &set_num_threads, py::arg("n"),
          "Threads for prefill/decode: n > 0 exactly n; 0 auto (the cores this process may use, fewer while other "
          "processes keep some busy).");
  mod.def("num_threads", &num_threads, "The fixed thread count, or in auto mode the cores this process may use.");
  mod.def("auto_thread_count", &auto_thread_count, py::arg("ncpu"), py::arg("ceiling"), py::arg("busy"),
          py::arg("total"), py::arg("self"), "Auto's rule on one load sample (csrc/cpu/threads.cpp), for tests.");
  mod.def("thread_setting", &thread_setting, "What set_num_threads was given (0 = auto).");
  mod.def("last_forward_threads", &last_forward_threads, "The thread count the latest forward used.");
  pybind::bind_compress(mod);
}
