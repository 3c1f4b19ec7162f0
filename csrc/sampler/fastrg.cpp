// Compiled fastRG sampler for sbm_pyg (CPU).
//
// Query-major sampling of a mixed-membership SBM over a ragged batch. For
// query row r = (head h, query i) of sequence g with keys [ks, ke):
//
//   w_v    = (Y_i B_h)_v * s_v,   s_v = sum_{j in g} Z_{jv}   (key cluster mass)
//   lambda = sum_v w_v (+ delta * n_k with exploration)     (Poisson degree mean)
//
// A "sparse" row draws d ~ Poisson(c * lambda) multi-edges; each picks a key
// cluster v with probability w_v / lambda (a guide table over the k entries)
// and then a key j with probability Z_{jv} / s_v (the cumulative quantised
// weights of (g, h, v) and their guide, two expected steps per draw). The
// multiplicity of (i, j) is Poisson(c p_ij),
// so merging duplicates (a bitmap or a short sort per row) gives
// P(i -> j) = 1 - exp(-c p_ij). Poisson mode uses c = 1; exact mode draws at
// c = -log(1 - P) / P for the row bound P >= max_j p_ij and keeps each
// distinct edge with probability min(p, 1) / (1 - exp(-c p)).
//
// A "dense" row tests every key of its sequence with one Bernoulli: it is
// chosen when c * lambda >= threshold * n_k, where drawing would cost more
// than testing every pair. Both kinds give the same marginals; the dense
// rows keep exact mode as cheap per edge as poisson mode at any density.
//
// Randomness: every row has its own counter-based stream derived from one
// 64-bit seed and the row's index, so the graph depends on the seed only,
// not on the number of threads.
//
// Rows of long sequences draw by chunk of rows (Sampler::draw_chunk): every
// draw's cluster and word first, then the draws grouped by key table and
// resolved table by table, so that a table stays in the cache while its
// draws read it. Each draw's key depends on its word and table only, so
// the graph is the same as drawn row by row.
//
// Two entry points, so that the caller can check the draw count (max_edges,
// the memory guard) before anything of that size is allocated:
//   plan   -> per-row degree (or -1 for a dense row) and inflation c
//   sample -> rowptr, col, perm, colptr (int32 CSR)
// They are the CPU kernels of the torch operators sbm_pyg::fastrg_plan and
// sbm_pyg::fastrg_sample, whose schemas are defined in Python
// (sbm_pyg/sampling/fastrg_op.py).
#include "sampler/fastrg.h"

#include "huge_pages.h"
#include "sampler/stream.h"
#include "simd.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

using at::Tensor;

namespace {

constexpr double kMaxInflation = 40.0;

using sbm_pyg::Rng;

// Poisson(mu) for finite mu >= 0: inversion for small means, Hoermann's
// transformed rejection (PTRS, 1993) otherwise.
int64_t poisson(Rng& rng, double mu) {
  if (mu <= 0.0) return 0;
  if (mu < 10.0) {
    double p = std::exp(-mu), F = p, u = rng.uniform();
    int64_t x = 0;
    // p underflows only far in the tail; the bound stops rounding loops.
    while (u > F && p > 0.0 && x < 1000) {
      ++x;
      p *= mu / x;
      F += p;
    }
    return x;
  }
  const double slam = std::sqrt(mu), loglam = std::log(mu);
  const double b = 0.931 + 2.53 * slam;
  const double a = -0.059 + 0.02483 * b;
  const double inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
  const double vr = 0.9277 - 3.6224 / (b - 2.0);
  for (;;) {
    const double U = rng.uniform() - 0.5;
    const double V = rng.uniform();
    const double us = 0.5 - std::fabs(U);
    const double k = std::floor((2.0 * a / us + b) * U + mu + 0.43);
    if (us >= 0.07 && V <= vr) return (int64_t)k;
    if (k < 0.0 || (us < 0.013 && V > us)) continue;
    if (std::log(V) + std::log(inv_alpha) - std::log(a / (us * us) + b) <=
        -mu + k * loglam - std::lgamma(k + 1.0))
      return (int64_t)k;
  }
}

// ---------------------------------------------------------------------------
// Dot products over the k clusters: 8 independent accumulators so that the
// compiler vectorizes without reassociating a single sum; cloned for AVX2
// and AVX-512 (simd.h).

template <typename scalar_t>
inline double dot_impl(const scalar_t* a, const scalar_t* b, int64_t k) {
  // GCC vector extensions: 32-byte vectors, two accumulators; unaligned
  // loads through memcpy.
  typedef scalar_t vec __attribute__((vector_size(32)));
  constexpr int L = 32 / sizeof(scalar_t);
  vec acc0 = {}, acc1 = {};
  int64_t v = 0;
  for (; v + 2 * L <= k; v += 2 * L) {
    vec x0, y0, x1, y1;
    std::memcpy(&x0, a + v, 32);
    std::memcpy(&y0, b + v, 32);
    std::memcpy(&x1, a + v + L, 32);
    std::memcpy(&y1, b + v + L, 32);
    acc0 += x0 * y0;
    acc1 += x1 * y1;
  }
  acc0 += acc1;
  double s = 0.0;
  for (int l = 0; l < L; ++l) s += (double)acc0[l];
  for (; v < k; ++v) s += (double)a[v] * (double)b[v];
  return s;
}

SBM_CLONES double dot(const float* a, const float* b, int64_t k) {
  return dot_impl(a, b, k);
}
SBM_CLONES double dot(const double* a, const double* b, int64_t k) {
  return dot_impl(a, b, k);
}

// ---------------------------------------------------------------------------
// Shapes and pointers shared by both passes.

template <typename scalar_t>
struct Problem {
  const scalar_t* W;   // [H, Nq, k]  Y B
  const scalar_t* Z;   // [Nk, H, k]
  const double* mass;  // [G, H, k]   s_v
  const double* max_z;  // [G, H, k]  max_j Z_jv: the plan's mass[1]
  const int64_t* ptr_q;
  const int64_t* ptr_k;
  int64_t G, H, Nq, Nk, k;
  double delta;
  bool exact;
  std::vector<int32_t> seq;  // sequence of each query

  Problem(const Tensor& W_, const Tensor& Z_, const Tensor& mass_,
          const Tensor& ptr_q_, const Tensor& ptr_k_, double delta_,
          bool exact_)
      : W(W_.data_ptr<scalar_t>()), Z(Z_.data_ptr<scalar_t>()),
        mass(mass_.data_ptr<double>()),
        max_z(mass + (ptr_q_.numel() - 1) * W_.size(0) * W_.size(2)),
        ptr_q(ptr_q_.data_ptr<int64_t>()),
        ptr_k(ptr_k_.data_ptr<int64_t>()), G(ptr_q_.numel() - 1),
        H(W_.size(0)), Nq(W_.size(1)), Nk(Z_.size(0)), k(W_.size(2)),
        delta(delta_), exact(exact_), seq(Nq) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = ptr_q[g]; i < ptr_q[g + 1]; ++i) seq[i] = (int32_t)g;
  }
  inline const scalar_t* w_row(int64_t h, int64_t i) const {
    return W + (h * Nq + i) * k;
  }
  inline const scalar_t* z_row(int64_t j, int64_t h) const {
    return Z + (j * H + h) * k;
  }
  inline const double* mass_row(int64_t g, int64_t h) const {
    return mass + (g * H + h) * k;
  }
  inline const double* max_row(int64_t g, int64_t h) const {
    return max_z + (g * H + h) * k;
  }
};

inline int num_threads() { return std::max(1, at::get_num_threads()); }

// ---------------------------------------------------------------------------
// Pass 1: key cluster masses, per-row degree and inflation.

// Whether x holds a negative, NaN or infinite entry.
template <typename scalar_t>
bool bad_values(const scalar_t* x, int64_t n) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) \
    reduction(+ : bad)
  for (int64_t t = 0; t < n; ++t) bad += !(x[t] >= 0 && x[t] <= std::numeric_limits<scalar_t>::max());
  return bad > 0;
}

// s_v = sum_j Z_jv and m_v = max_j Z_jv of each (sequence, head), [G, H, k].
template <typename scalar_t>
void key_masses(const scalar_t* Z, const int64_t* ptr_k, int64_t G, int64_t H,
                int64_t k, double* mass, double* max_k) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
  for (int64_t b = 0; b < G * H; ++b) {
    const int64_t g = b / H, h = b % H;
    double* s = mass + b * k;
    double* m = max_k + b * k;
    std::fill(s, s + k, 0.0);
    std::fill(m, m + k, 0.0);
    for (int64_t j = ptr_k[g]; j < ptr_k[g + 1]; ++j) {
      const scalar_t* z = Z + (j * H + h) * k;
      for (int64_t v = 0; v < k; ++v) {
        s[v] += (double)z[v];
        m[v] = std::max(m[v], (double)z[v]);
      }
    }
  }
}

template <typename scalar_t>
void plan_rows(const Problem<scalar_t>& P, uint64_t seed,
               double threshold, int64_t* degree, double* inflation,
               double* stats) {
  const int64_t R = P.H * P.Nq;
  double draws = 0.0, expected = 0.0, edges = 0.0, bad = 0.0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) \
    reduction(+ : draws, expected, edges, bad)
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = r / P.Nq, i = r % P.Nq, g = P.seq[i];
    const int64_t nk = P.ptr_k[g + 1] - P.ptr_k[g];
    const scalar_t* w = P.w_row(h, i);
    const double* s = P.mass_row(g, h);
    double lam = P.delta * nk, bound = P.delta;
    for (int64_t v = 0; v < P.k; ++v) lam += (double)w[v] * s[v];
    double c = 1.0;
    if (P.exact) {
      const double* m = P.max_row(g, h);
      for (int64_t v = 0; v < P.k; ++v) bound += (double)w[v] * m[v];
      if (bound >= 1.0)
        c = kMaxInflation;
      else if (bound > 0.0)
        c = std::min(-std::log1p(-bound) / bound, kMaxInflation);
    }
    inflation[r] = c;
    const double mu = c * lam;
    if (!(mu >= 0.0 && mu < 1e300) || nk == 0) {
      // NaN, inf or a negative rate: nothing is drawn; the caller's checks
      // raise. An empty key sequence has no pairs.
      bad += (nk > 0) ? 1.0 : 0.0;
      degree[r] = 0;
      continue;
    }
    if (mu > 0.0 && mu >= threshold * nk) {  // dense: one Bernoulli per key
      degree[r] = -1;
      draws += nk;
      expected += nk;
      edges += std::min(lam, (double)nk);
    } else {
      Rng rng(seed, r, sbm_pyg::kStreamDegree);
      const int64_t d = poisson(rng, mu);
      degree[r] = d;
      draws += d;
      expected += mu;
      edges += d;
    }
  }
  stats[0] = draws;
  stats[1] = expected;
  stats[2] = edges;
  stats[3] = bad;
}

// ---------------------------------------------------------------------------
// Key tables: one per (sequence, head, key cluster) over the keys of the
// sequence, stored at ((h * k + v) * Nk + j). A key's weight Z_jv is
// quantised to an integer (key_weight), so that the cumulative weights are
// exact: a sum in any order, sequential here and a parallel scan on the GPU
// (sbm_pyg/sampling/fastrg_triton.py), gives the same table, and the key a
// draw picks is a function of the draw's 64 bits alone. A guide (Chen &
// Asau 1974) over n equal buckets of the total starts each search near its
// key: two expected steps per draw whatever the weights.

// Bits of a key's quantised weight: the largest weight of a table is
// 2^M, so a table of at most N_k keys sums below 2^61.
inline int weight_bits(int64_t Nk) {
  int bits = 0;
  while (bits < 62 && (int64_t(1) << bits) <= Nk) ++bits;
  return 61 - bits;
}

// floor(z * 2^M / max): the scale is one IEEE division and the product one
// multiplication, rounded the same way on every device; the product is not
// negative, so truncation is the floor (without a call to floor()).
inline int64_t key_weight(double z, double scale) {
  return (int64_t)(z * scale);
}

inline double weight_scale(double max_z, int bits) {
  return max_z > 0.0 ? std::ldexp(1.0, bits) / max_z : 0.0;
}

inline uint64_t mulhi(uint64_t a, uint64_t b) {
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

// A lower bound of floor(b * total / n), the smallest target of bucket b,
// from step = total / n: float64 with a margin far above its rounding (the
// guide only has to start at or before the key; the key itself is exact).
inline int64_t bucket_floor(int64_t b, double step) {
  return std::max<int64_t>(0, (int64_t)((double)b * step * (1.0 - 1e-12)) - 1);
}

// cum and guide are written where a draw can read them (every table of a
// non-empty sequence with a positive total) and left uninitialised elsewhere.
struct KeyTables {
  sbm_pyg::HugeArray<int64_t> cum;   // inclusive cumulative weights, local keys
  sbm_pyg::HugeArray<int32_t> guide;  // first local key whose cum exceeds the bucket
  std::vector<int64_t> total;  // each table's total, [G, H, k]
};

// Draws resolved together: their random reads are prefetched stage by
// stage. 64 rather than 16: at N_k = 16384 the tables (50 MB for H = 2,
// k = 128) miss the last-level cache, and the row pass took 23% less time
// with four times the reads in flight; at 4096 it makes no difference.
constexpr int kBatch = 64;

template <typename scalar_t>
KeyTables build_tables(const Problem<scalar_t>& P) {
  KeyTables T;
  T.cum.resize((size_t)(P.H * P.k * P.Nk));
  T.guide.resize(T.cum.size());
  T.total.assign((size_t)(P.G * P.H * P.k), 0);
  const int bits = weight_bits(P.Nk);
  // A task is a tile of clusters of one (sequence, head): it reads the
  // tile's columns row by row (Z is [N_k, H, k]).
  constexpr int64_t kTile = 8;
  const int64_t tiles = (P.k + kTile - 1) / kTile;
  const int64_t tasks = P.G * P.H * tiles;
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<double> weights;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = t / (P.H * tiles), h = t / tiles % P.H;
      const int64_t v0 = t % tiles * kTile, nv = std::min(kTile, P.k - v0);
      const int64_t ks = P.ptr_k[g], n = P.ptr_k[g + 1] - ks;
      if (n == 0) continue;
      weights.resize(nv * n);
      for (int64_t j = 0; j < n; ++j) {
        const scalar_t* z = P.z_row(ks + j, h) + v0;
        for (int64_t c = 0; c < nv; ++c) weights[c * n + j] = (double)z[c];
      }
      for (int64_t c = 0; c < nv; ++c) {
        const double* z = weights.data() + c * n;
        const size_t at = (size_t)((h * P.k + v0 + c) * P.Nk + ks);
        int64_t* cum = T.cum.data() + at;
        int32_t* guide = T.guide.data() + at;
        // The plan's maximum (key_masses), not a pass of its own.
        const double scale = weight_scale(P.max_row(g, h)[v0 + c], bits);
        int64_t total = 0;
        for (int64_t j = 0; j < n; ++j) cum[j] = total += key_weight(z[j], scale);
        T.total[(g * P.H + h) * P.k + v0 + c] = total;
        if (total == 0) continue;  // never drawn: its cluster has rate 0
        const double step = (double)total / (double)n;
        for (int64_t b = 0, j = 0; b < n; ++b) {
          const int64_t lo = bucket_floor(b, step);
          while (cum[j] <= lo) ++j;
          guide[b] = (int32_t)j;
        }
      }
    }
  }
  return T;
}

// ---------------------------------------------------------------------------
// Pass 2: sampling the rows.

struct RowBuffers {
  std::vector<uint64_t> bits;
  std::vector<int32_t> list, keys, extra;
  std::vector<double> cum, uniforms;
  std::vector<int32_t> guide;
};

// Rows whose sequence has this many keys or more draw by chunk
// (Sampler::draw_chunk): below it a head's tables fit the caches anyway.
constexpr int64_t kGroupedKeys = 2048;
// Draws a chunk of rows aims at: enough that a group of one table has
// several draws per cache line of it (24 B of scratch a draw).
constexpr int64_t kChunkDraws = int64_t(1) << 20;

struct ChunkBuffers {
  std::vector<int64_t> first;  // each row's first draw in the chunk
  std::vector<uint64_t> state;  // each row's stream after its draws
  std::vector<int64_t> runs;   // the chunk's (sequence, head) tables, in order
  std::vector<int64_t> offset, pos;  // each group's first draw; the scatter's
  sbm_pyg::HugeArray<int32_t> code;  // a draw's group, then its key
  sbm_pyg::HugeArray<uint64_t> word, group_word;
  sbm_pyg::HugeArray<int32_t> group_slot;  // a grouped draw's slot in code
};

template <typename scalar_t>
struct Sampler {
  const Problem<scalar_t>& P;
  const int64_t* degree;
  const double* inflation;
  const KeyTables& tables;
  const int64_t* inc_ptr;  // [Nq + 1] or null
  const int64_t* inc_col;
  bool self_loops;
  uint64_t seed;

  // The row's cluster guide (Chen & Asau 1974) over its weights w_v s_v and
  // the exploration's delta * n_k (cluster k): buf.guide[m] is the first
  // cluster whose cumulative weight exceeds m / K of the total.
  struct Clusters {
    int64_t K, last;
    double total;
  };
  Clusters clusters(int64_t h, int64_t g, const scalar_t* w, int64_t nk,
                    RowBuffers& buf) const {
    const double* s = P.mass_row(g, h);
    Clusters c{P.k + (P.delta > 0.0 ? 1 : 0), 0, 0.0};
    buf.cum.resize(c.K);
    buf.guide.resize(c.K);
    for (int64_t v = 0; v < P.k; ++v) {
      const double x = (double)w[v] * s[v];
      if (x > 0.0) c.last = v;
      c.total += x;
      buf.cum[v] = c.total;
    }
    if (c.K > P.k) {
      c.total += P.delta * nk;
      buf.cum[P.k] = c.total;
      c.last = P.k;
    }
    for (int64_t m = 0, v = 0; m < c.K; ++m) {
      const double x = c.total * m / c.K;
      while (v < c.last && buf.cum[v] <= x) ++v;
      buf.guide[m] = (int32_t)v;
    }
    return c;
  }

  // The cluster of a draw's uniform u (P.k: the exploration's).
  static int64_t pick(double u, const Clusters& c, const RowBuffers& buf) {
    int64_t v = buf.guide[(int64_t)(u * c.K)];
    const double x = u * c.total;
    while (v < c.last && buf.cum[v] <= x) ++v;
    return v;
  }

  // Draws the row's d multi-edges as local key offsets into buf.list.
  void draw(Rng& rng, int64_t h, int64_t g, const scalar_t* w, int64_t d,
            int64_t nk, RowBuffers& buf) const {
    const Clusters cl = clusters(h, g, w, nk, buf);
    // A draw's 64-bit word picks both its bucket (the exploration's
    // uniform key) and its target in the cluster's cumulative weights. The
    // draws go in batches through three stages, each prefetching what the
    // next reads (the guide, then the weights at its start), so that the
    // batch's random reads overlap.
    const size_t at = (size_t)(P.ptr_k[g] + h * P.k * P.Nk);
    const int64_t* totals = tables.total.data() + (g * P.H + h) * P.k;
    const int64_t* cum[kBatch];
    const int32_t* start[kBatch];
    uint64_t target[kBatch];
    int64_t j[kBatch];
    buf.list.resize(d);
    for (int64_t t0 = 0; t0 < d; t0 += kBatch) {
      const int n = (int)std::min<int64_t>(kBatch, d - t0);
      for (int b = 0; b < n; ++b) {
        const int64_t v = pick(rng.uniform(), cl, buf);
        const uint64_t word = rng.next();
        j[b] = (int64_t)mulhi(word, (uint64_t)nk);
        cum[b] = nullptr;
        if (v == P.k) continue;  // exploration: uniform over the sequence
        cum[b] = tables.cum.data() + at + v * P.Nk;
        target[b] = mulhi(word, (uint64_t)totals[v]);
        start[b] = tables.guide.data() + at + v * P.Nk + j[b];
        __builtin_prefetch(start[b]);
      }
      for (int b = 0; b < n; ++b) {
        if (cum[b] == nullptr) continue;
        j[b] = *start[b];
        __builtin_prefetch(cum[b] + j[b]);
      }
      for (int b = 0; b < n; ++b) {
        if (cum[b] != nullptr)
          while ((uint64_t)cum[b][j[b]] <= target[b]) ++j[b];
        buf.list[t0 + b] = (int32_t)j[b];
      }
    }
  }

  // The draws of a chunk of rows, resolved table by table. A row's draws
  // read k key tables of n_k keys at random (12 B a key: 196 KB a table
  // at n_k = 16384, 25 MB a head), so one at a time they wait on the
  // memory. The chunk first draws every row's clusters and words, in each
  // row's stream order; a counting sort groups the draws by (sequence,
  // head, cluster); each group then resolves its keys against one table,
  // which stays in the core's cache while the group reads it; the keys go
  // back to their rows' slots. A draw's key is a function of its word and
  // its table alone, so the graph is the one draw() gives, row by row.
  void draw_chunk(int64_t r0, int64_t r1, ChunkBuffers& cb, RowBuffers& buf) const {
    const int64_t n = r1 - r0;
    cb.first.assign(n + 1, 0);
    cb.state.resize(n);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = P.seq[r % P.Nq];
      const bool grouped = degree[r] > 0 && P.ptr_k[g + 1] - P.ptr_k[g] >= kGroupedKeys;
      cb.first[r - r0 + 1] = cb.first[r - r0] + (grouped ? degree[r] : 0);
    }
    const int64_t T = cb.first[n];
    cb.runs.clear();
    if (T == 0) return;
    cb.code.resize(T);
    cb.word.resize(T);
    int32_t* code = cb.code.data();
    uint64_t* word = cb.word.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t0 = cb.first[r - r0], t1 = cb.first[r - r0 + 1];
      if (t1 == t0) continue;
      const int64_t h = r / P.Nq, i = r % P.Nq, g = P.seq[i];
      const int64_t nk = P.ptr_k[g + 1] - P.ptr_k[g], table = g * P.H + h;
      if (cb.runs.empty() || cb.runs.back() != table) cb.runs.push_back(table);
      const int64_t base = ((int64_t)cb.runs.size() - 1) * P.k;
      Rng rng(seed, r, sbm_pyg::kStreamDraws);
      const Clusters cl = clusters(h, g, P.w_row(h, i), nk, buf);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t v = pick(rng.uniform(), cl, buf);
        const uint64_t x = rng.next();
        if (v == P.k) {  // exploration: the key now, marked by its complement
          code[t] = ~(int32_t)mulhi(x, (uint64_t)nk);
        } else {
          code[t] = (int32_t)(base + v);
          word[t] = x;
        }
      }
      cb.state[r - r0] = rng.state;
    }
    // Counting sort of the draws by group.
    const int64_t groups = (int64_t)cb.runs.size() * P.k;
    cb.offset.assign(groups + 1, 0);
    for (int64_t t = 0; t < T; ++t)
      if (code[t] >= 0) ++cb.offset[code[t] + 1];
    for (int64_t b = 0; b < groups; ++b) cb.offset[b + 1] += cb.offset[b];
    cb.pos.assign(cb.offset.begin(), cb.offset.end() - 1);
    cb.group_word.resize(cb.offset[groups]);
    cb.group_slot.resize(cb.offset[groups]);
    for (int64_t t = 0; t < T; ++t) {
      if (code[t] < 0) {
        code[t] = ~code[t];
        continue;
      }
      const int64_t at = cb.pos[code[t]]++;
      cb.group_word[at] = word[t];
      cb.group_slot[at] = (int32_t)t;
    }
    // Each group's keys, in batches whose reads are prefetched together.
    for (int64_t b = 0; b < groups; ++b) {
      const int64_t x0 = cb.offset[b], x1 = cb.offset[b + 1];
      if (x1 == x0) continue;
      const int64_t table = cb.runs[b / P.k], v = b % P.k;
      const int64_t g = table / P.H, h = table % P.H;
      const uint64_t nk = (uint64_t)(P.ptr_k[g + 1] - P.ptr_k[g]);
      const size_t at = (size_t)(P.ptr_k[g] + (h * P.k + v) * P.Nk);
      const int64_t* cum = tables.cum.data() + at;
      const int32_t* guide = tables.guide.data() + at;
      const uint64_t total = (uint64_t)tables.total[table * P.k + v];
      int64_t j[kBatch];
      for (int64_t y0 = x0; y0 < x1; y0 += kBatch) {
        const int m = (int)std::min<int64_t>(kBatch, x1 - y0);
        const uint64_t* w = cb.group_word.data() + y0;
        for (int q = 0; q < m; ++q) __builtin_prefetch(guide + mulhi(w[q], nk));
        for (int q = 0; q < m; ++q) {
          j[q] = guide[mulhi(w[q], nk)];
          __builtin_prefetch(cum + j[q]);
        }
        for (int q = 0; q < m; ++q) {
          const uint64_t target = mulhi(w[q], total);
          while ((uint64_t)cum[j[q]] <= target) ++j[q];
          code[cb.group_slot[y0 + q]] = (int32_t)j[q];
        }
      }
    }
  }

  // Exact-mode thinning of the row's sorted distinct drawn keys (local, in
  // place): keeps key j with probability q(p) = min(p, 1) / (1 - exp(-c p)).
  // Since 1 - exp(-c p) <= c p, q >= 1 / c: a uniform below 1 / c keeps the
  // key without computing p (a squeeze; c is close to 1 for a sparse row,
  // so most keys never read their memberships).
  void thin(Rng& rng, const scalar_t* w, int64_t h, int64_t ks, double c,
            std::vector<int32_t>& keys, std::vector<double>& us) const {
    const size_t n = keys.size();
    // The row's uniforms first (the stream's order is unchanged), so that
    // the membership rows of the keys that need p, at random in Z, are
    // prefetched together instead of missing the cache one at a time.
    us.resize(n);
    for (size_t t = 0; t < n; ++t) us[t] = rng.uniform();
    const size_t row_bytes = (size_t)P.k * sizeof(scalar_t);
    for (size_t t = 0; t < n; ++t) {
      if (us[t] * c < 1.0) continue;
      const char* z = (const char*)P.z_row(ks + keys[t], h);
      for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(z + b);
    }
    // Compared by products, without divisions (the GPU kernel's division
    // calls made ptxas save registers on the stack).
    size_t kept = 0;
    for (size_t t = 0; t < n; ++t) {
      const double u = us[t];
      if (u * c >= 1.0) {
        const double p = dot(w, P.z_row(ks + keys[t], h), P.k) + P.delta;
        if (!(p > 0.0 && u * -std::expm1(-c * p) < std::min(p, 1.0)))
          continue;
      }
      keys[kept++] = keys[t];
    }
    keys.resize(kept);
  }

  // Sorted distinct forced keys (self-loop, included edges) of query i.
  void forced(int64_t i, int64_t ks, std::vector<int32_t>& extra) const {
    extra.clear();
    if (inc_ptr)  // sorted and distinct
      for (int64_t e = inc_ptr[i]; e < inc_ptr[i + 1]; ++e)
        extra.push_back((int32_t)(inc_col[e] - ks));
    if (self_loops) {
      const int32_t j = (int32_t)(i - ks);
      auto it = std::lower_bound(extra.begin(), extra.end(), j);
      if (it == extra.end() || *it != j) extra.insert(it, j);
    }
  }

  // Samples row r and appends its sorted distinct global keys to out;
  // drawn, where given, holds its draws as draw_chunk resolved them and
  // state its stream after them.
  void row(int64_t r, RowBuffers& buf, std::vector<int32_t>& out,
           const int32_t* drawn = nullptr, uint64_t state = 0) const {
    const int64_t h = r / P.Nq, i = r % P.Nq, g = P.seq[i];
    const int64_t ks = P.ptr_k[g], nk = P.ptr_k[g + 1] - ks;
    if (nk == 0) return;
    const scalar_t* w = P.w_row(h, i);
    const int64_t d = degree[r];
    Rng rng(seed, r, sbm_pyg::kStreamDraws);
    auto& keys = buf.keys;  // sorted distinct local keys
    keys.clear();
    if (d < 0) {
      dense_row(rng, h, w, ks, nk, keys);
    } else if (d > 0) {
      if (drawn != nullptr) {
        buf.list.assign(drawn, drawn + d);
        rng.state = state;
      } else {
        draw(rng, h, g, w, d, nk, buf);
      }
      const int64_t words = (nk + 63) >> 6;
      if (d * 16 < words) {  // few draws over many keys: sort them
        keys.assign(buf.list.begin(), buf.list.end());
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      } else {  // a bitmap over the sequence's keys
        auto& bits = buf.bits;
        bits.assign(words, 0);
        for (int32_t j : buf.list) bits[j >> 6] |= 1ULL << (j & 63);
        for (int64_t q = 0; q < words; ++q)
          for (uint64_t word = bits[q]; word; word &= word - 1)
            keys.push_back((int32_t)((q << 6) + __builtin_ctzll(word)));
      }
      if (P.exact) thin(rng, w, h, ks, inflation[r], keys, buf.uniforms);
    }
    forced(i, ks, buf.extra);
    if (buf.extra.empty()) {
      for (int32_t j : keys) out.push_back((int32_t)(ks + j));
      return;
    }
    // Merge the two sorted lists without duplicates.
    auto a = keys.begin(), b = buf.extra.begin();
    while (a != keys.end() || b != buf.extra.end()) {
      int32_t j;
      if (b == buf.extra.end() || (a != keys.end() && *a < *b)) {
        j = *a++;
      } else {
        if (a != keys.end() && *a == *b) ++a;
        j = *b++;
      }
      out.push_back((int32_t)(ks + j));
    }
  }

  // One Bernoulli per key of the sequence.
  void dense_row(Rng& rng, int64_t h, const scalar_t* w, int64_t ks,
                 int64_t nk, std::vector<int32_t>& keys) const {
    for (int64_t j = 0; j < nk; ++j) {
      const double p = dot(w, P.z_row(ks + j, h), P.k) + P.delta;
      const double prob = P.exact ? std::min(p, 1.0) : -std::expm1(-p);
      if (rng.uniform() < prob) keys.push_back((int32_t)j);
    }
  }
};

template <typename scalar_t>
sbm_pyg::SixTensors sample_impl(const Problem<scalar_t>& P,
                               const Tensor& degree_t,
                               const Tensor& inflation_t, bool self_loops,
                               const Tensor& inc_ptr, const Tensor& inc_col,
                               uint64_t seed, int64_t slots) {
  const int64_t R = P.H * P.Nq;
  const int64_t* degree = degree_t.data_ptr<int64_t>();
  bool any_draws = false;
  for (int64_t r = 0; r < R && !any_draws; ++r) any_draws = degree[r] > 0;
  KeyTables tables;
  if (any_draws) tables = build_tables(P);

  const bool has_inc = inc_ptr.numel() > 0;
  Sampler<scalar_t> S{P,
                      degree,
                      inflation_t.data_ptr<double>(),
                      tables,
                      has_inc ? inc_ptr.data_ptr<int64_t>() : nullptr,
                      has_inc ? inc_col.data_ptr<int64_t>() : nullptr,
                      self_loops,
                      seed};

  // Rows in chunks, scheduled dynamically (rows differ in cost); each chunk
  // appends to its own buffer, so no pre-sized scratch over all draws.
  const int nt = num_threads();
  int64_t draws = 0;
  for (int64_t r = 0; r < R; ++r) draws += std::max<int64_t>(degree[r], 0);
  // Chunks of about kChunkDraws draws, at least 4 a thread and at most 64.
  const int64_t chunk = std::max<int64_t>(
      std::max<int64_t>(1, R / (64 * (int64_t)nt)),
      std::min<int64_t>(R / (4 * (int64_t)nt), R * kChunkDraws / std::max<int64_t>(draws, 1)));
  const int64_t num_chunks = R == 0 ? 0 : (R + chunk - 1) / chunk;
  std::vector<std::vector<int32_t>> parts(num_chunks);
  Tensor counts = at::zeros({R + 1}, degree_t.options());
  int64_t* count = counts.data_ptr<int64_t>();
#pragma omp parallel num_threads(nt)
  {
    RowBuffers buf;
    ChunkBuffers cb;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < num_chunks; ++c) {
      auto& out = parts[c];
      const int64_t r0 = c * chunk, r1 = std::min(R, r0 + chunk);
      int64_t reserve = 0;
      for (int64_t r = r0; r < r1; ++r) reserve += std::max<int64_t>(degree[r], 0);
      out.reserve(reserve);
      S.draw_chunk(r0, r1, cb, buf);
      for (int64_t r = r0; r < r1; ++r) {
        const size_t before = out.size();
        const int64_t t = cb.first[r - r0];
        if (cb.first[r - r0 + 1] > t)
          S.row(r, buf, out, cb.code.data() + t, cb.state[r - r0]);
        else
          S.row(r, buf, out);
        count[r + 1] = (int64_t)(out.size() - before);
      }
      out.shrink_to_fit();
    }
  }
  tables = KeyTables();  // the tables are not read again: free them now
  Tensor rowptr64 = counts.cumsum(0);
  const int64_t* rp = rowptr64.data_ptr<int64_t>();
  const int64_t E = rp[R];
  // The graph is int32 CSR (4 bytes per edge and index): the Python side
  // refuses sizes past its range before sampling, this guards the raw op.
  // A padded call writes buffers of slots entries (the static route's
  // capacity-sized buffers: no copy to pad them afterwards); its caller has
  // emptied the rows that would not fit.
  const int64_t L = slots > 0 ? slots : E;  // the buffers' length
  TORCH_CHECK(E <= L, "fastrg_sample: ", E, " edges do not fit into ", L,
              " slots");
  TORCH_CHECK(L < (int64_t(1) << 31) && P.H * P.Nk < (int64_t(1) << 31) &&
                  R < (int64_t(1) << 31),
              "fastrg: at most 2^31 - 1 edges, rows and columns");
  auto opts = degree_t.options().dtype(at::kInt);
  Tensor rowptr = rowptr64.to(at::kInt);
  Tensor col_t = at::empty({L}, opts);
  int32_t* col = col_t.data_ptr<int32_t>();  // head * Nk + key
  // The row of each edge, written beside col in a padded call only (the
  // default route gathers it when it needs it).
  Tensor row_e = at::empty({slots > 0 ? L : 0}, opts);
  int32_t* re = slots > 0 ? row_e.data_ptr<int32_t>() : nullptr;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t r0 = c * chunk, r1 = std::min(R, r0 + chunk);
    const int32_t* src = parts[c].data();
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t offset = (int32_t)(r / P.Nq * P.Nk);
      for (int64_t e = rp[r]; e < rp[r + 1]; ++e) col[e] = offset + *src++;
      if (re != nullptr)
        for (int64_t e = rp[r]; e < rp[r + 1]; ++e) re[e] = (int32_t)r;
    }
    std::vector<int32_t>().swap(parts[c]);  // free as we go
  }
  parts.clear();
  // (head, key, query) order by a counting sort inside each (sequence,
  // head) block: its edges are contiguous in both orders, at the same
  // offsets, so blocks are independent. Two radix passes (coarse key
  // buckets, then keys within a bucket) keep the scatter's write streams
  // few enough for the caches and the TLB; the first pass writes to a
  // per-thread buffer of the block's size.
  // The rows in column order (row_t) are written beside perm, at the same
  // positions: the attention's column pass reads them, and gathering them
  // afterwards (row[perm]) costs a random read per edge (126 ms at
  // n = 16384, 5%, against about a fifth of that here).
  Tensor perm = at::empty({L}, opts);
  Tensor row_t = at::empty({L}, opts);
  Tensor colptr = at::empty({P.H * P.Nk + 1}, opts);
  int32_t* pm = perm.data_ptr<int32_t>();
  int32_t* rt = row_t.data_ptr<int32_t>();
  int32_t* cp = colptr.data_ptr<int32_t>();
  cp[P.H * P.Nk] = (int32_t)E;
  const int64_t blocks = P.G * P.H;
#pragma omp parallel num_threads(nt)
  {
    std::vector<int64_t> pos, coarse;
    sbm_pyg::HugeArray<int64_t> tmp;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t h = b / P.G, g = b % P.G;
      const int64_t ks = P.ptr_k[g], nk = P.ptr_k[g + 1] - ks;
      const int64_t first = h * P.Nk + ks;  // the block's first column
      const int64_t e0 = rp[h * P.Nq + P.ptr_q[g]];
      const int64_t e1 = rp[h * P.Nq + P.ptr_q[g + 1]];
      pos.assign(nk + 1, 0);
      for (int64_t e = e0; e < e1; ++e) ++pos[col[e] - first + 1];
      pos[0] = e0;
      for (int64_t j = 0; j < nk; ++j) pos[j + 1] += pos[j];
      for (int64_t j = 0; j < nk; ++j) cp[first + j] = (int32_t)pos[j];
      int shift = 0;  // coarse bucket = local key >> shift, at most 256
      while ((nk - 1) >> shift >= 256) ++shift;
      const int64_t r0 = h * P.Nq + P.ptr_q[g], r1 = h * P.Nq + P.ptr_q[g + 1];
      if (shift == 0) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t e = rp[r]; e < rp[r + 1]; ++e) {
            const int64_t at = pos[col[e] - first]++;
            pm[at] = (int32_t)e;
            rt[at] = (int32_t)r;
          }
        continue;
      }
      // Pass 1 stores (edge << shift) | (key within its bucket), so that
      // pass 2 reads no key at random.
      const int64_t nb = ((nk - 1) >> shift) + 1, mask = (1LL << shift) - 1;
      coarse.resize(nb + 1);
      for (int64_t c = 0; c <= nb; ++c)
        coarse[c] = pos[std::min(c << shift, nk)] - e0;
      tmp.resize(e1 - e0);
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t j = col[e] - first;
        tmp[coarse[j >> shift]++] = (e << shift) | (j & mask);
      }
      for (int64_t c = 0; c < nb; ++c) {
        const int64_t j0 = c << shift, j1 = std::min((c + 1) << shift, nk);
        const int64_t b0 = pos[j0] - e0, b1 = pos[j1] - e0;
        // Pass 1 kept the edge order within a bucket: its edges' rows only
        // increase, found by walking the row pointer (no row per edge
        // stored beside the radix buffer).
        int64_t r = r0;
        for (int64_t x = b0; x < b1; ++x) {
          const int64_t e = tmp[x] >> shift;
          while (rp[r + 1] <= e) ++r;
          const int64_t at = pos[j0 + (tmp[x] & mask)]++;
          pm[at] = (int32_t)e;
          rt[at] = (int32_t)r;
        }
      }
    }
  }
  // The padding: column and row 0, perm the identity (the static route's
  // convention).
  for (int64_t e = E; e < L; ++e) {
    col[e] = 0;
    rt[e] = 0;
    pm[e] = (int32_t)e;
    re[e] = 0;
  }
  return {rowptr, col_t, perm, colptr, row_t, row_e};
}

void check_inputs(const Tensor& W, const Tensor& Z, const Tensor& mass,
                  const Tensor& ptr_q, const Tensor& ptr_k) {
  TORCH_CHECK(W.device().is_cpu() && Z.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(W.dim() == 3 && Z.dim() == 3 && W.size(0) == Z.size(1) &&
                  W.size(2) == Z.size(2),
              "W must be [H, Nq, k] and Z [Nk, H, k]");
  TORCH_CHECK(W.scalar_type() == Z.scalar_type(), "W and Z dtypes differ");
  TORCH_CHECK(W.is_contiguous() && Z.is_contiguous() && mass.is_contiguous(),
              "contiguous inputs expected");
  TORCH_CHECK(mass.scalar_type() == at::kDouble, "mass must be float64");
  TORCH_CHECK(mass.dim() == 4 && mass.size(0) == 2 &&
                  mass.size(1) == ptr_q.numel() - 1 && mass.size(2) == W.size(0) &&
                  mass.size(3) == W.size(2),
              "mass must be [2, G, H, k]: the key clusters' sums and maxima");
  TORCH_CHECK(ptr_q.scalar_type() == at::kLong && ptr_k.scalar_type() == at::kLong,
              "pointers must be int64");
  TORCH_CHECK(Z.size(0) < (int64_t(1) << 31), "N_k must be below 2^31");
}

}  // namespace

namespace sbm_pyg {

FourTensors fastrg_plan(Tensor Y, Tensor W, Tensor Z, Tensor ptr_q,
                                Tensor ptr_k, double delta, bool exact,
                                int64_t seed, double threshold) {
  TORCH_CHECK(Y.is_contiguous() && Y.scalar_type() == W.scalar_type(),
              "Y must be contiguous in W's dtype");
  const int64_t G = ptr_q.numel() - 1, H = W.size(0), k = W.size(2);
  // The masses s_v and the maxima m_v, as mass[0] and mass[1].
  Tensor mass = at::empty({2, G, H, k}, W.options().dtype(at::kDouble));
  check_inputs(W, Z, mass, ptr_q, ptr_k);
  const int64_t R = H * W.size(1);
  Tensor degree = at::empty({R}, ptr_q.options());
  Tensor inflation = at::empty({R}, mass.options());
  Tensor stats = at::zeros({6}, mass.options());
  AT_DISPATCH_FLOATING_TYPES(W.scalar_type(), "fastrg_plan", [&] {
    double* st = stats.data_ptr<double>();
    st[4] = bad_values(Y.data_ptr<scalar_t>(), Y.numel());
    st[5] = bad_values(Z.data_ptr<scalar_t>(), Z.numel());
    key_masses(Z.data_ptr<scalar_t>(), ptr_k.data_ptr<int64_t>(), G, H, k,
               mass.data_ptr<double>(), mass.data_ptr<double>() + G * H * k);
    Problem<scalar_t> P(W, Z, mass, ptr_q, ptr_k, delta, exact);
    plan_rows(P, (uint64_t)seed, threshold,
              degree.data_ptr<int64_t>(), inflation.data_ptr<double>(), st);
  });
  return {degree, inflation, mass, stats};
}

SixTensors fastrg_sample(Tensor W, Tensor Z, Tensor mass, Tensor ptr_q,
                         Tensor ptr_k, double delta, bool exact, int64_t seed,
                         Tensor degree, Tensor inflation, bool self_loops,
                         Tensor inc_ptr, Tensor inc_col, int64_t /*capacity*/,
                         int64_t slots) {
  check_inputs(W, Z, mass, ptr_q, ptr_k);
  TORCH_CHECK(slots >= 0, "fastrg_sample: slots must be >= 0");
  sbm_pyg::SixTensors out;
  AT_DISPATCH_FLOATING_TYPES(W.scalar_type(), "fastrg_sample", [&] {
    Problem<scalar_t> P(W, Z, mass, ptr_q, ptr_k, delta, exact);
    out = sample_impl(P, degree, inflation, self_loops, inc_ptr, inc_col,
                      (uint64_t)seed, slots);
  });
  return out;
}

}  // namespace sbm_pyg
