// The range coder of `intdet compress`: the C++ twin of
// python/intdet/compress/rangecoder.py (the readable spec, docs/compress.md),
// compared byte for byte in tests/compress/test_compress_coder.py.
//
// A carry-propagating byte-wise range coder (Subbotin/LZMA style) with a
// 48-bit window: low holds 48 bits plus a carry bit, range stays in
// [2^40, 2^48) between symbols, so with frequencies totalling 2^P (P <= 30)
// r = range >> P >= 2^10 and the truncation costs under 2^-10 of a symbol's
// range (< 0.0015 bit; < 0.0001 bit at P = 28 once range is typical).
// The first byte of the raw stream is always 0 (no carry can reach it) and is
// not stored; the flush writes the fewest bytes that pin a value inside the
// final interval and trailing zero bytes are dropped, because the decoder
// reads zeros past the end.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace intdet::compress {

constexpr int kWindowBits = 48;
constexpr uint64_t kWindowMask = ((uint64_t)1 << kWindowBits) - 1;
constexpr uint64_t kTop = (uint64_t)1 << (kWindowBits - 8);

class RangeEncoder {
 public:
  // Codes the interval [cum, cum + freq) of a total 2^precision (freq >= 1).
  void encode(uint64_t cum, uint64_t freq, int precision) {
    const uint64_t r = range_ >> precision;
    low_ += r * cum;
    range_ = r * freq;
    while (range_ < kTop) {
      range_ <<= 8;
      shift_low();
    }
  }
  // Ends the stream and returns its bytes (the encoder is spent).
  std::vector<uint8_t> finish() {
    // The value with the most trailing zero bits inside [low, low + range):
    // range >= 2^40, so rounding low up to a multiple of 2^40 stays inside.
    low_ = (low_ + kTop - 1) & ~(kTop - 1);
    shift_low();
    shift_low();
    while (!out_.empty() && out_.back() == 0) out_.pop_back();
    return out_;
  }

 private:
  void shift_low() {
    if (low_ < ((uint64_t)0xFF << (kWindowBits - 8)) || low_ > kWindowMask) {
      const uint8_t carry = (uint8_t)(low_ >> kWindowBits);
      emit((uint8_t)(cache_ + carry));
      for (; pending_; --pending_) emit((uint8_t)(0xFF + carry));
      cache_ = (uint8_t)(low_ >> (kWindowBits - 8));
    } else {
      ++pending_;
    }
    low_ = (low_ & (kTop - 1)) << 8;
  }
  void emit(uint8_t b) {
    if (first_) {  // the always-zero first byte is not stored
      first_ = false;
      return;
    }
    out_.push_back(b);
  }
  uint64_t low_ = 0, range_ = kWindowMask;
  uint8_t cache_ = 0;
  uint64_t pending_ = 0;
  bool first_ = true;
  std::vector<uint8_t> out_;
};

class RangeDecoder {
 public:
  RangeDecoder(const uint8_t* data, size_t n) : data_(data), n_(n) {
    for (int i = 0; i < kWindowBits / 8; ++i) code_ = (code_ << 8) | next();
  }
  // The slot target in [0, 2^precision) of the next symbol; -1 if the data
  // cannot come from the encoder (corrupt). Then call consume().
  int64_t target(int precision) {
    r_ = range_ >> precision;
    const uint64_t t = code_ / r_;
    return t >> precision ? -1 : (int64_t)t;
  }
  void consume(uint64_t cum, uint64_t freq) {
    code_ -= r_ * cum;
    range_ = r_ * freq;
    while (range_ < kTop) {
      code_ = (code_ << 8) | next();
      range_ <<= 8;
    }
  }
 private:
  uint64_t next() { return pos_ < n_ ? data_[pos_++] : 0; }
  const uint8_t* data_;
  size_t n_, pos_ = 0;
  uint64_t code_ = 0, range_ = kWindowMask, r_ = 1;
};

}  // namespace intdet::compress
