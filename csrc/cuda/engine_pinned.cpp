// The pool of page-locked host blocks behind the logits arrays forward
// returns (engine.h pinned_alloc): a device-to-host copy into pinned memory
// runs at the link's speed and asynchronously, one into pageable memory is
// staged by the driver at a fraction of it. cudaHostAlloc and cudaFreeHost
// are slow (and cudaFreeHost waits for the device), so released blocks are
// kept and handed out again.
#include <map>
#include <mutex>

#include "engine_state.h"

namespace intdet {
namespace cuda {
namespace {

// Free blocks kept at most (bytes, all together); a release beyond it frees.
constexpr size_t kPinnedKeepBytes = (size_t)512 << 20;
// Requests round up to this, so nearby sizes (batch 63, batch 64) share blocks.
constexpr size_t kPinnedGranule = (size_t)64 << 10;

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> kept;  // free blocks by size
  std::map<void*, size_t> live;  // handed out: block -> size
  size_t kept_bytes = 0;
  PinnedStats st;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: arrays may outlive static destruction
  return *p;
}

}  // namespace

void* pinned_alloc(size_t bytes) {
  const size_t want = (std::max<size_t>(bytes, 1) + kPinnedGranule - 1) / kPinnedGranule * kPinnedGranule;
  Pool& P = pool();
  {
    std::lock_guard<std::mutex> lk(P.mu);
    // the smallest kept block that holds it, if not more than twice the request
    auto it = P.kept.lower_bound(want);
    if (it != P.kept.end() && it->first <= 2 * want) {
      void* p = it->second;
      P.live[p] = it->first;
      P.kept_bytes -= it->first;
      P.kept.erase(it);
      ++P.st.reuses;
      return p;
    }
  }
  void* p = nullptr;
  if (cudaHostAlloc(&p, want, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: the caller falls back to pageable memory
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(P.mu);
  P.live[p] = want;
  ++P.st.allocs;
  return p;
}

void pinned_release(void* p) {
  Pool& P = pool();
  {
    std::lock_guard<std::mutex> lk(P.mu);
    auto it = P.live.find(p);
    if (it == P.live.end()) return;
    const size_t n = it->second;
    P.live.erase(it);
    if (P.kept_bytes + n <= kPinnedKeepBytes) {
      P.kept.emplace(n, p);
      P.kept_bytes += n;
      return;
    }
    ++P.st.frees;
  }
  cudaFreeHost(p);
}

PinnedStats pinned_stats() {
  Pool& P = pool();
  std::lock_guard<std::mutex> lk(P.mu);
  PinnedStats s = P.st;
  s.kept_blocks = (int64_t)P.kept.size();
  s.kept_bytes = (int64_t)P.kept_bytes;
  s.live_blocks = (int64_t)P.live.size();
  return s;
}

}  // namespace cuda
}  // namespace intdet
