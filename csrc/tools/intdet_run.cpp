// intdet_run: a standalone (no Python) greedy generator that prints the chain
// hash of docs/chain-hash.md. Its purpose is cross-architecture evidence: the
// same converted model directory must give the same hash on x86-64, aarch64,
// big-endian s390x, ... (tests/engine/test_cross_arch.py, scripts/cross/).
//
//   intdet_run MODEL_DIR --ids 5,17,99 [-n 16] [--model-sha256 HEX]
//              [--threads N] [--isa NAME] [--no-eos]
//   intdet_run MODEL_DIR --decode-chunk FILE --start ID -n TOKENS [--threads N] [--isa NAME]
//
// --decode-chunk: range-decode one chunk's payload of an `intdet compress`
// file (docs/compress.md) with the model, feeding ID first, and print
// "tokens <id,...>": the compressed format's table and coder
// (csrc/compress/) and the forward pass on this architecture.
//
// Prints on stdout:
//   hash <12 hex>            the chain hash (as `intdet generate` prints it)
//   hashes 1:<12 hex> ...    the hash after steps 1, 64, 128, 256, 512 when reached
//   tokens <id,id,...>       the generated ids
//   stop <length|eos>
// and the kernel set, thread count and byte order on stderr.
//
// The model is read directly: the safetensors header is parsed with
// nlohmann/json and every dtype, shape and offset checked before use (as
// python/intdet/safetensors_io.py does). Tensors are copied out of the
// little-endian file into aligned host-order buffers, so unaligned offsets
// and big-endian hosts are both handled. config.json and the tensors then go
// through the one loader (csrc/include/intdet/loader.h) that the Python
// engines use, so both accept and refuse the same files.
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

#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include "xxhash.h"

#include "intdet/kernels.h"
#include "intdet/loader.h"
#include "../compress/coder.h"
#include "intdet/model.h"

namespace {

using namespace intdet;

static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big,
              "mixed-endian hosts are not supported");

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

using json = nlohmann::json;

json parse_json(const unsigned char* p, size_t n, const std::string& where) {
  try {
    return json::parse(p, p + n);
  } catch (const json::parse_error& e) {
    fail(where + ": invalid JSON (" + e.what() + ")");
  }
}

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
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> data;  // host byte order; uint64 storage keeps it aligned
};

// The dtypes a safetensors header may name; the loader then accepts only a
// model's (I8, U8, I16, I32) and refuses the others by tensor name.
int header_dtype_size(const std::string& dt) {
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
  const json header = parse_json(file.data() + 8, (size_t)hlen, path + " header");
  if (!header.is_object()) fail(path + ": safetensors header is not a JSON object");
  const uint64_t base = 8 + hlen, data_len = size - base;
  std::map<std::string, Tensor> out;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> spans;
  for (const auto& [name, ent] : header.items()) {
    if (name == "__metadata__") continue;
    if (!ent.is_object() || !ent.contains("dtype") || !ent["dtype"].is_string() || !ent.contains("shape") ||
        !ent["shape"].is_array() || !ent.contains("data_offsets") || !ent["data_offsets"].is_array() ||
        ent["data_offsets"].size() != 2 || !ent["data_offsets"][0].is_number_integer() ||
        !ent["data_offsets"][1].is_number_integer())
      fail(path + ": tensor '" + name + "' has a malformed header entry");
    const std::string dt = ent["dtype"].get<std::string>();
    const int isz = header_dtype_size(dt);
    if (!isz) fail(path + ": tensor '" + name + "' has unsupported dtype '" + dt + "'");
    static const std::map<std::string, DType> model_dtypes = {
        {"I8", DType::I8}, {"U8", DType::U8}, {"I16", DType::I16}, {"I32", DType::I32}};
    if (!model_dtypes.count(dt)) fail(path + ": tensor '" + name + "' has dtype " + dt + " (a model holds I8, U8, I16, I32)");
    const json& offs = ent["data_offsets"];
    const int64_t b = offs[0].is_number_unsigned() && offs[0].get<uint64_t>() > (uint64_t)INT64_MAX ? -1 : offs[0].get<int64_t>();
    const int64_t e = offs[1].is_number_unsigned() && offs[1].get<uint64_t>() > (uint64_t)INT64_MAX ? -1 : offs[1].get<int64_t>();
    if (!(0 <= b && b <= e && (uint64_t)e <= data_len))
      fail(path + ": tensor '" + name + "' offsets [" + std::to_string(b) + ", " + std::to_string(e) +
           "] lie outside the " + std::to_string(data_len) + "-byte data section");
    Tensor t;
    t.dtype = model_dtypes.at(dt);
    uint64_t nbytes = (uint64_t)isz;
    bool overflow = false;
    for (const json& d : ent["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= ((int64_t)1 << 40))
        fail(path + ": tensor '" + name + "' has an invalid shape");
      const int64_t di = d.get<int64_t>();
      t.shape.push_back(di);
      if (di && nbytes > UINT64_MAX / (uint64_t)di) overflow = true;
      else nbytes *= (uint64_t)di;
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

std::unique_ptr<LoadedModel> load_model(const std::string& dir, const std::vector<unsigned char>& st_file,
                                        const std::string& st_path) {
  const std::string cfg_path = dir + "/config.json";
  const std::vector<unsigned char> cfg_text = read_file(cfg_path);
  const ModelDesc desc = parse_config(std::string(cfg_text.begin(), cfg_text.end()), cfg_path);
  auto lm = std::make_unique<LoadedModel>();
  lm->format_version = desc.format_version;
  // EOS ids as `intdet generate` takes them: tokenizer_config.json's
  // eos_token_ids (written by `intdet convert`), else config.json's copy.
  json eos;
  {
    std::ifstream probe(dir + "/tokenizer_config.json", std::ios::binary);
    if (probe) {
      const std::vector<unsigned char> text = read_file(dir + "/tokenizer_config.json");
      const json tc = parse_json(text.data(), text.size(), dir + "/tokenizer_config.json");
      if (tc.is_object() && tc.contains("eos_token_ids")) eos = tc["eos_token_ids"];
    }
  }
  if (eos.is_null()) {
    const json cfg = parse_json(cfg_text.data(), cfg_text.size(), cfg_path);
    if (cfg.contains("tokenizer") && cfg["tokenizer"].is_object() && cfg["tokenizer"].contains("eos_token_ids"))
      eos = cfg["tokenizer"]["eos_token_ids"];
  }
  if (eos.is_array())
    for (const json& id : eos)
      if (id.is_number_integer()) lm->eos_ids.push_back(id.get<int64_t>());
  lm->tensors = read_safetensors(st_path, st_file);
  TensorMap views;
  for (const auto& [name, t] : lm->tensors) views.emplace(name, TensorView{t.dtype, t.shape, t.data.data()});
  lm->m = build_model(desc, views, st_path);
  pack_model(lm->m);
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

// The decoder of python/intdet/compress/codec.py for one chunk, one row.
int decode_chunk(const std::string& dir, const std::string& chunk_path, int64_t start, int64_t n, int64_t threads,
                 const std::string& isa) {
  if (threads >= 0) set_num_threads((int)threads);
  if (!isa.empty()) set_isa(isa);
  const std::string st_path = dir + "/model.safetensors";
  std::unique_ptr<LoadedModel> lm = load_model(dir, read_file(st_path), st_path);
  const Model& m = lm->m;
  const int64_t V = m.cfg.vocab;
  if (n < 1 || n > m.cfg.ctx) fail("-n: " + std::to_string(n) + " tokens must be in [1, the context length]");
  if (start < 0 || start >= V) fail("--start: token id " + std::to_string(start) + " is outside the vocabulary");
  const std::vector<unsigned char> payload = read_file(chunk_path);
  intdet::compress::RangeDecoder dec(payload.data(), payload.size());
  KVCache kv;
  kv.init(m, n);
  std::vector<int32_t> logits((size_t)V), out;
  int32_t tok = (int32_t)start;
  intdet::compress::RangeDecoder* decs[1] = {&dec};
  for (int64_t t = 0; t < n; ++t) {
    forward(m, kv, &tok, 1, t, false, logits.data());
    const int32_t* rows[1] = {logits.data()};
    intdet::compress::decode_rows(decs, rows, 1, V, intdet::compress::kPrecision, &tok);
    if (tok < 0) fail(chunk_path + ": corrupt range-coded data at token " + std::to_string(t));
    out.push_back(tok);
  }
  std::printf("tokens ");
  for (size_t k = 0; k < out.size(); ++k) std::printf("%s%d", k ? "," : "", out[k]);
  std::printf("\n");
  std::fprintf(stderr, "intdet_run: isa %s, threads %d, %s-endian host\n", kernels().name, num_threads(),
               std::endian::native == std::endian::big ? "big" : "little");
  return 0;
}

int run(int argc, char** argv) {
  std::string dir, ids_text, sha, chunk_path;
  int64_t start_id = -1;
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
    } else if (arg == "--decode-chunk") {
      chunk_path = next();
    } else if (arg == "--start") {
      start_id = parse_int(next(), arg);
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
  if (!dir.empty() && !chunk_path.empty()) return decode_chunk(dir, chunk_path, start_id, n_new, threads, isa);
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
    kv.init(m, n_total);
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
