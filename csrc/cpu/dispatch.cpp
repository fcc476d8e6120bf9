// The kernel-set registry and the runtime choice among its entries: the best
// set the CPU runs, or INTDET_ISA / set_isa().
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "intdet/kernels.h"
#include "intdet/model.h"


namespace intdet {

#define INTDET_KERNEL_SET(v) extern const Kernels v;
#include "kernel_sets.inc"
#undef INTDET_KERNEL_SET

namespace {

// A malformed entry is a programming error: refuse it before any kernel runs.
void check_entry(const Kernels& k, const std::vector<const Kernels*>& before) {
  auto bad = [&](const char* why) {
    throw std::logic_error(std::string("kernel set '") + (k.name ? k.name : "?") + "': " + why);
  };
  if (!k.name || !*k.name) bad("no name");
  for (const char* c = k.name; *c; ++c)
    if (std::tolower((unsigned char)*c) != *c) bad("name not lower case");
  if (!k.cpu_runs) bad("no cpu_runs");
  if (!k.qk_tile || !k.pv_tile || !k.attn_row.max || !k.attn_row.exp_sum || !k.attn_row.prob_max ||
      !k.attn_row.prob_w16 || !k.softmax || !k.exp2_row || !k.quant16 || !k.rms_norm || !k.add_sat32 || !k.rope || !k.quant8_row ||
      !k.swiglu || !k.geglu) bad("a row kernel is missing");
  if (!k.linear == !k.linear_packed) bad("needs exactly one of linear, linear_packed");
  if (!k.linear_w4 == !k.linear_w4_packed) bad("needs exactly one of linear_w4, linear_w4_packed");
  const Packing* p = k.packing;
  if (k.linear_packed && !(p && p->w8.pack && p->w8.size && p->w8.channel_bytes))
    bad("linear_packed without an int8 packer");
  if (k.linear_w4_packed && !(p && p->w4.pack && p->w4.size && p->w4.channel_bytes))
    bad("linear_w4_packed without an int4 packer");
  if (p && (p->id < 0 || p->id >= kPackedLayouts)) bad("packing id out of range");
  if (k.planes.linear && !(k.linear_packed && k.planes.ld && k.planes.split_row && k.planes.min_rows >= 1))
    bad("planes.linear without linear_packed, ld, split_row or min_rows >= 1");
  for (const Kernels* o : before) {
    if (std::string(o->name) == k.name) bad("name used twice");
    if (p && o->packing && o->packing != p && o->packing->id == p->id) bad("packing id shared by two layouts");
  }
}

std::vector<const Kernels*> make_registry() {
  std::vector<const Kernels*> sets;
  for (const Kernels* k : {
#define INTDET_KERNEL_SET(v) &v,
#include "kernel_sets.inc"
#undef INTDET_KERNEL_SET
       }) {
    check_entry(*k, sets);
    sets.push_back(k);
  }
  return sets;
}

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

std::string choices() {
  std::string s;
  for (const std::string& n : available_isas()) s += (s.empty() ? "" : ", ") + n;
  return " (choose " + s + ")";
}

// `what` names the request in the error, e.g. "INTDET_ISA=avx512".
const Kernels* by_name(const std::string& name, const std::string& what) {
  for (const Kernels* k : kernel_sets())
    if (k->name == lower(name)) {
      if (!k->cpu_runs()) throw std::invalid_argument(what + ": this CPU lacks it" + choices());
      return k;
    }
  throw std::invalid_argument(what + ": this build has no such kernel set" + choices());
}

const Kernels* pick_default() {
  const char* env = std::getenv("INTDET_ISA");
  if (env && *env) return by_name(env, std::string("INTDET_ISA=") + env);
  const Kernels* best = nullptr;
  for (const Kernels* k : kernel_sets())
    if (k->cpu_runs()) best = k;
  return best;  // scalar runs everywhere
}

// Atomic so a set_isa() racing a forward's snapshot is well defined.
std::atomic<const Kernels*> g_active{nullptr};

}  // namespace

const std::vector<const Kernels*>& kernel_sets() {
  static const std::vector<const Kernels*> sets = make_registry();
  return sets;
}

const Kernels& kernels() {
  const Kernels* k = g_active.load(std::memory_order_acquire);
  if (k) return *k;
  const Kernels* def = pick_default();  // throws for a bad INTDET_ISA (asked again next call)
  return g_active.compare_exchange_strong(k, def, std::memory_order_acq_rel) ? *def : *k;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const Kernels* k : kernel_sets())
    if (k->cpu_runs()) out.push_back(k->name);
  return out;
}

const Kernels& kernel_set(const std::string& name) { return *by_name(name, "ISA '" + name + "'"); }

void set_isa(const std::string& name) { g_active.store(&kernel_set(name), std::memory_order_release); }

}  // namespace intdet
