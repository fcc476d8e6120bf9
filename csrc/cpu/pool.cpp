// The forward pass's thread pool (intdet/pool.h). One job at a time: its
// task counter, task count and generation share one 64-bit word, so a worker
// that wakes late can only claim a task of the job it read (the claim is a
// compare-and-swap on that word) and never runs an old function on a new job.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "intdet/pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define INTDET_PAUSE() _mm_pause()
#else
#define INTDET_PAUSE() std::this_thread::yield()
#endif

namespace intdet {
namespace {

constexpr int64_t kSpinUs = 50;  // idle spin before sleeping: longer than the serial gaps between ops

// word = gen (24 bits) << 40 | n (20 bits) << 20 | next task (20 bits)
constexpr uint64_t kMask20 = (uint64_t(1) << 20) - 1;
inline uint64_t pack(uint64_t gen, uint64_t n, uint64_t next) { return gen << 40 | n << 20 | next; }
inline int64_t n_of(uint64_t w) { return (int64_t)((w >> 20) & kMask20); }
inline int64_t next_of(uint64_t w) { return (int64_t)(w & kMask20); }

struct Pool {
  std::mutex run_mu;  // one job at a time; a second caller runs its tasks itself
  std::mutex grow_mu;
  int n_workers = 0;
  std::atomic<uint64_t> word{0};
  std::atomic<uint32_t> epoch{0};  // bumped per job: what sleeping workers wait on
  std::atomic<int> active{0};      // workers 0..active-1 take part in the current job
  std::atomic<int64_t> done{0};
  std::atomic<TaskFn> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
  uint64_t gen = 0;

  // Claim and run tasks of the published job until none is left.
  void work() {
    uint64_t w = word.load(std::memory_order_acquire);
    while (next_of(w) < n_of(w)) {
      if (word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        // The job is unfinished (this task is ours), so fn and ctx are its own.
        fn.load(std::memory_order_relaxed)(ctx.load(std::memory_order_relaxed), next_of(w));
        done.fetch_add(1, std::memory_order_release);
        w = word.load(std::memory_order_acquire);
      }
    }
  }

  void worker(int id) {
    uint32_t seen = epoch.load(std::memory_order_acquire);
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int spin = 0; epoch.load(std::memory_order_acquire) == seen; ++spin) {
        INTDET_PAUSE();
        if ((spin & 255) == 255 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinUs)) {
          epoch.wait(seen, std::memory_order_acquire);
          break;
        }
      }
      const uint32_t now = epoch.load(std::memory_order_acquire);
      if (now == seen) continue;
      seen = now;
      if (id < active.load(std::memory_order_acquire)) work();
    }
  }

  void grow(int want) {
    std::lock_guard<std::mutex> lock(grow_mu);
    for (; n_workers < want; ++n_workers) std::thread([this, id = n_workers] { worker(id); }).detach();
  }

  void run(int threads, int64_t n, TaskFn f, void* c) {
    std::unique_lock<std::mutex> lock(run_mu, std::try_to_lock);
    if (!lock.owns_lock()) {  // another thread's forward holds the pool
      for (int64_t i = 0; i < n; ++i) f(c, i);
      return;
    }
    grow(threads - 1);
    fn.store(f, std::memory_order_relaxed);
    ctx.store(c, std::memory_order_relaxed);
    done.store(0, std::memory_order_relaxed);
    active.store(threads - 1, std::memory_order_relaxed);
    gen = (gen + 1) & ((uint64_t(1) << 24) - 1);
    word.store(pack(gen, (uint64_t)n, 0), std::memory_order_release);
    epoch.fetch_add(1, std::memory_order_release);
    epoch.notify_all();
    work();
    // Wait only for tasks other threads have started.
    for (int spin = 0; done.load(std::memory_order_acquire) < n; ++spin) {
      if (spin < 4096)
        INTDET_PAUSE();
      else
        std::this_thread::yield();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: its detached workers outlive static destructors
  return *p;
}

}  // namespace

void pool_run(int threads, int64_t n, TaskFn f, void* ctx) {
  if (threads <= 1 || n <= 1 || n > (int64_t)kMask20) {
    for (int64_t i = 0; i < n; ++i) f(ctx, i);
    return;
  }
  pool().run(threads, n, f, ctx);
}

}  // namespace intdet
