// Picks the kernel set from the CPU's features (or INTDET_ISA) once.
#include <cstdlib>
#include <stdexcept>

#include "intdet/kernels.h"
#include "intdet/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace intdet {
namespace {

const Kernels kScalar{"scalar", linear_generic, nullptr, attend_head, softmax_q16_row, exp2_neg_q30_row, quant16_row, swiglu_row,
                      linear_w4_generic, nullptr};
#if defined(__x86_64__) || defined(_M_X64)
const Kernels kAvx2{"avx2", nullptr, linear_avx2_packed, attend_head_avx2, softmax_q16_row_avx2, exp2_neg_q30_row_avx2, quant16_row_avx2, swiglu_row_avx2,
                    nullptr, linear_w4_avx2_packed};
#endif
#if defined(__aarch64__)
const Kernels kNeon{"neon", linear_neon, nullptr, attend_head_neon, softmax_q16_row, exp2_neg_q30_row, quant16_row, swiglu_row,
                    linear_w4_neon, nullptr};
#endif

bool cpu_has(const std::string& name) {
  if (name == "scalar") return true;
#if defined(__aarch64__)
  if (name == "neon") return true;  // ASIMD is part of the aarch64 baseline
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (name == "avx2") return __builtin_cpu_supports("avx2");
#endif
  return false;
}

const Kernels* by_name(const std::string& name) {
  if (name == "scalar") return &kScalar;
#if defined(__x86_64__) || defined(_M_X64)
  if (name == "avx2") return &kAvx2;
#endif
#if defined(__aarch64__)
  if (name == "neon") return &kNeon;
#endif
  return nullptr;
}

const Kernels* pick_default() {
  const char* env = std::getenv("INTDET_ISA");
  if (env && *env) {
    const Kernels* k = by_name(env);
    if (!k) throw std::invalid_argument(std::string("INTDET_ISA=") + env + ": this build has no such kernel set");
    if (!cpu_has(env)) throw std::invalid_argument(std::string("INTDET_ISA=") + env + ": this CPU lacks it");
    return k;
  }
  auto names = available_isas();
  return by_name(names.back());
}

const Kernels*& active() {
  static const Kernels* k = pick_default();
  return k;
}

}  // namespace

const Kernels& kernels() { return *active(); }

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* n : {"scalar", "avx2", "neon"})
    if (by_name(n) && cpu_has(n)) out.push_back(n);
  return out;
}

void set_isa(const std::string& name) {
  const Kernels* k = by_name(name);
  if (!k) throw std::invalid_argument("ISA '" + name + "': this build has no such kernel set");
  if (!cpu_has(name)) throw std::invalid_argument("ISA '" + name + "': this CPU lacks it");
  active() = k;
}

void set_num_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n > 0 ? n : omp_get_num_procs());
#else
  (void)n;
#endif
}

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace intdet
