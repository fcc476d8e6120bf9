// Host emulation of the CUDA subset csrc/cuda uses, for testing the kernels
// on machines without a GPU (tests/engine/test_cuda.py builds intdet's CUDA sources
// with g++ -DINTDET_CUDA_EMU into a module _cuda_emu and compares it with the
// CPU core bit for bit).
//
// Every CUDA thread is a fiber (ucontext) on one OS thread; the blocks of a
// launch run one after another, the threads of a block interleave at each
// __syncthreads() and warp shuffle, which are real barriers here. So the
// kernels' index arithmetic, shared-memory use, reductions and barriers are
// all exercised; what is not emulated is timing, memory coherence subtleties
// and resource limits. __shared__ variables become function statics (fine:
// blocks never overlap). __CUDA_ARCH__ is defined for the kernel files so
// intmath.h takes its device paths (division by a reciprocal, __clzll).
//
// The runtime API part covers the engine (engine_*.cpp): plain host memory for device
// memory, streams as queues of work that runs only at a synchronization point
// (cudaStreamSynchronize, cudaEventSynchronize, a synchronous copy or memset,
// a copy into pageable memory, cudaFree...), events ordering work across
// streams (cudaStreamWaitEvent), and graph capture as a recorded list of
// launches and external event records, enqueued by cudaGraphLaunch. At a
// synchronization point the queued work runs one operation at a time, in an
// order every event wait allows: the earliest-created stream's ready work
// first, or the latest's (set_stream_order), so a missing or misplaced wait
// between two streams gives wrong values in one of the two orders instead of
// passing by luck. Copies from or to pinned memory (cudaMallocHost,
// cudaHostAlloc) read and write it when they run; from pageable memory the
// host's bytes are taken when enqueued, into it the call waits for its stream
// and copies at once, as the CUDA runtime does.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

// ---------------------------------------------------------------- language
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define INTDET_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(::emu::dyn_smem())

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3_ {
  unsigned x = 0, y = 0, z = 0;
};
struct int4 {
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

namespace emu {

inline uint3_ thread_idx, block_idx;
inline dim3 block_dim, grid_dim;

// Fibers enter through makecontext/swapcontext once; every later switch is
// _setjmp/_longjmp (no signal-mask system call), the usual coroutine trick.
struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  std::unique_ptr<char[]> stack;
  bool started = false, done = false;
  unsigned tid = 0;
};

struct BlockRun {
  std::vector<Fiber> fibers;
  ucontext_t sched_ctx;
  jmp_buf sched_jb;
  size_t cur = 0;
  unsigned live = 0;
  unsigned arrived = 0, gen = 0;
  unsigned warp_arrived[32] = {}, warp_gen[32] = {};
  int64_t slot[32][32] = {};
  const std::function<void()>* body = nullptr;
};

inline BlockRun* g_run = nullptr;
inline std::vector<unsigned char> g_dyn_smem;
inline void* dyn_smem() { return g_dyn_smem.data(); }

inline void yield_to_scheduler() {
  Fiber& f = g_run->fibers[g_run->cur];
  if (!_setjmp(f.jb)) _longjmp(g_run->sched_jb, 1);
}

inline void fiber_entry() {
  BlockRun* r = g_run;
  (*r->body)();
  r->fibers[r->cur].done = true;
  --r->live;
  _longjmp(r->sched_jb, 1);  // never returns: the stack is dropped with the fiber
}

inline void syncthreads() {
  BlockRun* r = g_run;
  const unsigned my = r->gen;
  if (++r->arrived == r->live) {
    r->arrived = 0;
    ++r->gen;
    return;
  }
  while (r->gen == my) yield_to_scheduler();
}

inline void syncwarp(unsigned warp, unsigned lanes) {
  BlockRun* r = g_run;
  const unsigned my = r->warp_gen[warp];
  if (++r->warp_arrived[warp] == lanes) {
    r->warp_arrived[warp] = 0;
    ++r->warp_gen[warp];
    return;
  }
  while (r->warp_gen[warp] == my) yield_to_scheduler();
}

inline void run_block(const std::function<void()>& body) {
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  constexpr size_t kStack = 256 * 1024;
  static std::vector<std::unique_ptr<char[]>> stacks;  // reused across blocks
  while (stacks.size() < n) stacks.emplace_back(new char[kStack]);
  BlockRun r;
  r.fibers.resize(n);
  r.live = n;
  r.body = &body;
  BlockRun* saved = g_run;
  g_run = &r;
  static const bool reverse = [] {
    const char* v = std::getenv("INTDET_EMU_REVERSE");  // run fibers last to first (finds other races)
    return v && *v && *v != '0';
  }();
  unsigned remaining = n;
  while (remaining) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = reverse ? n - 1 - k : k;
      Fiber& f = r.fibers[i];
      if (f.done) continue;
      r.cur = i;
      thread_idx.x = (unsigned)i % block_dim.x;
      thread_idx.y = ((unsigned)i / block_dim.x) % block_dim.y;
      thread_idx.z = (unsigned)i / (block_dim.x * block_dim.y);
      if (!_setjmp(r.sched_jb)) {
        if (!f.started) {
          f.started = true;
          f.tid = (unsigned)i;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = stacks[i].get();
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = nullptr;
          makecontext(&f.ctx, fiber_entry, 0);
          swapcontext(&r.sched_ctx, &f.ctx);  // comes back by _longjmp(sched_jb)
        } else {
          _longjmp(f.jb, 1);
        }
      }
      if (f.done) --remaining;
    }
  }
  g_run = saved;
}

// ---------------------------------------------------------------- runtime

struct Launch {
  dim3 grid, block;
  size_t smem;
  std::function<void()> body;
};

inline void run_launch(const Launch& l) {
  grid_dim = l.grid;
  block_dim = l.block;
  for (unsigned z = 0; z < l.grid.z; ++z)
    for (unsigned y = 0; y < l.grid.y; ++y)
      for (unsigned x = 0; x < l.grid.x; ++x) {
        block_idx.x = x, block_idx.y = y, block_idx.z = z;
        // poisoned for every block (each has its own on a GPU): a block must
        // write its dynamic shared memory before reading it, even where every
        // block computes the same values (the GEMV prologues)
        g_dyn_smem.assign(l.smem ? l.smem : 1, 0xA5);
        run_block(l.body);
      }
}

// An event: records enqueued (cudaEventRecord calls, and graph launches with
// its record node) and records run. A wait enqueued after record n waits
// until record n has run (the runtime's rule: the most recent record at the
// time of the wait call).
struct Event {
  std::chrono::steady_clock::time_point t;
  uint64_t enqueued = 0, done = 0;
};

// One queued operation: run() once its stream reaches it and, for a wait,
// once wait_ev's record wait_gen has run.
struct Op {
  std::function<void()> run;
  Event* wait_ev = nullptr;
  uint64_t wait_gen = 0;
};

// A captured graph: launches and external event records (ev set).
struct Node {
  Launch launch;
  Event* ev = nullptr;
};
struct GraphRec {
  std::vector<Node> nodes;
};

struct Stream {
  std::deque<Op> q;
  GraphRec* capture = nullptr;  // capturing: launches and records go here
};

inline Stream* legacy_stream() {
  static Stream s;  // stream 0
  return &s;
}
// Streams in creation order, the legacy stream first.
inline std::vector<Stream*>& streams() {
  static std::vector<Stream*> v{legacy_stream()};
  return v;
}
inline Stream* stream_of(Stream* s) { return s ? s : legacy_stream(); }
inline bool g_latest_first = false;  // set_stream_order

inline bool any_capture() {
  for (Stream* s : streams())
    if (s->capture) return true;
  return false;
}

// Runs one ready operation; false when none is ready.
inline bool step() {
  std::vector<Stream*>& v = streams();
  for (size_t k = 0; k < v.size(); ++k) {
    Stream* s = v[g_latest_first ? v.size() - 1 - k : k];
    if (s->q.empty()) continue;
    const Op& head = s->q.front();
    if (head.wait_ev && head.wait_ev->done < head.wait_gen) continue;
    Op op = std::move(s->q.front());
    s->q.pop_front();
    if (op.run) op.run();
    return true;
  }
  return false;
}

// Runs queued work until done() holds; a GPU would hang where no queued
// operation can run and done() does not hold: abort.
template <class F>
inline void drain_until(F done) {
  while (!done()) {
    if (step()) continue;
    std::fprintf(stderr, "emu: streams deadlocked (queued work waits on an event that never runs)\n");
    std::abort();
  }
}
inline void drain_all() {
  drain_until([] {
    for (Stream* s : streams())
      if (!s->q.empty()) return false;
    return true;
  });
}
inline void drain_stream(Stream* s) {
  drain_until([s] { return s->q.empty(); });
}

inline void enqueue(Stream* s, Op op) { s->q.push_back(std::move(op)); }

inline void launch(Stream* stream, dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  Stream* s = stream_of(stream);
  Launch l{grid, block, smem, std::move(body)};
  if (s->capture) {
    s->capture->nodes.push_back(Node{std::move(l), nullptr});
    return;
  }
  enqueue(s, Op{[l = std::move(l)] { run_launch(l); }});
}

// Pinned host allocations (start -> bytes): a copy's host side is pinned or
// pageable.
inline std::map<uintptr_t, size_t>& pinned() {
  static std::map<uintptr_t, size_t> m;
  return m;
}
inline bool is_pinned(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = pinned().upper_bound(a);
  if (it == pinned().begin()) return false;
  --it;
  return a + n <= it->first + it->second;
}

}  // namespace emu

namespace emu {
inline int4 load16_checked(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16) {
    std::fprintf(stderr, "emu: misaligned 16-byte load at %p\n", p);
    std::abort();
  }
  int4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
}  // namespace emu

#define threadIdx (::emu::thread_idx)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)

inline void __syncthreads() { ::emu::syncthreads(); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned warp = tid / 32, lane = tid % 32;
  ::emu::BlockRun* r = ::emu::g_run;
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  const unsigned lanes = (warp + 1) * 32 <= n ? 32 : n - warp * 32;
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  r->slot[warp][lane] = bits;
  ::emu::syncwarp(warp, lanes);
  const unsigned src = lane ^ (unsigned)lane_mask;
  const int64_t got = src < lanes ? r->slot[warp][src] : bits;
  ::emu::syncwarp(warp, lanes);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }

// __dp2a_lo / __dp2a_hi (CUDA math API): two int16 of a times two int8 of b
// (bytes 0-1 for lo, 2-3 for hi), plus c; 32-bit wrapping arithmetic.
inline int __dp2a_lo(int a, int b, int c) {
  const int32_t a0 = (int16_t)(a & 0xffff), a1 = (int16_t)((uint32_t)a >> 16);
  const int32_t b0 = (int8_t)(b & 0xff), b1 = (int8_t)(((uint32_t)b >> 8) & 0xff);
  return (int)((uint32_t)c + (uint32_t)(a0 * b0) + (uint32_t)(a1 * b1));
}
inline int __dp2a_hi(int a, int b, int c) {
  const int32_t a0 = (int16_t)(a & 0xffff), a1 = (int16_t)((uint32_t)a >> 16);
  const int32_t b2 = (int8_t)(((uint32_t)b >> 16) & 0xff), b3 = (int8_t)(((uint32_t)b >> 24) & 0xff);
  return (int)((uint32_t)c + (uint32_t)(a0 * b2) + (uint32_t)(a1 * b3));
}

// __byte_perm (CUDA math API): byte n of the result is byte (s >> 4n) & 7 of
// the 8 bytes {x bytes 0-3, y bytes 0-3}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t in = (uint64_t)x | ((uint64_t)y << 32);
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= (unsigned)((in >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
  return r;
}

// mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.s8.s32 (PTX ISA, "Matrix
// Fragments for mma.m16n8k32", .s8/.u8): a warp-collective D = A B + C with
// A 16 x 32 (row), B 32 x 8 (col), C/D 16 x 8 s32. Every lane hands in its
// fragments; the matrices are rebuilt from the 32 lanes' registers by the
// ISA's layout, so a kernel that packs a fragment wrongly gets wrong sums.
// With g = lane >> 2, t = lane % 4:
// - A: a[r] holds 4 elements (byte i of a[r], low to high) at row g (r = 0, 2)
//   or g + 8 (r = 1, 3), columns 4 t + i (r = 0, 1) or 16 + 4 t + i (r = 2, 3);
// - B: b[r] holds 4 elements at rows (k) 4 t + i (r = 0) or 16 + 4 t + i
//   (r = 1), column (n) g;
// - C/D: c[r] at row g (r = 0, 1) or g + 8 (r = 2, 3), column 2 t + (r & 1).
// The products are summed exactly in int64 and the emulator aborts when a
// result leaves int32 (the kernels' K-chunk bound says it never does; the
// hardware would wrap).
namespace emu {
struct MmaSlot {
  uint32_t a[4], b[2];
};
inline MmaSlot g_mma[32][32];  // [warp][lane]; blocks run one at a time
inline void mma_m16n8k32(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const int32_t (&c)[4],
                         bool a_unsigned) {
  const unsigned tid = thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z);
  const unsigned warp = tid / 32, lane = tid % 32;
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  if ((warp + 1) * 32 > n) {
    std::fprintf(stderr, "emu: mma.sync needs a full warp\n");
    std::abort();
  }
  for (int r = 0; r < 4; ++r) g_mma[warp][lane].a[r] = a[r];
  for (int r = 0; r < 2; ++r) g_mma[warp][lane].b[r] = b[r];
  syncwarp(warp, 32);
  auto A = [&](int row, int col) -> int32_t {  // the lane and register that hold A[row][col]
    const int g = row & 7, t = (col & 15) >> 2, i = col & 3;
    const int r = (row >= 8 ? 1 : 0) + (col >= 16 ? 2 : 0);
    const uint32_t byte = (g_mma[warp][4 * g + t].a[r] >> (8 * i)) & 0xff;
    return a_unsigned ? (int32_t)byte : (int32_t)(int8_t)byte;
  };
  auto B = [&](int k, int col) -> int32_t {
    const int t = (k & 15) >> 2, i = k & 3, r = k >= 16 ? 1 : 0;
    return (int32_t)(int8_t)((g_mma[warp][4 * col + t].b[r] >> (8 * i)) & 0xff);
  };
  const int g = (int)lane >> 2, t = (int)lane & 3;
  int32_t out[4];
  for (int r = 0; r < 4; ++r) {
    const int row = g + (r >= 2 ? 8 : 0), col = 2 * t + (r & 1);
    int64_t s = c[r];
    for (int k = 0; k < 32; ++k) s += (int64_t)A(row, k) * B(k, col);
    if (s != (int32_t)s) {
      std::fprintf(stderr, "emu: mma.sync s32 result %lld out of range\n", (long long)s);
      std::abort();
    }
    out[r] = (int32_t)s;
  }
  syncwarp(warp, 32);  // every lane has read the fragments before any lane's next mma writes its slot
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}
}  // namespace emu

template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// Atomics and fences: one OS thread runs every fiber and blocks run one after
// another, so a plain read-modify-write is atomic and every write is visible;
// the kernels' "last block to arrive" then is the grid's last block.
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = v;
  return old;
}
inline void __threadfence() {}

#define INTDET_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::emu::launch((stream), dim3(grid), dim3(block), (size_t)(smem), [=] { kernel(__VA_ARGS__); })

// ---------------------------------------------------------------- runtime API

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
constexpr unsigned cudaEventRecordDefault = 0, cudaEventRecordExternal = 1;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1;
using cudaStream_t = emu::Stream*;
using cudaEvent_t = emu::Event*;
using cudaGraph_t = emu::GraphRec*;
using cudaGraphExec_t = emu::GraphRec*;
struct cudaDeviceProp {
  char name[256];
  int major, minor;
};

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "intdet CUDA emulator (host fibers)");
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
// Attributes the engine asks for (an H100's opt-in shared memory per block).
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  if (a != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *v = 227 * 1024;
  return cudaSuccess;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F>
inline cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int bytes) {
  return bytes >= 0 && bytes <= 227 * 1024 ? cudaSuccess : cudaErrorInvalidValue;
}
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) {
  *p = static_cast<T*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256));  // cudaMalloc aligns to 256
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0x5A, bytes);  // poison: never rely on fresh device memory being zero
  return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMallocHost(T** p, size_t bytes) {
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaSuccess) emu::pinned()[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return e;
}
template <class T>
inline cudaError_t cudaHostAlloc(T** p, size_t bytes, unsigned) {
  return cudaMallocHost(p, bytes);
}
// Like the runtime's, freeing waits for all queued work.
inline cudaError_t cudaFree(void* p) {
  emu::drain_all();
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  emu::drain_all();
  emu::pinned().erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  if (emu::any_capture()) return cudaErrorInvalidValue;  // the engine copies outside captures
  emu::drain_all();
  if (n) std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
  emu::Stream* q = emu::stream_of(st);
  if (q->capture) return cudaErrorInvalidValue;  // the engine copies outside captures
  if (!n) return cudaSuccess;
  if (k == cudaMemcpyHostToDevice && !emu::is_pinned(s, n)) {  // pageable source: staged now
    auto bytes = std::make_shared<std::vector<unsigned char>>((const unsigned char*)s, (const unsigned char*)s + n);
    emu::enqueue(q, emu::Op{[d, bytes] { std::memcpy(d, bytes->data(), bytes->size()); }});
  } else if (k == cudaMemcpyDeviceToHost && !emu::is_pinned(d, n)) {  // pageable destination: synchronous
    emu::drain_stream(q);
    std::memmove(d, s, n);
  } else {
    emu::enqueue(q, emu::Op{[d, s, n] { std::memmove(d, s, n); }});
  }
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* d, int v, size_t n) {
  emu::drain_all();
  std::memset(d, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t st) {
  emu::Stream* q = emu::stream_of(st);
  if (q->capture) return cudaErrorInvalidValue;  // the engine zeroes buffers outside captures
  emu::enqueue(q, emu::Op{[d, v, n] { std::memset(d, v, n); }});
  return cudaSuccess;
}
// Events: a record stamps the host clock when it runs.
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new emu::Event();
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  emu::drain_all();  // a queued record or wait may still name it
  delete e;
  return cudaSuccess;
}
namespace emu {
inline Op record_op(Event* e, uint64_t gen) {
  return Op{[e, gen] {
    e->t = std::chrono::steady_clock::now();
    e->done = gen;
  }};
}
}  // namespace emu
// cudaEventRecordExternal: only in a capture, as an event record node that
// each launch of the graph records (a plain record may not be captured here).
inline cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t st, unsigned flags) {
  emu::Stream* q = emu::stream_of(st);
  if ((flags & cudaEventRecordExternal) != 0) {
    if (!q->capture) return cudaErrorInvalidValue;
    q->capture->nodes.push_back(emu::Node{emu::Launch{}, e});
    return cudaSuccess;
  }
  if (q->capture) return cudaErrorInvalidValue;
  emu::enqueue(q, emu::record_op(e, ++e->enqueued));
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
  return cudaEventRecordWithFlags(e, st, cudaEventRecordDefault);
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned = 0) {
  emu::Stream* q = emu::stream_of(st);
  if (q->capture) return cudaErrorInvalidValue;  // not used inside captures
  if (e->enqueued) emu::enqueue(q, emu::Op{nullptr, e, e->enqueued});  // never recorded: nothing to wait for
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  emu::drain_until([e] { return e->done >= e->enqueued; });
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new emu::Stream();
  emu::streams().push_back(*s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  emu::drain_stream(s);
  auto& v = emu::streams();
  v.erase(std::find(v.begin(), v.end(), s));
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  emu::drain_stream(emu::stream_of(s));
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  emu::drain_all();
  return cudaSuccess;
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode) {
  emu::Stream* q = emu::stream_of(st);
  if (q->capture) return cudaErrorInvalidValue;
  q->capture = new emu::GraphRec();
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t* g) {
  emu::Stream* q = emu::stream_of(st);
  if (!q->capture) return cudaErrorInvalidValue;
  *g = q->capture;
  q->capture = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* ex, cudaGraph_t g, unsigned long long) {
  *ex = new emu::GraphRec(*g);
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
  emu::drain_all();  // queued nodes of its launches refer to it
  delete g;
  return cudaSuccess;
}
// Enqueues the graph's nodes in capture order; an event record node counts
// as recorded at this call (a later cudaStreamWaitEvent waits for it).
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t st) {
  emu::Stream* q = emu::stream_of(st);
  if (q->capture) return cudaErrorInvalidValue;
  for (const emu::Node& n : g->nodes) {
    if (n.ev)
      emu::enqueue(q, emu::record_op(n.ev, ++n.ev->enqueued));
    else
      emu::enqueue(q, emu::Op{[&l = n.launch] { emu::run_launch(l); }});
  }
  return cudaSuccess;
}

namespace emu {
// Test hook (tests/engine/test_cuda.py): at a synchronization point, run the
// latest-created stream's ready work first (true) or the earliest's (false).
inline void set_stream_order(bool latest_first) { g_latest_first = latest_first; }
}  // namespace emu
