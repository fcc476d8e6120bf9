// intdet_run: a standalone (no Python) greedy generator that prints the chain
// hash of docs/chain-hash.md. Its purpose is cross-architecture evidence: the
// same converted model directory must give the same hash on x86-64, aarch64,
// big-endian s390x, ... (tests/test_cross_arch.py, scripts/cross/).
//
//   intdet_run MODEL_DIR --ids 5,17,99 [-n 16] [--model-sha256 HEX]
//              [--threads N] [--isa NAME] [--no-eos]
//
// Prints on stdout:
//   hash <12 hex>            the chain hash (as `intdet generate` prints it)
//   hashes 1:<12 hex> ...    the hash after steps 1, 64, 128, 256, 512 when reached
//   tokens <id,id,...>       the generated ids
//   stop <length|eos>
// and the kernel set, thread count and byte order on stderr.
//
// The model is read directly: config.json and the safetensors header are
// parsed by a small JSON reader below; every dtype, shape and offset is
// checked before use (as python/intdet/model.py and safetensors_io.py do).
// Tensors are copied out of the little-endian file into aligned host-order
// buffers, so unaligned offsets and big-endian hosts are both handled.
// Both weight formats load: int8, and int4 (config weight_format "int4":
// codes .q4 uint8 plus per-group-32 .gd/.gm int16, bound-checked here).
// sha256(model.safetensors) for h_0 is computed here unless --model-sha256
// gives it.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define XXH_INLINE_ALL
#include "xxhash.h"

#include "intdet/kernels.h"
#include "intdet/model.h"

namespace {

using namespace intdet;

static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big,
              "mixed-endian hosts are not supported");

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

// ------------------------------------------------------------------ JSON

struct Json {
  enum Kind { Null, Bool, Int, Num, Str, Arr, Obj } kind = Null;
  bool b = false;
  int64_t i = 0;
  std::string s;  // string value, or the text of a non-integer number
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json* get(const std::string& key) const {
    if (kind != Obj) return nullptr;
    for (const auto& kv : obj)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
};

class JsonParser {
 public:
  JsonParser(const char* p, size_t n, std::string where) : p_(p), end_(p + n), where_(std::move(where)) {}

  Json parse() {
    Json v = value(0);
    ws();
    if (p_ != end_) err("trailing characters");
    return v;
  }

 private:
  const char* p_;
  const char* end_;
  std::string where_;

  [[noreturn]] void err(const std::string& what) { fail(where_ + ": invalid JSON (" + what + ")"); }
  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool lit(const char* s) {
    size_t n = std::strlen(s);
    if ((size_t)(end_ - p_) >= n && std::memcmp(p_, s, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }
  static void utf8(std::string& out, uint32_t c) {
    if (c < 0x80) {
      out += (char)c;
    } else if (c < 0x800) {
      out += (char)(0xC0 | (c >> 6));
      out += (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += (char)(0xE0 | (c >> 12));
      out += (char)(0x80 | ((c >> 6) & 0x3F));
      out += (char)(0x80 | (c & 0x3F));
    } else {
      out += (char)(0xF0 | (c >> 18));
      out += (char)(0x80 | ((c >> 12) & 0x3F));
      out += (char)(0x80 | ((c >> 6) & 0x3F));
      out += (char)(0x80 | (c & 0x3F));
    }
  }
  uint32_t hex4() {
    if (end_ - p_ < 4) err("short \\u escape");
    uint32_t c = 0;
    for (int k = 0; k < 4; ++k) {
      char h = *p_++;
      c <<= 4;
      if (h >= '0' && h <= '9') c |= (uint32_t)(h - '0');
      else if (h >= 'a' && h <= 'f') c |= (uint32_t)(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') c |= (uint32_t)(h - 'A' + 10);
      else err("bad \\u escape");
    }
    return c;
  }
  std::string str() {
    ++p_;  // opening quote
    std::string out;
    while (true) {
      if (p_ == end_) err("unterminated string");
      char c = *p_++;
      if (c == '"') return out;
      if ((unsigned char)c < 0x20) err("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ == end_) err("unterminated escape");
      char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t c1 = hex4();
          if (c1 >= 0xD800 && c1 < 0xDC00) {
            if (!lit("\\u")) err("lone surrogate");
            uint32_t c2 = hex4();
            if (c2 < 0xDC00 || c2 >= 0xE000) err("bad surrogate pair");
            c1 = 0x10000 + ((c1 - 0xD800) << 10) + (c2 - 0xDC00);
          } else if (c1 >= 0xDC00 && c1 < 0xE000) {
            err("lone surrogate");
          }
          utf8(out, c1);
          break;
        }
        default: err("bad escape");
      }
    }
  }
  Json number() {
    const char* s = p_;
    if (p_ != end_ && *p_ == '-') ++p_;
    auto digits = [&] {
      const char* d = p_;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == d) err("bad number");
    };
    if (p_ != end_ && *p_ == '0') ++p_;
    else digits();
    bool integer = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      digits();
      integer = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      digits();
      integer = false;
    }
    Json v;
    v.s.assign(s, p_);
    v.kind = Json::Num;
    if (integer) {  // exact int64 or it stays a Num (text)
      const bool neg = v.s[0] == '-';
      uint64_t mag = 0, lim = neg ? (uint64_t)1 << 63 : ((uint64_t)1 << 63) - 1;
      bool ok = true;
      for (size_t k = neg ? 1 : 0; k < v.s.size() && ok; ++k) {
        uint64_t d = (uint64_t)(v.s[k] - '0');
        if (mag > (lim - d) / 10) ok = false;
        else mag = mag * 10 + d;
      }
      if (ok) {
        v.kind = Json::Int;
        v.i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
      }
    }
    return v;
  }
  Json value(int depth) {
    if (depth > 64) err("nested too deeply");
    ws();
    if (p_ == end_) err("unexpected end");
    Json v;
    char c = *p_;
    if (c == '{') {
      ++p_;
      v.kind = Json::Obj;
      ws();
      if (p_ != end_ && *p_ == '}') {
        ++p_;
        return v;
      }
      while (true) {
        ws();
        if (p_ == end_ || *p_ != '"') err("expected a key");
        std::string k = str();
        if (v.get(k)) err("duplicate key '" + k + "'");
        ws();
        if (p_ == end_ || *p_ != ':') err("expected ':'");
        ++p_;
        v.obj.emplace_back(std::move(k), value(depth + 1));
        ws();
        if (p_ != end_ && *p_ == ',') {
          ++p_;
          continue;
        }
        if (p_ != end_ && *p_ == '}') {
          ++p_;
          return v;
        }
        err("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++p_;
      v.kind = Json::Arr;
      ws();
      if (p_ != end_ && *p_ == ']') {
        ++p_;
        return v;
      }
      while (true) {
        v.arr.push_back(value(depth + 1));
        ws();
        if (p_ != end_ && *p_ == ',') {
          ++p_;
          continue;
        }
        if (p_ != end_ && *p_ == ']') {
          ++p_;
          return v;
        }
        err("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::Str;
      v.s = str();
      return v;
    }
    if (lit("true")) {
      v.kind = Json::Bool;
      v.b = true;
      return v;
    }
    if (lit("false")) {
      v.kind = Json::Bool;
      return v;
    }
    if (lit("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    err("unexpected character");
  }
};

// ------------------------------------------------------------------ files

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path + ": cannot open: " + std::strerror(errno));
  f.seekg(0, std::ios::end);
  const std::streamoff n = f.tellg();
  if (n < 0) fail(path + ": cannot read its size");
  f.seekg(0, std::ios::beg);
  std::vector<unsigned char> buf((size_t)n);
  if (n > 0 && !f.read(reinterpret_cast<char*>(buf.data()), n)) fail(path + ": read error");
  return buf;
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// ------------------------------------------------------------------ sha256 (FIPS 180-4)

class Sha256 {
 public:
  void update(const unsigned char* p, size_t n) {
    len_ += n;
    while (n) {
      size_t take = std::min(n, (size_t)64 - fill_);
      std::memcpy(buf_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        block(buf_);
        fill_ = 0;
      }
    }
  }
  std::string hex() {
    const uint64_t bits = len_ * 8;
    unsigned char pad = 0x80, zero = 0, lb[8];
    update(&pad, 1);
    while (fill_ != 56) update(&zero, 1);
    for (int k = 0; k < 8; ++k) lb[k] = (unsigned char)(bits >> (56 - 8 * k));
    update(lb, 8);
    static const char* d = "0123456789abcdef";
    std::string out;
    for (uint32_t w : h_)
      for (int k = 28; k >= 0; k -= 4) out += d[(w >> k) & 15];
    return out;
  }

 private:
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char buf_[64];
  size_t fill_ = 0;
  uint64_t len_ = 0;
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const unsigned char* p) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
    h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }
};

// ------------------------------------------------------------------ safetensors

struct Tensor {
  std::string dtype;            // I8, U8, I16, I32 (the only ones a model uses)
  std::vector<int64_t> shape;
  std::vector<uint64_t> data;   // host byte order; uint64 storage keeps it aligned
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

int dtype_size(const std::string& dt) {
  static const std::map<std::string, int> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(dt);
  return it == sizes.end() ? 0 : it->second;
}

// Reads every tensor of a safetensors file, checking the header as
// python/intdet/safetensors_io.py does.
std::map<std::string, Tensor> read_safetensors(const std::string& path, const std::vector<unsigned char>& file) {
  const uint64_t size = file.size();
  if (size < 8) fail(path + ": truncated safetensors file (" + std::to_string(size) + " bytes)");
  const uint64_t hlen = load_le64(file.data());
  if (hlen > size - 8 || hlen > 100u * 1024 * 1024)
    fail(path + ": safetensors header length " + std::to_string(hlen) + " exceeds the file size " + std::to_string(size));
  Json header = JsonParser(reinterpret_cast<const char*>(file.data()) + 8, (size_t)hlen, path + " header").parse();
  if (header.kind != Json::Obj) fail(path + ": safetensors header is not a JSON object");
  const uint64_t base = 8 + hlen, data_len = size - base;
  std::map<std::string, Tensor> out;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> spans;
  for (const auto& [name, ent] : header.obj) {
    if (name == "__metadata__") continue;
    const Json* dt = ent.get("dtype");
    const Json* shape = ent.get("shape");
    const Json* offs = ent.get("data_offsets");
    if (!dt || dt->kind != Json::Str || !shape || shape->kind != Json::Arr || !offs || offs->kind != Json::Arr ||
        offs->arr.size() != 2 || offs->arr[0].kind != Json::Int || offs->arr[1].kind != Json::Int)
      fail(path + ": tensor '" + name + "' has a malformed header entry");
    const int isz = dtype_size(dt->s);
    if (!isz) fail(path + ": tensor '" + name + "' has unsupported dtype '" + dt->s + "'");
    const int64_t b = offs->arr[0].i, e = offs->arr[1].i;
    if (!(0 <= b && b <= e && (uint64_t)e <= data_len))
      fail(path + ": tensor '" + name + "' offsets [" + std::to_string(b) + ", " + std::to_string(e) +
           "] lie outside the " + std::to_string(data_len) + "-byte data section");
    Tensor t;
    t.dtype = dt->s;
    uint64_t nbytes = (uint64_t)isz;
    bool overflow = false;
    for (const Json& d : shape->arr) {
      if (d.kind != Json::Int || d.i < 0 || d.i >= ((int64_t)1 << 40))
        fail(path + ": tensor '" + name + "' has an invalid shape");
      t.shape.push_back(d.i);
      if (d.i && nbytes > UINT64_MAX / (uint64_t)d.i) overflow = true;
      else nbytes *= (uint64_t)d.i;
    }
    if (overflow || nbytes != (uint64_t)(e - b))
      fail(path + ": tensor '" + name + "' is " + std::to_string(e - b) + " bytes but its dtype and shape need " +
           (overflow ? std::string("more") : std::to_string(nbytes)));
    if (e > b) spans.push_back({{(uint64_t)b, (uint64_t)e}, name});
    // Copy out (aligned), converting the little-endian file to host order.
    t.data.assign((size_t)((nbytes + 7) / 8), 0);
    unsigned char* dst = reinterpret_cast<unsigned char*>(t.data.data());
    const unsigned char* src = file.data() + base + b;
    if constexpr (std::endian::native == std::endian::little) {
      if (nbytes) std::memcpy(dst, src, (size_t)nbytes);
    } else {
      for (uint64_t k = 0; k < nbytes; k += (uint64_t)isz)
        for (int j = 0; j < isz; ++j) dst[k + j] = src[k + (uint64_t)(isz - 1 - j)];
    }
    out.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k].first.first < spans[k - 1].first.second)
      fail(path + ": tensors '" + spans[k - 1].second + "' and '" + spans[k].second + "' overlap");
  return out;
}

// ------------------------------------------------------------------ model

struct LoadedModel {
  Model m;
  int64_t format_version = 0;
  std::vector<int64_t> eos_ids;
  std::map<std::string, Tensor> tensors;  // owns what m points into
};

class ModelLoader {
 public:
  ModelLoader(std::string st_path, std::map<std::string, Tensor>& t) : path_(std::move(st_path)), t_(t) {}

  template <typename T>
  const T* get(const std::string& name, std::vector<int64_t> shape, bool optional = false) {
    auto it = t_.find(name);
    if (it == t_.end()) {
      if (optional) return nullptr;
      fail(path_ + ": missing tensor '" + name + "'");
    }
    const Tensor& x = it->second;
    static_assert(sizeof(T) == 1 || std::is_signed_v<T>, "unsigned only for U8");
    const char* want = sizeof(T) == 1 ? (std::is_signed_v<T> ? "I8" : "U8") : sizeof(T) == 2 ? "I16" : "I32";
    if (x.dtype != want || x.shape != shape) {
      std::string got = x.dtype + "[", exp = std::string(want) + "[";
      for (size_t k = 0; k < x.shape.size(); ++k) got += (k ? ", " : "") + std::to_string(x.shape[k]);
      for (size_t k = 0; k < shape.size(); ++k) exp += (k ? ", " : "") + std::to_string(shape[k]);
      fail(path_ + ": tensor '" + name + "' is " + got + "], expected " + exp + "]");
    }
    const T* p = x.as<T>();
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    // Value ranges the overflow bounds rely on (python/intdet/model.py _check_value_ranges).
    auto ends = [&](const char* s) {
      const size_t m = std::strlen(s);
      return name.size() >= m && name.compare(name.size() - m, m, s) == 0;
    };
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = p[k];
      if (ends(".mant") && (v < 0 || v > (1 << 15)))
        fail(path_ + ": tensor '" + name + "' has a dyadic mantissa outside [0, 2^15]");
      if (ends(".shift") && (v < -64 || v > 200)) fail(path_ + ": tensor '" + name + "' has a shift outside [-64, 200]");
      if (ends(".q") && v < -127) fail(path_ + ": tensor '" + name + "' holds -128 (weights are symmetric int8)");
    }
    return p;
  }

  // int4: the decoder linears (not the int8 embedding / lm_head, which pass
  // wname) hold codes .q4 uint8 [N, K/2] and per group of 32 inputs step .gd
  // and offset .gm int16 [N, K/32] (docs/format.md, python/intdet/model.py).
  Linear linear(const std::string& name, int64_t N, int64_t K, bool bias, const std::string& wname = "",
                bool int4 = false) {
    Linear L;
    L.N = N;
    L.K = K;
    if (int4 && wname.empty()) {
      if (K % 32) fail(path_ + ": tensor '" + name + ".q4': input size " + std::to_string(K) + " is not a multiple of 32");
      if (t_.count(name + ".q")) fail(path_ + ": tensor '" + name + ".q' is int8 in an int4 model (weight_format int4)");
      L.w4 = get<uint8_t>(name + ".q4", {N, K / 2});
      L.gd = get<int16_t>(name + ".gd", {N, K / 32});
      L.gm = get<int16_t>(name + ".gm", {N, K / 32});
      for (int64_t i = 0; i < N * (K / 32); ++i) {  // the bound the kernels' int32 blocks rely on
        const int32_t d = L.gd[i], m = L.gm[i];      // |d*u + m| <= 2047 for u in 0..15, d >= 0
        if (d < 0 || m < -2047 || m > 2047 || m + 15 * d > 2047)
          fail(path_ + ": tensor '" + name + "' has int4 group steps/offsets outside |gd * u + gm| <= 2047 (group " +
               std::to_string(i) + ": gd " + std::to_string(d) + ", gm " + std::to_string(m) + ")");
      }
    } else {
      if (wname.empty() && t_.count(name + ".q4"))
        fail(path_ + ": tensor '" + name + ".q4' is int4 but config.json has no weight_format int4");
      L.w = get<int8_t>(wname.empty() ? name + ".q" : wname, {N, K});
    }
    L.mant = get<int32_t>(name + ".mant", {N});
    L.shift = get<int32_t>(name + ".shift", {N});
    L.bias = get<int32_t>(name + ".bias", {N}, !bias);
    return L;
  }

 private:
  std::string path_;
  std::map<std::string, Tensor>& t_;
};

int64_t cfg_int(const Json& cfg, const std::string& key, const std::string& where, int64_t lo = 1,
                int64_t hi = ((int64_t)1 << 31) - 1) {
  const Json* v = cfg.get(key);
  if (!v || v->kind != Json::Int || v->i < lo || v->i > hi)
    fail(where + ": " + key + " is missing or not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v->i;
}

bool cfg_bool(const Json& cfg, const std::string& key, const std::string& where) {
  const Json* v = cfg.get(key);
  if (!v || v->kind != Json::Bool) fail(where + ": " + key + " is missing or not a boolean");
  return v->b;
}

std::unique_ptr<LoadedModel> load_model(const std::string& dir, const std::vector<unsigned char>& st_file,
                                        const std::string& st_path) {
  const std::string cfg_path = dir + "/config.json";
  const std::vector<unsigned char> cfg_text = read_file(cfg_path);
  const Json cfg = JsonParser(reinterpret_cast<const char*>(cfg_text.data()), cfg_text.size(), cfg_path).parse();
  const Json* fmt = cfg.get("format");
  if (cfg.kind != Json::Obj || !fmt || fmt->kind != Json::Str || fmt->s != "intdet")
    fail(cfg_path + ": not an intdet config (convert the model with `intdet convert` first)");
  auto lm = std::make_unique<LoadedModel>();
  lm->format_version = cfg_int(cfg, "format_version", cfg_path);
  if (lm->format_version != 1)
    fail(cfg_path + ": format_version " + std::to_string(lm->format_version) + " is not 1; re-convert the model");
  Config& c = lm->m.cfg;
  c.hidden = cfg_int(cfg, "hidden_size", cfg_path);
  c.ffn = cfg_int(cfg, "intermediate_size", cfg_path);
  c.n_layers = cfg_int(cfg, "num_layers", cfg_path);
  c.n_heads = cfg_int(cfg, "num_heads", cfg_path);
  c.n_kv = cfg_int(cfg, "num_kv_heads", cfg_path);
  c.head_dim = cfg_int(cfg, "head_dim", cfg_path);
  c.vocab = cfg_int(cfg, "vocab_size", cfg_path);
  c.ctx = cfg_int(cfg, "context_length", cfg_path);
  c.qk_norm = cfg_bool(cfg, "qk_norm", cfg_path);
  const bool bias = cfg_bool(cfg, "attn_bias", cfg_path);
  const bool tied_cfg = cfg_bool(cfg, "tied_embeddings", cfg_path);
  const Json* eps = cfg.get("rms_eps_q60");
  if (!eps || eps->kind != Json::Obj) fail(cfg_path + ": rms_eps_q60 is missing");
  c.eps_hidden = cfg_int(*eps, "hidden", cfg_path + " rms_eps_q60", 0, INT64_MAX);
  c.eps_head = cfg_int(*eps, "head", cfg_path + " rms_eps_q60", 0, INT64_MAX);
  // EOS ids as `intdet generate` takes them: tokenizer_config.json's
  // eos_token_ids (written by `intdet convert`), else config.json's copy.
  const Json* eos_list = nullptr;
  Json tok_cfg;
  {
    std::ifstream probe(dir + "/tokenizer_config.json", std::ios::binary);
    if (probe) {
      const std::vector<unsigned char> text = read_file(dir + "/tokenizer_config.json");
      tok_cfg = JsonParser(reinterpret_cast<const char*>(text.data()), text.size(), dir + "/tokenizer_config.json").parse();
      eos_list = tok_cfg.get("eos_token_ids");
    }
  }
  if (!eos_list)
    if (const Json* tok = cfg.get("tokenizer")) eos_list = tok->get("eos_token_ids");
  if (eos_list && eos_list->kind == Json::Arr)
    for (const Json& id : eos_list->arr)
      if (id.kind == Json::Int) lm->eos_ids.push_back(id.i);
  const int64_t H = c.hidden, D = c.head_dim;
  if (c.n_heads % c.n_kv || D % 2 || D > 256 || H > 8192)
    fail(cfg_path + ": head counts/sizes outside the overflow-checked range (docs/format.md)");
  // Weight format (python/intdet/model.py load_model): int8 when absent.
  bool int4 = false;
  if (const Json* wf = cfg.get("weight_format")) {
    if (wf->kind != Json::Str || (wf->s != "int8" && wf->s != "int4"))
      fail(cfg_path + ": weight_format " + (wf->kind == Json::Str ? "'" + wf->s + "'" : std::string("(not a string)")) +
           " is not int8 or int4");
    int4 = wf->s == "int4";
  }
  if (int4) {
    const Json* gs = cfg.get("weight_group_size");
    const int64_t ks[] = {H, c.ffn, c.n_heads * D};
    bool ok = gs && gs->kind == Json::Int && gs->i == 32;
    for (int64_t k : ks) ok = ok && k % 32 == 0 && k < ((int64_t)1 << 21);
    if (!ok)
      fail(cfg_path + ": int4 weights need weight_group_size 32, linear inputs that are multiples of 32 and below 2^21");
  }

  lm->tensors = read_safetensors(st_path, st_file);
  ModelLoader t(st_path, lm->tensors);
  Model& m = lm->m;
  m.tok_embd = t.get<int8_t>("tok_embd.q", {c.vocab, H});
  m.embd_mant = t.get<int32_t>("tok_embd.mant", {c.vocab});
  m.embd_shift = t.get<int32_t>("tok_embd.shift", {c.vocab});
  m.rope_cos = t.get<int16_t>("rope.cos", {c.ctx, D / 2});
  m.rope_sin = t.get<int16_t>("rope.sin", {c.ctx, D / 2});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = t.get<int16_t>(p + "attn_norm.g", {H});
    L.q = t.linear(p + "attn_q", c.n_heads * D, H, bias, "", int4);
    L.k = t.linear(p + "attn_k", c.n_kv * D, H, bias, "", int4);
    L.v = t.linear(p + "attn_v", c.n_kv * D, H, bias, "", int4);
    L.o = t.linear(p + "attn_output", H, c.n_heads * D, lm->tensors.count(p + "attn_output.bias") > 0, "", int4);
    if (c.qk_norm) {
      L.q_norm = t.get<int16_t>(p + "attn_q_norm.g", {D});
      L.k_norm = t.get<int16_t>(p + "attn_k_norm.g", {D});
    }
    L.score_mant = t.get<int32_t>(p + "attn_score.mant", {1})[0];
    L.score_shift = t.get<int32_t>(p + "attn_score.shift", {1})[0];
    L.ffn_norm = t.get<int16_t>(p + "ffn_norm.g", {H});
    L.gate = t.linear(p + "ffn_gate", c.ffn, H, false, "", int4);
    L.up = t.linear(p + "ffn_up", c.ffn, H, false, "", int4);
    L.down = t.linear(p + "ffn_down", H, c.ffn, false, "", int4);
    m.layers.push_back(L);
  }
  m.out_norm = t.get<int16_t>("output_norm.g", {H});
  const bool tied = lm->tensors.count("output.q") == 0;
  if (tied != tied_cfg) fail(st_path + ": output.q presence disagrees with tied_embeddings in config.json");
  m.output = t.linear("output", c.vocab, H, false, tied ? "tok_embd.q" : "output.q");
  pack_model(m);
  return lm;
}

// ------------------------------------------------------------------ chain hash

void put_u32le(std::vector<unsigned char>& b, uint32_t v) {
  for (int k = 0; k < 4; ++k) b.push_back((unsigned char)(v >> (8 * k)));
}

struct ChainHash {
  unsigned char state[16];

  void set(const std::vector<unsigned char>& msg) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(msg.data(), msg.size()));
    std::memcpy(state, c.digest, 16);  // xxhash's digest(): big-endian high64 || low64
  }
  ChainHash(int64_t format_version, const std::string& sha_hex, const std::vector<int32_t>& ids) {
    std::vector<unsigned char> b(reinterpret_cast<const unsigned char*>("intdet-chain"),
                                 reinterpret_cast<const unsigned char*>("intdet-chain") + 12);
    put_u32le(b, (uint32_t)format_version);
    for (size_t k = 0; k < 64; k += 2) b.push_back((unsigned char)std::stoul(sha_hex.substr(k, 2), nullptr, 16));
    put_u32le(b, (uint32_t)ids.size());
    for (int32_t id : ids) put_u32le(b, (uint32_t)id);
    set(b);
  }
  void update(const int32_t* logits, int64_t V, int32_t token) {
    std::vector<unsigned char> b(state, state + 16);
    b.reserve((size_t)(16 + 4 * V + 4));
    for (int64_t k = 0; k < V; ++k) put_u32le(b, (uint32_t)logits[k]);
    put_u32le(b, (uint32_t)token);
    set(b);
  }
  std::string hex(int n = 12) const {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (int k = 0; k < 16; ++k) {
      out += d[state[k] >> 4];
      out += d[state[k] & 15];
    }
    return out.substr(0, (size_t)n);
  }
};

// ------------------------------------------------------------------ main

int64_t parse_int(const std::string& s, const std::string& opt) {
  if (s.empty()) fail(opt + ": empty value");
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos, 10);
  } catch (const std::exception&) {
    fail(opt + ": '" + s + "' is not an integer");
  }
  if (pos != s.size()) fail(opt + ": '" + s + "' is not an integer");
  return v;
}

void usage() {
  std::fprintf(stderr,
               "usage: intdet_run MODEL_DIR --ids 5,17,99 [-n 16] [--model-sha256 HEX] [--threads N] [--isa NAME] "
               "[--no-eos]\n");
}

int run(int argc, char** argv) {
  std::string dir, ids_text, sha;
  int64_t n_new = 16, threads = -1;
  bool use_eos = true, have_ids = false;
  std::string isa;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto next = [&]() -> std::string {
      if (a + 1 >= argc) fail(arg + ": needs a value");
      return argv[++a];
    };
    if (arg == "--ids") {
      ids_text = next();
      have_ids = true;
    } else if (arg == "-n" || arg == "--max-new-tokens") {
      n_new = parse_int(next(), arg);
    } else if (arg == "--model-sha256") {
      sha = next();
    } else if (arg == "--threads") {
      threads = parse_int(next(), arg);
    } else if (arg == "--isa") {
      isa = next();
    } else if (arg == "--no-eos") {
      use_eos = false;
    } else if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    } else if (!arg.empty() && arg[0] == '-') {
      fail("unknown option " + arg);
    } else if (dir.empty()) {
      dir = arg;
    } else {
      fail("unexpected argument " + arg);
    }
  }
  if (dir.empty() || !have_ids) {
    usage();
    return 2;
  }
  std::vector<int32_t> ids;
  for (size_t p = 0; p <= ids_text.size();) {
    size_t q = ids_text.find(',', p);
    if (q == std::string::npos) q = ids_text.size();
    std::string tok = ids_text.substr(p, q - p);
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(tok.find_last_not_of(" \t") + 1);
    if (!tok.empty()) {
      const int64_t v = parse_int(tok, "--ids");
      if (v < 0 || v > INT32_MAX) fail("--ids: token id " + tok + " is out of range");
      ids.push_back((int32_t)v);
    }
    p = q + 1;
  }
  if (n_new < 0) fail("-n: " + std::to_string(n_new) + " must be >= 0");
  if (threads >= 0) set_num_threads((int)threads);
  if (!isa.empty()) set_isa(isa);

  const std::string st_path = dir + "/model.safetensors";
  const std::vector<unsigned char> st_file = read_file(st_path);
  if (sha.empty()) {
    Sha256 h;
    h.update(st_file.data(), st_file.size());
    sha = h.hex();
  } else {
    if (sha.size() != 64 || sha.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      fail("--model-sha256: expected 64 hex digits");
    std::transform(sha.begin(), sha.end(), sha.begin(), [](char ch) { return (char)std::tolower(ch); });
  }
  std::unique_ptr<LoadedModel> lm = load_model(dir, st_file, st_path);
  const Model& m = lm->m;
  const int64_t V = m.cfg.vocab, ctx = m.cfg.ctx;

  // The checks and loop of python/intdet/generate.py (greedy sampler).
  if (ids.empty()) fail("prompt: empty (give --ids)");
  if ((int64_t)ids.size() >= ctx)
    fail("prompt: " + std::to_string(ids.size()) + " tokens do not fit the context length " + std::to_string(ctx));
  for (int32_t id : ids)
    if (id >= V) fail("--ids: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  ChainHash chain(lm->format_version, sha, ids);
  std::vector<std::pair<int, std::string>> at;
  std::vector<int32_t> out;
  std::string stop = "length";
  if (n_new > 0) {
    const int64_t n_total = std::min(ctx, (int64_t)ids.size() + n_new);
    KVCache kv;
    kv.init(m.cfg, n_total);
    std::vector<int32_t> logits((size_t)V);
    forward(m, kv, ids.data(), (int64_t)ids.size(), 0, false, logits.data());
    int64_t n_past = (int64_t)ids.size();
    while (true) {
      const int32_t tok = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());  // lowest id on ties
      chain.update(logits.data(), V, tok);
      out.push_back(tok);
      const int steps = (int)out.size();
      if (steps == 1 || steps == 64 || steps == 128 || steps == 256 || steps == 512) at.push_back({steps, chain.hex()});
      if (use_eos && std::find(lm->eos_ids.begin(), lm->eos_ids.end(), (int64_t)tok) != lm->eos_ids.end()) {
        stop = "eos";
        break;
      }
      if ((int64_t)out.size() >= n_new || n_past >= n_total) break;
      forward(m, kv, &tok, 1, n_past, false, logits.data());
      n_past += 1;
    }
  }
  std::printf("hash %s\n", chain.hex().c_str());
  std::printf("hashes");
  for (const auto& [s, h] : at) std::printf(" %d:%s", s, h.c_str());
  std::printf("\ntokens ");
  for (size_t k = 0; k < out.size(); ++k) std::printf("%s%d", k ? "," : "", out[k]);
  std::printf("\nstop %s\n", stop.c_str());
  std::fprintf(stderr, "intdet_run: isa %s, threads %d, %s-endian host, model sha256 %s\n", kernels().name,
               num_threads(), std::endian::native == std::endian::big ? "big" : "little", sha.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "intdet_run: error: %s\n", e.what());
    return 1;
  }
}
