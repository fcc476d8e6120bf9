// Weight repacking for the SIMD kernels: the g8 and q16 layouts' packers
// (portable code, run once at load) and pack_model, which fills every layout
// in use. The packers run on the forward's pool (intdet/pool.h), not an
// OpenMP team: libgomp's idle workers spin on after the region, and a
// forward right after the load (intdet generate) found one on its second
// core (14% of the samples of a 512-token prefill at 1 thread, perf).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "intdet/kernels.h"
#include "intdet/model.h"
#include "intdet/pool.h"

namespace intdet {

int64_t packed_size_w8x2(int64_t N, int64_t K) { return (N + 7) / 8 * ((K + 1) / 2) * 16; }

void pack_w8x2(const int8_t* w, int64_t N, int64_t K, int8_t* out) {
  const int64_t Kp = (K + 1) / 2, G = (N + 7) / 8;
  parallel_tasks(num_threads(), G, [&](int64_t g) {
    for (int64_t p = 0; p < Kp; ++p)
      for (int64_t c = 0; c < 8; ++c)
        for (int64_t i = 0; i < 2; ++i) {
          const int64_t n = 8 * g + c, k = 2 * p + i;
          out[(g * Kp + p) * 16 + 2 * c + i] = (n < N && k < K) ? w[n * K + k] : 0;
        }
  });
}

void row_w8x2(const int8_t* packed, int64_t K, int64_t n, int8_t* out) {
  const int64_t Kp = (K + 1) / 2;
  const int8_t* g = packed + (n / 8) * Kp * 16 + 2 * (n % 8);
  for (int64_t k = 0; k < K; ++k) out[k] = g[(k / 2) * 16 + (k & 1)];
}

int64_t packed_size_w4(int64_t N, int64_t K) { return (N + 7) / 8 * (K / kW4Group) * kW4Block; }

void pack_w4(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out) {
  const int64_t G = K / kW4Group, NG = (N + 7) / 8;
  auto code = [&](int64_t n, int64_t k) -> uint8_t { return (w4[n * (K / 2) + k / 2] >> (4 * (k & 1))) & 15; };
  parallel_tasks(num_threads(), NG, [&](int64_t g) {
    for (int64_t j = 0; j < G; ++j) {
      uint8_t* b = out + (g * G + j) * kW4Block;
      int16_t sc[16] = {};
      for (int64_t c = 0; c < 8; ++c) {
        const int64_t n = 8 * g + c;
        if (n < N) {
          sc[c] = gd[n * G + j];
          sc[8 + c] = gm[n * G + j];
        }
      }
      std::memcpy(b, sc, sizeof sc);  // host order: the kernels read them as int16
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t c = 0; c < 8; ++c)
          for (int64_t i = 0; i < 2; ++i) {
            const int64_t n = 8 * g + c, k = 32 * j + 4 * r + i;
            b[32 + 16 * r + 2 * c + i] = n < N ? (uint8_t)(code(n, k) | code(n, k + 2) << 4) : 0;
          }
    }
  });
}

namespace {
int64_t channel_bytes_w8x2(int64_t K) { return (K + 1) / 2 * 2; }
int64_t channel_bytes_w4(int64_t K) { return K / kW4Group * (kW4Block / 8); }
}  // namespace

int64_t packed_size_q16(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * ((K + 63) / 64 * 64); }

void pack_q16(const int8_t* w, int64_t N, int64_t K, int8_t* out) {
  const int64_t Kq = (K + 63) / 64 * 64, G = (N + 15) / 16;
  parallel_tasks(num_threads(), G, [&](int64_t g) {
    for (int64_t p = 0; p < Kq / 4; ++p)
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t i = 0; i < 4; ++i) {
          const int64_t n = 16 * g + c, k = 4 * p + i;
          out[g * 16 * Kq + 64 * p + 4 * c + i] = (n < N && k < K) ? w[n * K + k] : 0;
        }
  });
}

void row_q16(const int8_t* packed, int64_t K, int64_t n, int8_t* out) {
  const int64_t Kq = (K + 63) / 64 * 64;
  const int8_t* g = packed + (n / 16) * 16 * Kq + 4 * (n % 16);
  for (int64_t k = 0; k < K; ++k) out[k] = g[(k / 4) * 64 + (k & 3)];
}

// The AVX2 kernels' layout: channels in groups of 8 for both weight formats.
constinit const Packing kPackG8{
    .name = "g8",
    .id = 0,
    .w8 = {.size = packed_size_w8x2, .channel_bytes = channel_bytes_w8x2, .pack = pack_w8x2, .row = row_w8x2},
    .w4 = {.size = packed_size_w4, .channel_bytes = channel_bytes_w4, .pack = pack_w4},
};

namespace {
int64_t channel_bytes_q16(int64_t K) { return (K + 63) / 64 * 64; }
}  // namespace

// The AMX set's layout: q16 for int8 weights (AMX B tiles); int4 weights as
// in g8 (the AMX set runs the AVX-512 set's int4 kernels).
constinit const Packing kPackQ16{
    .name = "q16",
    .id = 1,
    .w8 = {.size = packed_size_q16, .channel_bytes = channel_bytes_q16, .pack = pack_q16, .row = row_q16},
    .w4 = {.size = packed_size_w4, .channel_bytes = channel_bytes_w4, .pack = pack_w4},
};

namespace {

constexpr int64_t kHugePage = 2 << 20;
constexpr int64_t kPieceAlign = 64;  // every packed copy starts on a cache line

// One block of at least `bytes`, 2 MiB aligned and, on Linux, marked for
// transparent huge pages before its first touch: decode streams every
// weight once per token, and 4 KiB pages cost it a TLB miss every 4 KiB
// (the AVX2 GEMV read 8% faster from huge pages, 12.2 -> 13.2 GB/s on one
// Zen 3 core). A no-op hint where THP is off. Not zeroed: the packers write
// every byte of each copy (padded channels and pairs as 0) and no kernel
// reads the padding between copies, so the pages are first touched as the
// packing reaches them, after the source pages before them were dropped
// (a memset here touched the whole arena first: a higher load peak).
std::shared_ptr<void> arena(int64_t bytes) {
  const size_t size = (size_t)((bytes + kHugePage - 1) / kHugePage * kHugePage);
  void* p = std::aligned_alloc((size_t)kHugePage, size);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, size, MADV_HUGEPAGE);
#endif
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

namespace {

// Every linear layer of m (the output head last).
std::vector<Linear*> linears_of(Model& m) {
  std::vector<Linear*> linears;
  for (Layer& L : m.layers) {
    for (Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down, &L.router})
      if (x->w || x->w4) linears.push_back(x);  // a MoE block has no dense gate/up/down, a dense one no router
    for (auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
      for (Linear& x : *v) linears.push_back(&x);
  }
  linears.push_back(&m.output);
  return linears;
}

// The bytes of the copy of L in layout p (0: p has no packer for L's format).
int64_t copy_bytes(const Packing* p, const Linear& L) {
  if (L.w4) return p->w4.pack ? p->w4.size(L.N, L.K) : 0;
  return p->w8.pack ? p->w8.size(L.N, L.K) : 0;
}

// Packs every linear layer of m in layout p into one new arena (kept in
// m.packs), setting Linear::packed[p->id]. The caller holds m.packs->mu or
// owns m alone.
void pack_layout(Model& m, const Packing* p) {
  const bool release_source = m.packs->release_source;
  std::vector<Linear*> linears = linears_of(m);
  auto padded = [](int64_t b) { return (b + kPieceAlign - 1) / kPieceAlign * kPieceAlign; };
  int64_t total = 0;
  for (const Linear* L : linears) total += padded(copy_bytes(p, *L));
  if (total == 0) return;
  std::shared_ptr<void> mem = arena(total);
  int8_t* next = static_cast<int8_t*>(mem.get());
  // Each weight is packed in blocks of kPackChunk output channels (a multiple
  // of 16, so a block's packed bytes start at j * channel_bytes(K),
  // kernels.h), and each block's file pages are dropped right after it: the
  // source pages of a large weight (Gemma 3's 160 MiB tied embedding) are
  // never all resident next to its packed copy. Only the packed copies are
  // read unless a row-major set is chosen; then the pages fault back in from
  // the file.
  constexpr int64_t kPackChunk = 4096;
  // The blocks are independent (each writes its own bytes of the arena), so
  // they run on the forward's threads: a multi-GB model packs at the
  // memory's speed rather than one core's.
  struct Block {
    Linear* L;
    int8_t* out;
    int64_t j0;
  };
  std::vector<Block> blocks;
  std::vector<std::pair<Linear*, int8_t*>> placed;
  for (Linear* L : linears) {
    const int64_t bytes = copy_bytes(p, *L);
    if (bytes == 0) continue;
    int8_t* out = next;
    next += padded(bytes);
    placed.emplace_back(L, out);
    for (int64_t j0 = 0; j0 < L->N; j0 += kPackChunk) blocks.push_back({L, out, j0});
  }
  parallel_tasks(num_threads(), static_cast<int64_t>(blocks.size()), [&](int64_t b) {
    const Block& x = blocks[static_cast<size_t>(b)];
    Linear* L = x.L;
    const int64_t j0 = x.j0, n = std::min(kPackChunk, L->N - j0), G = L->K / kW4Group;
    if (L->w4)
      p->w4.pack(L->w4 + j0 * (L->K / 2), L->gd + j0 * G, L->gm + j0 * G, n, L->K,
                 reinterpret_cast<uint8_t*>(x.out + j0 * p->w4.channel_bytes(L->K)));
    else
      p->w8.pack(L->w + j0 * L->K, n, L->K, x.out + j0 * p->w8.channel_bytes(L->K));
    if (release_source) {
      if (L->w4)
        release_pages(L->w4 + j0 * (L->K / 2), n * L->K / 2);
      else
        release_pages(L->w + j0 * L->K, n * L->K);
    }
  });
  for (auto& [L, out] : placed) {
    if (release_source) {  // and the pages that straddle two blocks
      if (L->w4)
        release_pages(L->w4, L->N * L->K / 2);
      else
        release_pages(L->w, L->N * L->K);
    }
    L->packed[p->id] = out;
  }
  m.packs->arenas.push_back(std::move(mem));
}

}  // namespace

bool reads_packed(const Kernels& k, const Linear& L) {
  return L.w4 ? k.linear_w4_packed != nullptr : k.linear_packed != nullptr;
}

void pack_model(Model& m, bool release_source) {
  m.packs->release_source = release_source;
  const Kernels& k = kernels();
  if (!k.packing) return;  // a row-major set: nothing to pack until another is chosen
  pack_layout(m, k.packing);
  // Tied head: the embedding reads its rows from the head's packed copy.
  if (m.output.w && m.output.w == m.tok_embd && k.packing->w8.row && m.output.packed[k.packing->id]) {
    m.tok_embd_packed = static_cast<const int8_t*>(m.output.packed[k.packing->id]);
    m.tok_embd_row = k.packing->w8.row;
  }
}

void ensure_packed(const Model& m, const Kernels& k) {
  if (!k.packing) return;
  std::lock_guard<std::mutex> lock(m.packs->mu);
  // The model object itself is not const (pack_model filled it); only the
  // forward's view is. Another thread reads packed[] of this layout only
  // after taking the same lock here.
  Model& mm = const_cast<Model&>(m);
  for (const Linear* L : linears_of(mm))
    if (reads_packed(k, *L) && !L->packed[k.packing->id]) return pack_layout(mm, k.packing);
}

}  // namespace intdet
