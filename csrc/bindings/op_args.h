// Argument checks of the _core.ops bindings: the row kernels trust their
// sizes, so every op checks ranks and shapes first and raises ValueError
// (std::invalid_argument) naming the op and the arrays instead of reading
// past a buffer.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace intdet::op_args {

namespace py = pybind11;

// A shape as Python prints it: (8,), (2, 3), ().
inline std::string dims(const std::vector<py::ssize_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}
inline std::string shape_of(const py::array& a) { return dims({a.shape(), a.shape() + a.ndim()}); }

[[noreturn]] inline void fail(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string(op) + ": " + why);
}

// a has exactly `rank` dimensions.
inline void rank(const char* op, const py::array& a, const char* name, py::ssize_t r) {
  if (a.ndim() != r)
    fail(op, std::string(name) + " must have " + std::to_string(r) + " dimension" + (r == 1 ? "" : "s") +
                 ", got shape " + shape_of(a));
}

// a has exactly the given shape (its rank included).
inline void shape(const char* op, const py::array& a, const char* name, const std::vector<py::ssize_t>& want) {
  bool ok = a.ndim() == (py::ssize_t)want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = a.shape((py::ssize_t)i) == want[i];
  if (!ok) fail(op, std::string(name) + " must have shape " + dims(want) + ", got " + shape_of(a));
}

// a and b have one shape (element-wise ops).
inline void same_shape(const char* op, const py::array& a, const char* an, const py::array& b, const char* bn) {
  bool ok = a.ndim() == b.ndim();
  for (py::ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) == b.shape(i);
  if (!ok)
    fail(op, std::string(an) + " and " + bn + " must have the same shape, got " + shape_of(a) + " and " + shape_of(b));
}

// Rows of the last axis (at least one axis).
inline void has_rows(const char* op, const py::array& a, const char* name) {
  if (a.ndim() < 1) fail(op, std::string(name) + " must have at least 1 dimension, got a scalar");
}

}  // namespace intdet::op_args
