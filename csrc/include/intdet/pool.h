// intdet's own thread pool for the forward pass (csrc/cpu/pool.cpp).
//
// parallel_tasks(threads, n, f) runs f(i) for every i in [0, n) exactly once,
// on the calling thread and up to threads - 1 persistent workers, which take
// tasks one at a time from a shared counter. The caller takes tasks too and
// waits only for tasks a worker has already started: a worker the OS has not
// scheduled (a loaded machine) never holds the op up, so unlike an OpenMP
// team barrier, threads > 1 cannot be slower than one thread by more than the
// tasks in flight. Idle workers spin for kSpinUs, then sleep on a futex
// (std::atomic::wait), so they do not burn a loaded core. Which thread runs a
// task never changes its result: callers give each task its own outputs.
#pragma once

#include <cstdint>
#include <type_traits>

namespace intdet {

using TaskFn = void (*)(void* ctx, int64_t i);

// f(ctx, i) for i in [0, n), n < 2^20; threads <= 1 runs them in order here.
void pool_run(int threads, int64_t n, TaskFn f, void* ctx);

template <class F>
void parallel_tasks(int threads, int64_t n, F&& f) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  constexpr int64_t kMax = int64_t(1) << 19;  // pool_run's task count limit, with room
  for (int64_t base = 0; base < n; base += kMax) {
    struct Ctx {
      Fn* f;
      int64_t base;
    } c{&f, base};
    pool_run(threads, n - base < kMax ? n - base : kMax,
             [](void* p, int64_t i) {
               auto* cc = static_cast<Ctx*>(p);
               (*cc->f)(cc->base + i);
             },
             &c);
  }
}

}  // namespace intdet
