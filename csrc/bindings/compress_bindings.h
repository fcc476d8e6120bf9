// intdet._core.compress: the probability table and range coder of
// `intdet compress` (csrc/compress/, docs/compress.md). Arrays must be
// C-contiguous int32 of the stated shapes; anything else is a ValueError.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "../compress/coder.h"

namespace intdet::pybind {

namespace pyc {
namespace py = pybind11;
using I32Arr = py::array_t<int32_t, py::array::c_style>;

inline I32Arr i32(const py::handle& h, const char* what) {
  if (!py::isinstance<py::array>(h)) throw py::value_error(std::string(what) + ": expected a numpy int32 array");
  py::array a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().is(py::dtype::of<int32_t>()) || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + ": expected a C-contiguous int32 array");
  return py::reinterpret_borrow<I32Arr>(a);
}

inline void check_table(int64_t V, int precision) {
  if (V < 1 || V > compress::kMaxVocab) throw py::value_error("vocab size " + std::to_string(V) + " outside [1, 2^22]");
  if (precision < compress::kMinPrecision || precision > compress::kMaxPrecision)
    throw py::value_error("precision " + std::to_string(precision) + " outside [24, 30]");
}

// The decoder owns a copy of its bytes.
struct PyDecoder {
  std::string data;
  compress::RangeDecoder dec;
  explicit PyDecoder(std::string d) : data(std::move(d)), dec((const uint8_t*)data.data(), data.size()) {}
};
}  // namespace pyc

inline void bind_compress(pybind11::module_& parent) {
  namespace py = pybind11;
  using namespace pyc;
  py::module_ m = parent.def_submodule("compress", "Integer probability table and range coder (docs/compress.md)");
  m.def(
      "freq_table",
      [](const py::object& logits, int precision) {
        I32Arr z = i32(logits, "logits");
        if (z.ndim() != 2) throw py::value_error("logits: expected shape [rows, vocab]");
        const int64_t R = z.shape(0), V = z.shape(1);
        check_table(V, precision);
        py::array_t<uint32_t> f({R, V});
        {
          py::gil_scoped_release nogil;
          for (int64_t r = 0; r < R; ++r) compress::freq_table(z.data() + r * V, V, precision, f.mutable_data() + r * V);
        }
        return f;
      },
      py::arg("logits"), py::arg("precision"),
      "Frequencies uint32 [rows, vocab] of int32 logits [rows, vocab] (Q16), each row summing to 2^precision.");
  // module_local: _core and the test module _core_simde both bind these types.
  py::class_<compress::RangeEncoder>(m, "RangeEncoder", py::module_local())
      .def(py::init<>())
      .def(
          "encode",
          [](compress::RangeEncoder& e, uint64_t cum, uint64_t freq, int precision) {
            if (precision < 1 || precision > compress::kMaxPrecision || freq < 1 || cum + freq > ((uint64_t)1 << precision))
              throw py::value_error("encode: need freq >= 1, cum + freq <= 2^precision, precision in [1, 30]");
            e.encode(cum, freq, precision);
          },
          py::arg("cum"), py::arg("freq"), py::arg("precision"))
      .def(
          "encode_rows",
          [](compress::RangeEncoder& e, const py::object& logits, const py::object& targets, int precision) {
            I32Arr z = i32(logits, "logits"), t = i32(targets, "targets");
            if (z.ndim() != 2 || t.ndim() != 1 || t.shape(0) != z.shape(0))
              throw py::value_error("encode_rows: logits [T, V] and targets [T] expected");
            const int64_t T = z.shape(0), V = z.shape(1);
            check_table(V, precision);
            for (int64_t i = 0; i < T; ++i)
              if (t.data()[i] < 0 || t.data()[i] >= V) throw py::value_error("encode_rows: target id outside the vocab");
            py::gil_scoped_release nogil;
            compress::encode_rows(e, z.data(), T, V, t.data(), precision);
          },
          py::arg("logits"), py::arg("targets"), py::arg("precision"),
          "Code targets int32 [T] under the tables of logits int32 [T, V] (built in parallel).")
      .def("finish", [](compress::RangeEncoder& e) {
        std::vector<uint8_t> b = e.finish();
        return py::bytes((const char*)b.data(), b.size());
      });
  py::class_<PyDecoder>(m, "RangeDecoder", py::module_local())
      .def(py::init([](const py::bytes& b) { return new PyDecoder(std::string(b)); }), py::arg("data"))
      .def(
          "target", [](PyDecoder& d, int precision) { return d.dec.target(precision); }, py::arg("precision"),
          "The next symbol's slot in [0, 2^precision), -1 for impossible data; then consume(cum, freq).")
      .def(
          "consume", [](PyDecoder& d, uint64_t cum, uint64_t freq) { d.dec.consume(cum, freq); }, py::arg("cum"),
          py::arg("freq"));
  m.def(
      "decode_rows",
      [](const py::list& decoders, const py::list& logits, int precision) {
        const int64_t B = (int64_t)decoders.size();
        if ((int64_t)logits.size() != B) throw py::value_error("decode_rows: one logits row per decoder expected");
        std::vector<I32Arr> keep;
        std::vector<const int32_t*> rows;
        std::vector<compress::RangeDecoder*> decs;
        int64_t V = -1;
        for (int64_t b = 0; b < B; ++b) {
          keep.push_back(i32(logits[b], "logits"));
          if (V < 0) V = keep.back().size();
          if (keep.back().size() != V) throw py::value_error("decode_rows: logits rows differ in size");
          rows.push_back(keep.back().data());
          decs.push_back(&decoders[b].cast<PyDecoder&>().dec);
        }
        py::array_t<int32_t> out(B);
        if (B == 0) return out;
        check_table(V, precision);
        {
          py::gil_scoped_release nogil;
          compress::decode_rows(decs.data(), rows.data(), B, V, precision, out.mutable_data());
        }
        return out;
      },
      py::arg("decoders"), py::arg("logits"), py::arg("precision"),
      "Next token of each RangeDecoder under its logits row (int32, V values): int32 [B], -1 = corrupt.");
}

}  // namespace intdet::pybind
