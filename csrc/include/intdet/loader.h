// The one model loader: config.json text + a tensor source -> Model, with
// every config, dtype, shape, value-range and overflow-bound check in it.
// Used by intdet._core (python/intdet/model.py hands it the mmapped
// tensors), intdet._cuda and csrc/tools/intdet_run. Not part of the integer
// core library (it parses JSON, which has float code); it computes nothing
// between token ids and logits.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "intdet/layout.h"
#include "intdet/model.h"

namespace intdet {

constexpr int64_t kFormatVersion = 2;  // python/intdet/format.py FORMAT_VERSION

// A tensor as its holder has it: C-contiguous, host byte order.
struct TensorView {
  DType dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};
using TensorMap = std::map<std::string, TensorView>;

// Parses and checks config.json (format_version 2). Throws
// std::invalid_argument "<cfg_path>: <what is wrong>".
ModelDesc parse_config(const std::string& json_text, const std::string& cfg_path);

// Builds a Model pointing into `tensors` (which must outlive it); nothing
// packed yet. Every tensor of the table (layout.h) must be present with its
// dtype and shape and every other tensor is refused, so no engine can ignore
// a tensor the converter wrote. release_source: the tensors lie in a
// read-only file mapping, so each weight's pages are dropped once checked.
// Throws std::invalid_argument "<st_path>: <tensor and what is wrong>".
Model build_model(const ModelDesc& d, const TensorMap& tensors, const std::string& st_path,
                  bool release_source = false);

}  // namespace intdet
