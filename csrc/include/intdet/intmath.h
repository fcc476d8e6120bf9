// Integer primitives: the C++ twins of python/intdet/ref/intmath.py.
//
// One definition each, header-only and host/device inline so every backend
// (scalar, SIMD, CUDA) calls the same code. Rounding everywhere is
// round-half-up: floor(x / 2^s + 1/2). Requires C++20 (arithmetic right
// shift of negative values is defined there). No floating point.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define INTDET_HD __host__ __device__ __forceinline__
#elif defined(__CUDA_ARCH__)  // device code compiled for the host emulator (csrc/cuda/emu.h)
#define INTDET_HD static inline
#else
#define INTDET_HD inline
#endif

namespace intdet {

constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kInt16QMax = 32767;
constexpr int64_t kInt8QMax = 127;
constexpr int kExpFrac = 16;  // exp2_neg_q30 input: Q16
// 2^-f, f in [0,1) Q16 -> Q30; degree-6 polynomial frozen as integers
// (max error under 5 units of Q30). Same table as EXP2_POLY_Q30 in Python.
constexpr int64_t kExp2Poly[7] = {1073741824, -744260975, 257938938, -59583045,
                                  10286509,   -1369790,   117454};
constexpr int64_t kLog2eQ30 = 1549082005;  // round(log2(e) * 2^30)
constexpr int64_t kLn2Q24 = 11629080;      // round(ln(2) * 2^24)

INTDET_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
INTDET_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
INTDET_HD int64_t iabs(int64_t a) { return a < 0 ? -a : a; }
INTDET_HD int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Left shift without signed-overflow UB; the caller guarantees the result fits.
INTDET_HD int64_t shl(int64_t x, int s) { return (int64_t)((uint64_t)x << s); }

// floor(x / 2^s + 1/2) for s >= 1 (0 for s >= 63), x for s == 0, x * 2^-s for s < 0.
// |x| < 2^62.
INTDET_HD int64_t round_shift(int64_t x, int64_t s) {
  if (s > 0) {
    if (s >= 63) return 0;
    return (x + ((int64_t)1 << (s - 1))) >> s;
  }
  if (s == 0) return x;
  return shl(x, (int)imin(-s, 62));
}

// round_shift saturated to +-(2^31 - 1); a left shift (s < 0) saturates too.
INTDET_HD int64_t shift_round_sat32(int64_t x, int64_t s) {
  int64_t r = round_shift(x, imax(s, 0));
  if (s < 0) {
    int t = (int)imin(-s, 40);
    int64_t lim = kInt32Max >> t;
    r = iabs(r) > lim ? (r < 0 ? -kInt32Max : kInt32Max) : shl(r, t);
  }
  return clamp(r, -kInt32Max, kInt32Max);
}

INTDET_HD int64_t sat32(int64_t x) { return clamp(x, -kInt32Max, kInt32Max); }

// Bits needed for x >= 0: bitlen(0) = 0, bitlen(255) = 8.
INTDET_HD int bitlen(int64_t x) {
#if defined(__CUDA_ARCH__)
  return x ? 64 - __clzll((long long)x) : 0;
#elif defined(__GNUC__) || defined(__clang__)
  return x ? 64 - __builtin_clzll((unsigned long long)x) : 0;
#else
  int n = 0;
  for (uint64_t u = (uint64_t)x; u; u >>= 1) ++n;
  return n;
#endif
}

// The high 64 bits of a * b (IMUL.WIDE.U32 / IMAD.HI on the device).
INTDET_HD uint64_t umulhi64(uint64_t a, uint64_t b) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
  const uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
  const uint64_t lh = al * bh, hl = ah * bl;
  const uint64_t mid = ((al * bl) >> 32) + (uint32_t)lh + (uint32_t)hl;
  return ah * bh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

// floor((2^64 - 1) / d) for d >= 1, by integer Newton steps (no division,
// no float): y <- y + hi(y e), e = 2^64 - d y (exact mod 2^64 while
// 0 < d y <= 2^64), from y = 2^(64 - bitlen(d)). A step is y (2 - d y / 2^64)
// rounded down, never above 2^64 / d (z (2 - z) <= 1), so y only grows and e
// stays in [0, 2^64); it squares the relative error 1 - d y / 2^64, at most
// 1/2 at the start: after six steps y is within about 2 of 2^64 / d (each
// step's floor loses under 1). The remainder r = 2^64 - 1 - d y then steps y
// up to the floor exactly whatever the gap (a brute-force run over 41M
// divisors, every bit length, needed at most one step); d y = 2^64 (d a power
// of two, y = 2^64 / d) is the one overshoot, by 1.
INTDET_HD uint64_t recip_u64(uint64_t d) {
  uint64_t y = (uint64_t)1 << (64 - bitlen((int64_t)d));  // bitlen as unsigned: d >= 2^63 has 64 bits
  for (int k = 0; k < 6; ++k) y += umulhi64(y, (uint64_t)0 - d * y);
  const uint64_t lo = d * y;
  if (lo == 0) return y - 1;  // d y = 2^64
  for (uint64_t r = ~lo; r >= d; r -= d) ++y;
  return y;
}

// Exact floor division by one divisor d >= 1 through its reciprocal
// (Granlund-Montgomery / libdivide style): m = recip_u64(d) once per divisor
// (a row's norm, absmax or softmax total), then per dividend n < 2^64
// q = hi(n m) is floor(n / d) or 1 below it, never more: m d = 2^64 - 1 - r0
// with r0 = (2^64 - 1) mod d < d, so n m / 2^64 = n / d - n (r0 + 1) /
// (d 2^64) and the term taken off is at most n / 2^64 < 1. One branch-free
// remainder step makes it exact. The device's '/' replacement: a
// multiply-high, a multiply and a compare per element instead of udiv_u64's
// step per quotient bit.
struct DivBy {
  uint64_t d = 1, m = ~(uint64_t)0;
};

// The DivBy of b >= 1 (b < 2^63: an int64 divisor).
INTDET_HD DivBy div_by(int64_t b) {
  DivBy v;
  v.d = (uint64_t)b;
  v.m = recip_u64(v.d);
  return v;
}

INTDET_HD uint64_t udiv(uint64_t n, const DivBy& v) {
  const uint64_t q = umulhi64(n, v.m);
  return q + (n - q * v.d >= v.d);  // n - q d is exact (q d <= n) and < 2 d
}

// floor(a / d) for any int64 a: for a < 0, floor(a / d) = -floor((-a - 1) / d) - 1
// (floor_div_intonly's identity) with -a - 1 = ~a and -q - 1 = ~q, so an xor
// with the sign mask on the way in and out.
INTDET_HD int64_t floor_div(int64_t a, const DivBy& v) {
  const uint64_t neg = (uint64_t)(a >> 63);
  return (int64_t)(udiv((uint64_t)a ^ neg, v) ^ neg);
}

// floor(a / d + 1/2) as floor_div(a + floor(d / 2)); a + d / 2 must fit int64.
INTDET_HD int64_t round_div(int64_t a, const DivBy& v) { return floor_div(a + (int64_t)(v.d >> 1), v); }

// n / d for d > 0 by shift and subtract, one step per quotient bit: exact,
// integer instructions only. The CUDA device uses it because nvcc lowers '/'
// by a variable divisor through a float reciprocal estimate (MUFU.RCP), which
// scripts/check_sass.py forbids. Host builds keep the '/' below.
INTDET_HD uint64_t udiv_u64(uint64_t n, uint64_t d) {
  if (n < d) return 0;
#if defined(__CUDA_ARCH__)
  const int sh = __clzll((long long)d) - __clzll((long long)n);
#elif defined(__GNUC__) || defined(__clang__)
  const int sh = __builtin_clzll(d) - __builtin_clzll(n);
#else
  int sh = 0;
  while (sh < 63 && (d << (sh + 1)) >> (sh + 1) == d && (d << (sh + 1)) <= n) ++sh;
#endif
  uint64_t q = 0, dd = d << sh;  // dd <= n: no bit is lost
  for (int i = sh; i >= 0; --i) {
    q <<= 1;
    if (n >= dd) {
      n -= dd;
      q |= 1;
    }
    dd >>= 1;
  }
  return q;
}

// floor(a / b) for b > 0 with udiv_u64 only (the reference the tests hold
// the device path of floor_div, DivBy, to).
INTDET_HD int64_t floor_div_intonly(int64_t a, int64_t b) {
  if (a >= 0) return (int64_t)udiv_u64((uint64_t)a, (uint64_t)b);
  return -(int64_t)udiv_u64((uint64_t)(-(a + 1)), (uint64_t)b) - 1;
}

// Floor division for b > 0 (C++ '/' truncates toward zero).
INTDET_HD int64_t floor_div(int64_t a, int64_t b) {
#if defined(__CUDA_ARCH__)
  return floor_div(a, div_by(b));  // a divisor per call: its reciprocal, then the product
#else
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
#endif
}

// floor(a / b + 1/2) as floor((a + floor(b/2)) / b), b > 0.
INTDET_HD int64_t round_div(int64_t a, int64_t b) { return floor_div(a + (b >> 1), b); }

// floor(sqrt(n)) for 0 <= n < 2^63: restoring digit recurrence, 32 steps.
INTDET_HD int64_t isqrt(int64_t n) {
  int64_t res = 0, bit = (int64_t)1 << 62;
  for (int i = 0; i < 32; ++i) {
    if (n >= res + bit) {
      n -= res + bit;
      res = (res >> 1) + bit;
    } else {
      res >>= 1;
    }
    bit >>= 2;
  }
  return res;
}

// 2^(-u / 2^16) in Q30 for u >= 0 (Q16): shift for the integer part,
// polynomial for the fraction (I-LLM DI-Exp form, arXiv 2405.17849).
INTDET_HD int64_t exp2_neg_q30(int64_t u) {
  int64_t i = u >> kExpFrac;
  int64_t f = u & ((1 << kExpFrac) - 1);
#if defined(__CUDA_ARCH__)
  // Device code cannot read a host array; this copy is folded at compile time.
  constexpr int64_t c[7] = {kExp2Poly[0], kExp2Poly[1], kExp2Poly[2], kExp2Poly[3],
                            kExp2Poly[4], kExp2Poly[5], kExp2Poly[6]};
#else
  const int64_t* c = kExp2Poly;
#endif
  if (i >= 31) return 0;  // 2^-31 and below round to 0 in Q30 (p < 2^31)
  int64_t p = c[6];
  for (int k = 5; k >= 0; --k) p = c[k] + round_shift(p * f, kExpFrac);
  return round_shift(p, i);
}

// Soft-capping c * tanh(X / c) (Gemma 2) of x = X * k (|x| < 2^31): with
// u = round_shift(|x| mant, shift - 4) (2|X|/c log2(e), Q20),
// d = e^(-2|X|/c) in Q30 from exp2_neg_q30 of u's Q16 part and a first-order
// step for its last 4 bits, t = round_div((2^30 - d) 2^30, 2^30 + d) =
// tanh(|X|/c) in Q30, returns sign(x) round_shift(cap t, 30).
// cap = round(c k) < 2^31, mant < 2^31, shift >= 5 (ref/intmath.py softcap).
INTDET_HD int64_t softcap(int64_t x, int64_t cap, int64_t mant, int64_t shift) {
  const int64_t u = round_shift(iabs(x) * mant, shift - 4);
  const int64_t d0 = exp2_neg_q30(u >> 4), one = (int64_t)1 << 30;
  const int64_t d = d0 - round_shift(d0 * (u & 15) * kLn2Q24, 44);
  const int64_t t = round_div((one - d) << 30, one + d);
  const int64_t y = round_shift(cap * t, 30);
  return x < 0 ? -y : y;
}

// The constants of one soft-capping site (a layer's scores, the logits):
// cap = round(c k) and the dyadic inv_mant / 2^inv_shift of 2 log2(e) 2^16 /
// cap, from the model file (<name>.cap / .inv_mant / .inv_shift). cap 0: none.
struct Softcap {
  int64_t cap = 0, inv_mant = 0, inv_shift = 0;
};

INTDET_HD int64_t softcap(int64_t x, const Softcap& s) { return softcap(x, s.cap, s.inv_mant, s.inv_shift); }

// a ~= m * 2^k with m <= 2^15: keeps score products inside int64.
INTDET_HD void normalize_scale15(int64_t a, int64_t* m, int64_t* k) {
  *k = imax(bitlen(a) - 15, 0);
  *m = round_shift(a, *k);
}

}  // namespace intdet
