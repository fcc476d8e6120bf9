// The per-op time sums behind set_op_profile (trace.h): one mutex, taken once
// per forward, and only while profiling is on.
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "intdet/trace.h"

namespace intdet {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mu;
std::vector<OpTime> g_sums;                         // first-seen order
std::map<std::pair<int64_t, std::string>, size_t> g_index;  // (layer, op) -> g_sums index

}  // namespace

void set_op_profile(bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (on) {
    g_sums.clear();
    g_index.clear();
  }
  g_on.store(on, std::memory_order_relaxed);
}

bool op_profile_on() { return g_on.load(std::memory_order_relaxed); }

std::vector<OpTime> op_profile() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_sums;
}

void op_profile_add(const std::vector<OpTime>& times) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const OpTime& t : times) {
    auto [it, fresh] = g_index.try_emplace({t.layer, t.op}, g_sums.size());
    if (fresh) g_sums.push_back({t.op, t.layer, 0, 0});
    g_sums[it->second].calls += t.calls;
    g_sums[it->second].ns += t.ns;
  }
}

}  // namespace intdet
