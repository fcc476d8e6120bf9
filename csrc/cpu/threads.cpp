// How many threads a forward uses (its pool, intdet/pool.h; OpenMP's count
// for the rest). A fixed count (set_num_threads(n), n > 0) is used as given.
// The default, auto (n = 0), takes every core this process may run on, minus
// the cores that other processes keep busy. With OpenMP's team barrier after
// every op, a worker preempted by another process stalled the whole team for
// a time slice (2 cores, one competing process: 2 threads 37 tok/s decode,
// 1 thread 69; scripts/bench_threads.py); the pool's caller waits only for
// tasks in flight, so that stall is now at most one block, but a core shared
// with another process still gives a worker a fraction of its time and adds
// wake-ups, so auto still leaves busy cores alone. The bits never depend on
// the count.
//
// "Busy" is measured, not guessed: every kLoadSampleMs at most, the busy time
// of this process's CPUs in /proc/stat (steal included: a vCPU the host takes
// away is not ours either) minus this process's own CPU time (getrusage, so
// our own spinning workers do not count), over the elapsed time. Without
// /proc (not Linux) auto means all cores.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "intdet/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

namespace intdet {

namespace {

constexpr int64_t kLoadSampleMs = 100;  // long enough for a few 10 ms jiffies

std::atomic<int> g_requested{0};  // 0 = auto
std::atomic<int> g_last{0};       // the count the latest forward used

int cpus_allowed();

// Auto's ceiling: the CPUs in this process's affinity mask, or fewer when
// OMP_NUM_THREADS says so (the habit of OpenMP users).
int omp_num_threads_env() {
  const char* e = std::getenv("OMP_NUM_THREADS");
  if (!e || !*e) return 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);  // "4" or the first of a list "4,2"
  return (end != e && v > 0 && v <= 4096) ? (int)v : 0;
}

int cores_allowed() {
  static const int env = omp_num_threads_env();
  const int cpus = cpus_allowed();
  return env > 0 && env < cpus ? env : cpus;
}

int cpus_allowed() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
#ifdef _OPENMP
  return omp_get_num_procs();
#else
  return 1;
#endif
}

#if defined(__linux__)
struct LoadSample {
  bool ok = false;
  int64_t busy = 0, total = 0;  // jiffies summed over this process's CPUs
  int64_t ncpu = 0;             // how many CPUs the sums cover
  int64_t self_us = 0;          // this process's user + system time
};

LoadSample take_sample() {
  LoadSample s;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return s;
  FILE* f = std::fopen("/proc/stat", "re");
  if (!f) return s;
  char line[512];
  int seen = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "cpu", 3) != 0) {
      if (seen) break;  // the cpuN lines are contiguous
      continue;
    }
    int cpu = -1;
    long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
    if (std::sscanf(line, "cpu%d %lld %lld %lld %lld %lld %lld %lld %lld", &cpu, &v[0], &v[1], &v[2], &v[3], &v[4],
                    &v[5], &v[6], &v[7]) < 5)
      continue;  // the aggregate "cpu " line
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) continue;
    ++seen;
    const int64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    s.busy += busy;
    s.total += busy + v[3] + v[4];
  }
  std::fclose(f);
  struct rusage ru;
  if (seen == 0 || getrusage(RUSAGE_SELF, &ru) != 0) return s;
  s.self_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec + (int64_t)ru.ru_stime.tv_sec * 1000000 +
              ru.ru_stime.tv_usec;
  s.ncpu = seen;
  s.ok = true;
  return s;
}

struct AutoThreads {
  std::mutex mu;
  LoadSample last;
  std::chrono::steady_clock::time_point last_at{};
  int threads = 0;  // the count the last sample chose (0: none yet)

  // ceiling: the most threads auto may use.
  int pick(int ceiling) {
    std::lock_guard<std::mutex> lock(mu);
    const auto now = std::chrono::steady_clock::now();
    if (threads > 0 && now - last_at < std::chrono::milliseconds(kLoadSampleMs)) return std::min(threads, ceiling);
    LoadSample s = take_sample();
    int n = ceiling;
    if (s.ok && last.ok && s.ncpu == last.ncpu && s.total > last.total) {
      static const int64_t us_per_jiffy = 1000000 / sysconf(_SC_CLK_TCK);
      n = auto_thread_count(s.ncpu, ceiling, s.busy - last.busy, s.total - last.total,
                            (s.self_us - last.self_us) / us_per_jiffy);
    }
    if (s.ok) last = s;
    last_at = now;
    threads = n;
    return n;
  }
};

AutoThreads& auto_threads() {
  static AutoThreads a;
  return a;
}
#endif

}  // namespace

int auto_thread_count(int64_t ncpu, int64_t ceiling, int64_t busy, int64_t total, int64_t self) {
  if (ncpu < 1 || ceiling < 1) return 1;
  const int64_t wall = total / ncpu;  // jiffies per CPU
  if (wall <= 0) return (int)ceiling;
  int64_t others = busy - self;
  if (others < 0) others = 0;
  // Free cores rounded to nearest: (ncpu * wall - others) / wall.
  const int64_t free = (ncpu * wall - others + wall / 2) / wall;
  return (int)std::max<int64_t>(1, std::min<int64_t>(ceiling, free));
}

void set_num_threads(int n) { g_requested.store(n > 0 ? n : 0, std::memory_order_relaxed); }

int thread_setting() { return g_requested.load(std::memory_order_relaxed); }

int num_threads() {
  const int n = g_requested.load(std::memory_order_relaxed);
  return n > 0 ? n : cores_allowed();
}

int forward_threads() {
  const int n = g_requested.load(std::memory_order_relaxed);
  int use = n;
  if (n <= 0) {
#if defined(__linux__)
    use = auto_threads().pick(cores_allowed());
#else
    use = cores_allowed();
#endif
  }
#ifdef _OPENMP
  omp_set_num_threads(use);
#endif
  g_last.store(use, std::memory_order_relaxed);
  return use;
}

int last_forward_threads() {
  const int n = g_last.load(std::memory_order_relaxed);
  return n > 0 ? n : num_threads();
}

}  // namespace intdet
