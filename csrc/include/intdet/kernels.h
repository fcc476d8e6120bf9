// The CPU kernel sets (one per instruction set) and the runtime choice among
// them. Every kernel set computes the same bits as the generic scalar one;
// they differ only in speed (tests/engine/test_isa.py compares them all).
//
// A kernel set is one `Kernels` entry, defined in its own kernel file with
// designated initializers and listed once in csrc/cpu/kernel_sets.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace intdet {

using LinearFn = void (*)(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const int8_t* w,
                          const int32_t* mant, const int32_t* shift, const int32_t* bias, int64_t N, int64_t* out,
                          int64_t ldo);

// Attention tiles (csrc/model/attention.cpp drives them; docs/kernel-sets.md).
// QkTileFn: scores of R query rows against n cached keys, every key loaded
// once for all R rows (the GEMM shape: int16 q, int8 K):
//   z[r * ldz + t] = attn_score(q_r . k_t, ka[t * (stride / D)], e_q[r], score_mant, score_shift)
// for r < R, t < n; q [R, D] int16 row-major, key t at kc + t * stride.
using QkTileFn = void (*)(const int16_t* q, const int32_t* e_q, int64_t R, const int8_t* kc, const int32_t* ka,
                          int64_t n, int64_t stride, int64_t D, int64_t score_mant, int64_t score_shift, int64_t* z,
                          int64_t ldz);
// PvTileFn: out[r * D + d] += sum_{t < n} w16[r * ldw + t] * v_t[d] for r < R,
// exact (int32 partial sums over at most kPvBlock positions, then int64);
// value t at vc + t * stride.
using PvTileFn = void (*)(const int16_t* w16, int64_t ldw, int64_t R, const int8_t* vc, int64_t n, int64_t stride,
                          int64_t D, int64_t* out);
// The integer softmax's passes over one row's keys (attention.cpp runs them
// per row and key range; definitions: the *_generic functions in ops.h).
struct AttnRowFns {
  int64_t (*max)(const int64_t* z, int64_t n);                    // max z[i]; n >= 1
  int64_t (*exp_sum)(int64_t* z, int64_t n, int64_t zmax);        // z[i] = exp2(zmax - z[i]); their sum
  int64_t (*prob_max)(const int64_t* u, int64_t n, int64_t rr, const int32_t* va);  // max p[i]
  void (*prob_w16)(const int64_t* u, int64_t n, int64_t rr, const int32_t* va, int e, int16_t* w16);
};

// Int4 linear layer (docs/format.md): the same output as LinearFn with the
// effective weights w[j][k] = gd[j][k/32] * u[j][k] + gm[j][k/32], u the
// 4-bit code in w4 [N, K/2] (input 2i in the low nibble of byte i), K a
// multiple of 32. Packed kernels read their Packing's layout from w4 and ignore gd, gm.
using LinearW4Fn = void (*)(const int16_t* q, const int32_t* e, int64_t T, int64_t K, const uint8_t* w4,
                            const int16_t* gd, const int16_t* gm, const int32_t* mant, const int32_t* shift,
                            const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);

using RowFn = void (*)(const int64_t* x, int64_t n, int64_t* y);

// A packed weight layout: how pack_model rewrites int8 and int4 linear
// weights at load for the kernels that read them. Channel j, for j a
// multiple of 16 (the forward splits output channels in blocks of 16s),
// starts at byte j * channel_bytes(K), so a block's kernel call gets its own
// weights. `pack` null: that weight format has no packed layout here.
struct W8Packer {
  int64_t (*size)(int64_t N, int64_t K);
  int64_t (*channel_bytes)(int64_t K);
  void (*pack)(const int8_t* w, int64_t N, int64_t K, int8_t* out);
  // Channel n of a packed [N, K] copy back as K int8 (the inverse of pack
  // for one row): the embedding reads its rows from the tied output head's
  // packed copy, so the file's pages of tok_embd stay out of memory.
  void (*row)(const int8_t* packed, int64_t K, int64_t n, int8_t* out);
};
struct W4Packer {
  int64_t (*size)(int64_t N, int64_t K);
  int64_t (*channel_bytes)(int64_t K);
  void (*pack)(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out);
};
struct Packing {
  const char* name;
  int id;  // index into Linear::packed (< kPackedLayouts); kernel sets reading one layout share its copy
  W8Packer w8;
  W4Packer w4;
};

// Optional: a prefill linear kernel that reads the int16 activations as two
// int8 planes, x = 256 * hi + lo (hi = x >> 8 signed, lo = x & 255 unsigned;
// exact for every int16), made once per activation matrix rather than once
// per kernel call (the AMX set: tile products are int8 x int8). Rows are
// ld(K) bytes, zero past K; the planes hold a multiple of 16 rows (rows past
// T are read, their results dropped). The forward uses it on int8 weights
// for T >= min_rows; `linear` null: the set has none.
using SplitRowFn = void (*)(const int16_t* q, int64_t K, int8_t* hi, uint8_t* lo);  // ld(K) bytes each
using LinearPlanesFn = void (*)(const int8_t* hi, const uint8_t* lo, int64_t ld, const int32_t* e, int64_t T,
                                int64_t K, const int8_t* w, const int32_t* mant, const int32_t* shift,
                                const int32_t* bias, int64_t N, int64_t* out, int64_t ldo);
struct ActPlanes {
  int64_t min_rows;
  int64_t (*ld)(int64_t K);
  SplitRowFn split_row;
  LinearPlanesFn linear;  // reads the set's packed int8 layout, as linear_packed
};
constexpr int64_t kPlaneRows = 16;  // planes are allocated in blocks of this many rows

struct Kernels {
  const char* name;  // lower case; INTDET_ISA and set_isa match it in any case
  // Can this CPU run the set? Called before any of its kernels, so it must
  // be baseline code even in a file compiled with the set's ISA flags.
  bool (*cpu_runs)();
  const Packing* packing;  // the layout the *_packed kernels read; null: none
  // Each weight format has either the row-major kernel or the packed one
  // (then `packing` has that format's packer); dispatch.cpp checks this.
  LinearFn linear;
  LinearFn linear_packed;
  LinearW4Fn linear_w4;
  LinearW4Fn linear_w4_packed;
  QkTileFn qk_tile;   // prefill / decode attention's scores, many rows per key
  PvTileFn pv_tile;   // and its P . V
  AttnRowFns attn_row;  // and its softmax, row by row
  RowFn softmax;   // softmax_q16_row; the attend kernel uses its own set's
  RowFn exp2_row;  // y[i] = exp2_neg_q30(x[i]), x >= 0
  int (*quant16)(const int64_t* x, int64_t n, int16_t* q);                    // quant16_row
  // rms_norm_row (x [n] Q in_frac, gamma g [n] -> y [n] int32 norm units)
  void (*rms_norm)(const int64_t* x, const int16_t* g, int64_t n, int64_t eps_q60, int in_frac, int32_t* y);
  void (*add_sat32)(int64_t* x, const int64_t* d, int64_t n);  // add_sat32_row: the residual add
  // rope_row: RoPE of nh heads of D in place, cos/sin [D/2] Q14 (|x| < 2^47)
  void (*rope)(int64_t* x, int64_t nh, int64_t D, const int16_t* cos, const int16_t* sin);
  int32_t (*quant8_row)(const int64_t* x, int64_t n, int8_t* q);  // quant8_row: a KV cache row, returns its absmax
  void (*swiglu)(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);  // swiglu_row (a may alias g)
  void (*geglu)(const int64_t* g, const int64_t* u, int64_t n, int64_t* a);   // geglu_row (a may alias g)
  ActPlanes planes;  // optional prefill path (planes.linear null: none)
};

// Marks a kernel set's cpu_runs in a file built with ISA flags: the check
// itself must run on CPUs without them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INTDET_BASELINE_CODE __attribute__((target("arch=x86-64")))
#else
#define INTDET_BASELINE_CODE
#endif

// Every kernel set this build has, worst first (csrc/cpu/kernel_sets.h).
const std::vector<const Kernels*>& kernel_sets();
// The active kernel set: the best the CPU runs, or INTDET_ISA / set_isa().
// One forward takes it once and passes it down, so a set_isa() on another
// thread never mixes two sets within a call.
const Kernels& kernels();
// Names this build has and this CPU can run, best last ("scalar" first).
std::vector<std::string> available_isas();
// The kernel set called `name` (any case); throws std::invalid_argument
// naming the ISA and the valid choices when the build or the CPU lacks it.
const Kernels& kernel_set(const std::string& name);
// Make kernel_set(name) the active set (later forwards take it).
void set_isa(const std::string& name);

// Threads for prefill and decode (OpenMP), csrc/cpu/threads.cpp. n > 0:
// exactly n; 0 (the default): auto, the cores this process may use minus
// those other processes keep busy, measured at most every 100 ms.
void set_num_threads(int n);
// What set_num_threads was given: n, or 0 for auto.
int thread_setting();
// The fixed count, or in auto mode the cores this process may use.
int num_threads();
// Picks the count for one forward and makes it the OpenMP team size; a
// forward calls it once at its start. Returns the count.
int forward_threads();
// Auto's rule: over one sample, ncpu CPUs spent `busy` of `total` jiffies
// busy, `self` of them ours; free cores = ncpu - (busy - self) / (total /
// ncpu), rounded to nearest, clamped to [1, ceiling].
int auto_thread_count(int64_t ncpu, int64_t ceiling, int64_t busy, int64_t total, int64_t self);
// The count the latest forward used (num_threads() before any forward).
int last_forward_threads();

// The packed layout of the AVX2 kernels ("g8"), portable code in pack.cpp.
// Int8: output channels in groups of 8, K in pairs, 16 bytes = w[8g + c][2p + i]
// at byte 2c + i (zero padded). The group holding channel j (a multiple of 8)
// starts at byte j * ((K + 1) / 2) * 2.
int64_t packed_size_w8x2(int64_t N, int64_t K);
void pack_w8x2(const int8_t* w, int64_t N, int64_t K, int8_t* out);
// Int4: output channels in groups of 8; per group of 32 inputs a 160-byte
// block: gd[8] int16, gm[8] int16, then 8 rows of 16 bytes, row r byte
// 2c + i = u[8g + c][32j + 4r + i] (low nibble) | u[8g + c][32j + 4r + 2 + i] << 4.
// Channel j (a multiple of 8) starts at byte j * (K / 32) * 20. Padded channels are zero.
constexpr int64_t kW4Group = 32;
constexpr int64_t kW4Block = 160;
int64_t packed_size_w4(int64_t N, int64_t K);
void pack_w4(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out);
extern const Packing kPackG8;

// The AMX set's layout ("q16", csrc/cpu/x86/amx_pack.cpp): int8 output
// channels in groups of 16, K padded to a multiple of 64 (Kq) and cut into
// quads; the 64 bytes of quad p of group g hold w[16g + c][4p + i] at byte
// 4c + i (zero padded), so 16 quads are one AMX B tile (16 rows of 64
// bytes). Group g starts at byte 16 g Kq. Int4 weights keep the g8 layout.
int64_t packed_size_q16(int64_t N, int64_t K);
void pack_q16(const int8_t* w, int64_t N, int64_t K, int8_t* out);
extern const Packing kPackQ16;

}  // namespace intdet
