// The g16 packed layout of the AVX-512 kernel set (avx512.h): portable code,
// compiled without ISA flags (it runs once at load, in pack_model, and in
// the _core.ops bindings).
#include <cstdint>
#include <cstring>

#include "avx512.h"
#include "intdet/kernels.h"

namespace intdet {

int64_t packed_size_w8x2_g16(int64_t N, int64_t K) { return (N + 15) / 16 * ((K + 1) / 2) * 32; }

void pack_w8x2_g16(const int8_t* w, int64_t N, int64_t K, int8_t* out) {
  const int64_t Kp = (K + 1) / 2, G = (N + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t p = 0; p < Kp; ++p)
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t i = 0; i < 2; ++i) {
          const int64_t n = 16 * g + c, k = 2 * p + i;
          out[(g * Kp + p) * 32 + 2 * c + i] = (n < N && k < K) ? w[n * K + k] : 0;
        }
}

int64_t packed_size_w4_g16(int64_t N, int64_t K) { return (N + 15) / 16 * (K / kW4Group) * kW4Block16; }

void pack_w4_g16(const uint8_t* w4, const int16_t* gd, const int16_t* gm, int64_t N, int64_t K, uint8_t* out) {
  const int64_t G = K / kW4Group, NG = (N + 15) / 16;
  auto code = [&](int64_t n, int64_t k) -> uint8_t { return (w4[n * (K / 2) + k / 2] >> (4 * (k & 1))) & 15; };
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < NG; ++g)
    for (int64_t j = 0; j < G; ++j) {
      uint8_t* b = out + (g * G + j) * kW4Block16;
      int16_t sc[32] = {};
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t n = 16 * g + c;
        if (n < N) {
          sc[c] = gd[n * G + j];
          sc[16 + c] = gm[n * G + j];
        }
      }
      std::memcpy(b, sc, sizeof sc);  // host order: the kernels read them as int16
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t c = 0; c < 16; ++c)
          for (int64_t i = 0; i < 2; ++i) {
            const int64_t n = 16 * g + c, k = 32 * j + 4 * r + i;
            b[64 + 32 * r + 2 * c + i] = n < N ? (uint8_t)(code(n, k) | code(n, k + 2) << 4) : 0;
          }
    }
}

namespace {
int64_t channel_bytes_w8x2_g16(int64_t K) { return (K + 1) / 2 * 2; }
int64_t channel_bytes_w4_g16(int64_t K) { return K / kW4Group * (kW4Block16 / 16); }
}  // namespace

// The AVX-512 kernels' layout: channels in groups of 16 for both weight formats.
constinit const Packing kPackG16{
    .name = "g16",
    .id = 1,
    .w8 = {.size = packed_size_w8x2_g16, .channel_bytes = channel_bytes_w8x2_g16, .pack = pack_w8x2_g16},
    .w4 = {.size = packed_size_w4_g16, .channel_bytes = channel_bytes_w4_g16, .pack = pack_w4_g16},
};

}  // namespace intdet
