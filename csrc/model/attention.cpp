// One layer's attention in tiles (attention.h), integer only. The same bits
// as attend_head per (row, head): attend_head's softmax is
//   zmax = max z, u = exp2(zmax - z), tot = sum u, p = round_shift(u * (2^62 / tot), 46) * va,
//   e = max(bitlen(max p) - 15, 0), w16 = clamp(round_shift(p, e)), out = (sum w16 v) << e,
// and every step is per element or an exact integer max / sum, so computing
// it over key ranges and combining the ranges' maxima and sums gives the
// same integers in any split and order.
#include "intdet/attention.h"
#include "intdet/pool.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <vector>

#include "intdet/intmath.h"
#include "intdet/ops.h"

namespace intdet {
namespace {

// Rows t0..t0+P-1 (consecutive positions of one sequence) times nj query
// heads of KV head g, from head g * grp + j0: R = P * nj query rows, row
// r = i * nj + j is row t0 + i, query head g * grp + j0 + j. Keys [s0, s1)
// cover every row's range.
struct Tile {
  int64_t t0, P, g, s0, s1, j0, nj;
  int64_t R() const { return P * nj; }
};

// Per-tile state of the two-pass softmax; chunk c of nc covers keys
// [cut[c], cut[c + 1]). Partials per (chunk, row): score max, exp sum,
// weight max, and P . V [nc, R, D].
struct TileState {
  std::vector<int16_t> q;
  std::vector<int32_t> e_q;
  std::vector<int64_t> lo, hi;  // [R] row r reads key positions [lo, hi)
  std::vector<int64_t> z;       // [R, span]: scores, then exp2
  std::vector<int16_t> w16;     // [R, span]
  std::vector<int32_t> va;      // [span]: the keys' value scales, contiguous
  std::vector<int64_t> cut, zmax, tot, pmax, out;
};

struct Ctx {
  const Kernels& ks;
  const Model& m;
  const Layer& L;
  int64_t l, nh, nkv, D, grp;
  KVCache* const* caches;
  const Row* rows;
  const int64_t* q;
  int64_t* o;

  const KVCache& kv(const Tile& tl) const { return *caches[rows[tl.t0].seq]; }

  // f(p0, row0, n): key positions p0..p0+n-1 lie in cache rows row0..row0+n-1
  // (a ring wraps at most once inside [a, b)).
  template <class F>
  void segments(const KVCache& c, int64_t a, int64_t b, F&& f) const {
    while (a < b) {
      const int64_t r = c.row(l, a), end = c.off[(size_t)l] + c.cap[(size_t)l];
      const int64_t n = std::min(b - a, end - r);
      f(a, r, n);
      a += n;
    }
  }

  void setup(const Tile& tl, int64_t nc, TileState& s) const {
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    s.q.resize((size_t)(R * D));
    s.e_q.resize((size_t)R);
    s.lo.resize((size_t)R);
    s.hi.resize((size_t)R);
    for (int64_t i = 0; i < tl.P; ++i) {
      const int64_t t = tl.t0 + i, pos = rows[t].pos;
      const int64_t lo = L.window && pos + 1 > L.window ? pos + 1 - L.window : 0;
      for (int64_t j = 0; j < tl.nj; ++j) {
        const int64_t r = i * tl.nj + j, hd = tl.g * grp + tl.j0 + j;
        s.e_q[r] = ks.quant16(q + (t * nh + hd) * D, D, s.q.data() + r * D);
        s.lo[r] = lo;
        s.hi[r] = pos + 1;
      }
    }
    s.z.resize((size_t)(R * span));
    s.w16.resize((size_t)(R * span));
    s.va.resize((size_t)span);
    s.cut.resize((size_t)nc + 1);
    for (int64_t c = 0; c <= nc; ++c) s.cut[c] = tl.s0 + span * c / nc;
    s.zmax.assign((size_t)(nc * R), LLONG_MIN);
    s.tot.assign((size_t)(nc * R), 0);
    s.pmax.assign((size_t)(nc * R), 0);
    s.out.assign((size_t)(nc * R * D), 0);
  }

  // Row r's keys inside chunk c: [a, b) (a >= b when none).
  static void range(const TileState& s, int64_t c, int64_t r, int64_t* a, int64_t* b) {
    *a = std::max(s.cut[c], s.lo[r]);
    *b = std::min(s.cut[c + 1], s.hi[r]);
  }

  // Pass 1: scores of every row against the chunk's keys (rows outside
  // their range are computed and never read), and each row's maximum.
  void scores(const Tile& tl, int64_t c, TileState& s) const {
    const KVCache& cv = kv(tl);
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    segments(cv, s.cut[c], s.cut[c + 1], [&](int64_t p0, int64_t r0, int64_t n) {
      const int64_t i0 = cv.at(l, r0, tl.g);  // the head's rows are consecutive (stride D)
      ks.qk_tile(s.q.data(), s.e_q.data(), R, cv.k.data() + i0 * D, cv.ka.data() + i0, n, D, D, L.score_mant,
                 L.score_shift, s.z.data() + (p0 - tl.s0), span);
      std::copy(cv.va.data() + i0, cv.va.data() + i0 + n, s.va.data() + (p0 - tl.s0));
    });
    const Softcap& sc = L.attn_softcap;
    if (!sc.cap) return;
    for (int64_t r = 0; r < R; ++r) {  // Gemma 2: z = c tanh(z / c) before the softmax (intmath.h softcap)
      int64_t a, b;
      range(s, c, r, &a, &b);
      int64_t* z = s.z.data() + r * span - tl.s0;
      for (int64_t p = a; p < b; ++p) z[p] = softcap(z[p], sc);
    }
  }

  // Pass 1b: each row's score maximum in the chunk.
  void maxima(const Tile& tl, int64_t c, TileState& s) const {
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    for (int64_t r = 0; r < R; ++r) {
      int64_t a, b;
      range(s, c, r, &a, &b);
      s.zmax[c * R + r] = a < b ? ks.attn_row.max(s.z.data() + r * span - tl.s0 + a, b - a) : LLONG_MIN;
    }
  }

  // Pass 2a: u = exp2(zmax - z) with the row's maximum over all chunks, and its chunk sum.
  void exps(const Tile& tl, int64_t c, int64_t nc, TileState& s, int64_t r) const {
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    int64_t a, b, mx = LLONG_MIN;
    for (int64_t k = 0; k < nc; ++k) mx = imax(mx, s.zmax[k * R + r]);
    range(s, c, r, &a, &b);
    if (a < b) s.tot[c * R + r] = ks.attn_row.exp_sum(s.z.data() + r * span - tl.s0 + a, b - a, mx);
  }

  // 2^62 / tot for row r (tot >= 2^30 - 4 > 0: the max term).
  static int64_t recip(const TileState& s, int64_t nc, int64_t R, int64_t r) {
    int64_t tot = 0;
    for (int64_t k = 0; k < nc; ++k) tot += s.tot[k * R + r];
    return ((int64_t)1 << 62) / tot;
  }

  // Pass 2b: the chunk's largest weight p = round_shift(u * (2^62 / tot),
  // 62 - kProbFrac) times the value scale (p < 2^47).
  void weights(const Tile& tl, int64_t c, int64_t nc, TileState& s, int64_t r) const {
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    int64_t a, b;
    range(s, c, r, &a, &b);
    if (a >= b) return;
    s.pmax[c * R + r] = ks.attn_row.prob_max(s.z.data() + r * span - tl.s0 + a, b - a, recip(s, nc, R, r),
                                             s.va.data() - tl.s0 + a);
  }

  // Pass 2c: row r's int16 weights in the chunk with the row's exponent
  // (zero outside its range; p recomputed from u, the same integers).
  void w16(const Tile& tl, int64_t c, int64_t nc, TileState& s, int64_t r) const {
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    const int64_t c0 = s.cut[c], c1 = s.cut[c + 1];
    int64_t a, b, mx = 0;
    for (int64_t k = 0; k < nc; ++k) mx = imax(mx, s.pmax[k * R + r]);
    const int e = (int)imax(bitlen(mx) - 15, 0);
    range(s, c, r, &a, &b);
    int16_t* w = s.w16.data() + r * span - tl.s0;
    if (a >= b) {
      std::fill(w + c0, w + c1, (int16_t)0);
      return;
    }
    std::fill(w + c0, w + a, (int16_t)0);
    ks.attn_row.prob_w16(s.z.data() + r * span - tl.s0 + a, b - a, recip(s, nc, R, r), s.va.data() - tl.s0 + a, e,
                         w + a);
    std::fill(w + b, w + c1, (int16_t)0);
  }

  // Pass 2c's P . V of the chunk into out[c].
  void pv(const Tile& tl, int64_t c, TileState& s) const {
    const KVCache& cv = kv(tl);
    const int64_t R = tl.R(), span = tl.s1 - tl.s0;
    int64_t* out = s.out.data() + c * R * D;
    segments(cv, s.cut[c], s.cut[c + 1], [&](int64_t p0, int64_t r0, int64_t n) {
      ks.pv_tile(s.w16.data() + (p0 - tl.s0), span, R, cv.v.data() + cv.at(l, r0, tl.g) * D, n, D, D, out);
    });
  }

  // One chunk (nc == 1): the softmax's passes row by row, so a row's scores
  // stay in L1 from its maximum to its int16 weights.
  void softmax_rows(const Tile& tl, TileState& s) const {
    const int64_t R = tl.R();
    maxima(tl, 0, s);
    for (int64_t r = 0; r < R; ++r) {
      exps(tl, 0, 1, s, r);
      weights(tl, 0, 1, s, r);
      w16(tl, 0, 1, s, r);
    }
  }

  // The chunks' sums, shifted by each row's exponent, into o.
  void finish(const Tile& tl, int64_t nc, const TileState& s) const {
    const int64_t R = tl.R();
    for (int64_t r = 0; r < R; ++r) {
      int64_t mx = 0;
      for (int64_t k = 0; k < nc; ++k) mx = imax(mx, s.pmax[k * R + r]);
      const int e = (int)imax(bitlen(mx) - 15, 0);
      const int64_t t = tl.t0 + r / tl.nj, hd = tl.g * grp + tl.j0 + r % tl.nj;
      int64_t* dst = o + (t * nh + hd) * D;
      for (int64_t d = 0; d < D; ++d) {
        int64_t acc = 0;
        for (int64_t k = 0; k < nc; ++k) acc += s.out[(k * R + r) * D + d];
        dst[d] = shl(acc, e);
      }
    }
  }
};

// The tiles with each one's query heads cut into parts of about equal size
// when there are fewer tiles than threads (Gemma 3's one KV head: two parts
// of 2 heads at 2 threads), else the tiles themselves. A part still widens
// and scales each key once for all its heads, which is why whole tiles beat
// one (row, head) per task by about 2x per key at 512 keys.
std::vector<Tile> head_parts(const std::vector<Tile>& tiles, int64_t grp, int64_t threads) {
  const int64_t ntiles = (int64_t)tiles.size();
  if (ntiles >= threads) return tiles;
  const int64_t want = std::min(grp, (threads + ntiles - 1) / ntiles), nj = (grp + want - 1) / want;
  std::vector<Tile> parts;
  for (const Tile& tl : tiles)
    for (int64_t j = 0; j < grp; j += nj) parts.push_back({tl.t0, tl.P, tl.g, tl.s0, tl.s1, j, std::min(nj, grp - j)});
  return parts;
}

}  // namespace

void attend_layer(int nt, const Kernels& ks, const Model& m, int64_t l, KVCache* const* caches, const Row* rows,
                  int64_t T, const int64_t* q, int64_t* o) {
  const Config& cf = m.cfg;
  const Layer& L = m.layers[(size_t)l];
  const Ctx cx{ks, m, L, l, cf.n_heads, cf.n_kv, cf.head_dim, cf.n_heads / cf.n_kv, caches, rows, q, o};
  const int64_t P = std::max<int64_t>(1, kTileRows / cx.grp);
  // Tiles: runs of consecutive positions of one sequence, at most P rows.
  // The latest position each sequence adds in this call: a ring must still
  // hold every key a row reads once all the call's rows are written.
  std::vector<int64_t> last;
  for (int64_t t = 0; t < T; ++t) {
    if ((size_t)rows[t].seq >= last.size()) last.resize((size_t)rows[t].seq + 1, 0);
    last[(size_t)rows[t].seq] = std::max(last[(size_t)rows[t].seq], rows[t].pos);
  }
  std::vector<Tile> tiles;
  for (int64_t t = 0; t < T;) {
    int64_t n = 1;
    while (n < P && t + n < T && rows[t + n].seq == rows[t].seq && rows[t + n].pos == rows[t].pos + n) ++n;
    const int64_t pos0 = rows[t].pos, pos1 = rows[t + n - 1].pos;
    const int64_t s0 = L.window && pos0 + 1 > L.window ? pos0 + 1 - L.window : 0;
    const KVCache& c = *caches[rows[t].seq];
    if (last[(size_t)rows[t].seq] + 1 - s0 > c.cap[(size_t)l])
      throw std::logic_error("attention reads positions the KV cache no longer holds");
    for (int64_t g = 0; g < cx.nkv; ++g) tiles.push_back({t, n, g, s0, pos1 + 1, 0, cx.grp});
    t += n;
  }
  // Longest spans first, so the last tiles a thread takes are short.
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.s1 - a.s0 > b.s1 - b.s0; });
  const int64_t ntiles = (int64_t)tiles.size(), threads = nt > 1 ? nt : 1;
  // Tasks run on the pool (pool.h); scratch is per OS thread (thread_local),
  // used whole by one task before that thread takes the next.
  auto whole = [&](const std::vector<Tile>& tiles) {
    parallel_tasks(nt, (int64_t)tiles.size(), [&](int64_t i) {
      thread_local TileState s;
      const Tile& tl = tiles[i];
      cx.setup(tl, 1, s);
      cx.scores(tl, 0, s);
      cx.softmax_rows(tl, s);
      cx.pv(tl, 0, s);
      cx.finish(tl, 1, s);
    });
  };
  if (ntiles >= 4 * threads) {  // prefill: whole tiles per task
    whole(tiles);
    return;
  }
  // Few tiles (decode): whole tiles, split into head parts when there are
  // fewer tiles than threads (head_parts); only when that still leaves
  // threads idle and the keys are many does each tile's key range split (below).
  int64_t longest = 0;
  for (const Tile& tl : tiles) longest = std::max(longest, tl.s1 - tl.s0);
  const std::vector<Tile> parts = head_parts(tiles, cx.grp, threads);
  if ((int64_t)parts.size() >= threads || longest < kShortKeys) {
    whole(parts);
    return;
  }
  // Fewer tiles and head parts than threads at a long context (a decode
  // row on many cores): each tile's keys in chunks across threads, the
  // passes one after another (each parallel_tasks call completes).
  std::vector<TileState> st((size_t)ntiles);
  std::vector<int64_t> nc((size_t)ntiles), first((size_t)ntiles + 1, 0);
  const int64_t want = (4 * threads + ntiles - 1) / ntiles;
  for (int64_t i = 0; i < ntiles; ++i) {
    const int64_t span = tiles[i].s1 - tiles[i].s0;
    nc[i] = std::max<int64_t>(1, std::min(want, span / kSplitKeys));
    first[i + 1] = first[i] + nc[i];
  }
  const int64_t ntask = first[ntiles];
  std::vector<int64_t> task_tile((size_t)ntask);
  for (int64_t i = 0; i < ntiles; ++i)
    for (int64_t c = 0; c < nc[i]; ++c) task_tile[first[i] + c] = i;
  for (int64_t i = 0; i < ntiles; ++i) cx.setup(tiles[i], nc[i], st[i]);  // few rows: not worth a barrier
  // Each pass completes (parallel_tasks returns) before the next starts.
  parallel_tasks(nt, ntask, [&](int64_t k) {
    const int64_t i = task_tile[k];
    cx.scores(tiles[i], k - first[i], st[i]);
    cx.maxima(tiles[i], k - first[i], st[i]);
  });
  parallel_tasks(nt, ntask, [&](int64_t k) {
    const int64_t i = task_tile[k], R = tiles[i].R();
    for (int64_t r = 0; r < R; ++r) cx.exps(tiles[i], k - first[i], nc[i], st[i], r);
  });
  parallel_tasks(nt, ntask, [&](int64_t k) {
    const int64_t i = task_tile[k], R = tiles[i].R();
    for (int64_t r = 0; r < R; ++r) cx.weights(tiles[i], k - first[i], nc[i], st[i], r);
  });
  parallel_tasks(nt, ntask, [&](int64_t k) {
    const int64_t i = task_tile[k], R = tiles[i].R();
    for (int64_t r = 0; r < R; ++r) cx.w16(tiles[i], k - first[i], nc[i], st[i], r);
    cx.pv(tiles[i], k - first[i], st[i]);
  });
  parallel_tasks(nt, ntiles, [&](int64_t i) { cx.finish(tiles[i], nc[i], st[i]); });
}

}  // namespace intdet
