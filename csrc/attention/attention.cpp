// Fused sparse attention for sbm_pyg (CPU).
//
// The sampled graph of all heads and sequences is one block-diagonal CSR
// matrix [R, C] (rows = (head, query), columns = (head, key)) in int32 CSR;
// row_t lists the row of each edge in (column, row) order and colptr points
// into it.
//
// Forward, per row r with edges e = (r, c):
//   s_e = scale <q_r, k_c>,  alpha_e = softmax_e(s_e),  out_r = sum alpha_e v_c
// The scores are written into alpha [E] when the weights are asked for, else
// into per-thread scratch, and normalized in place while the row is in
// cache; backward keeps only
// out and each row's log-sum-exp lse_r: nothing per edge.
//
// Backward recomputes alpha_e = exp(s_e - lse_r), as FlashAttention does,
// in a pass over the rows and one over the columns (through row_t):
//   t_e  = <dout_r, v_c>,  delta_r = <dout_r, out_r>,  ds_e = alpha_e (t_e - delta_r)
//   g_e  = ds_e * s_e (paper) or clip(ds_e, -1, 1) (published)   = dL/dp_e
//   rows:    dq_r = scale sum ds_e k_c,     d(Q̂Ŝ)_r = sum g_e K̂_c
//   columns: dk_c = scale sum ds_e q_r,     dv_c = sum alpha_e dout_r,
//            dK̂_c = sum g_e (Q̂Ŝ)_r
// Under dropout each weight is multiplied by keep_e, 0 or 1 / (1 - p), a
// function of the seed and (r, c) (sampler/stream.h, purpose 2) that both
// passes recompute: out_r = sum alpha_e keep_e v_c, t_e = keep_e <dout_r,
// v_c>, dv_c = sum alpha_e keep_e dout_r; delta_r = <dout_r, out_r> holds
// as it is (FlashAttention's dropout).
// Every output row is written by one thread in a fixed order: no atomics,
// and the result does not depend on the thread count.
//
// Speed: the scores of a row are computed eight edges at a time with one
// shared horizontal reduction (AVX2 + FMA, float32), head sizes 16-128 are
// compiled as constants so that the accumulators stay in registers, the
// exponential is a vectorizable polynomial, and the gathered key rows are
// prefetched a few edges ahead.
#include "attention/attention.h"

#include "attention/exp.h"
#include "sampler/stream.h"
#include "simd.h"

#include <ATen/Parallel.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

using at::Tensor;
using sbm_pyg::exp_shifted;

namespace {

// ---------------------------------------------------------------------------
// Vector helpers. N > 0 is the length known at compile time (the head size
// of the specialized kernels: fully unrolled, accumulators in registers);
// N = 0 takes the runtime length n.

template <int N>
SBM_INLINE int64_t len(int64_t n) {
  return N > 0 ? N : n;
}

template <int N, typename T>
SBM_INLINE T dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < len<N>(n); ++d) acc += a[d] * b[d];
  return acc;
}

// y += alpha * x
template <typename T>
SBM_INLINE void axpy(T alpha, const T* __restrict x, T* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

template <typename T>
SBM_INLINE void fill(T* __restrict y, T value, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] = value;
}

// A row accumulator sum_e a_e x_e over one row's edges, written to out by
// store(). For a compile-time length N it lives in vector registers;
// otherwise it accumulates in out directly.
template <typename T, int N>
struct Acc {
  T x[N];
  T* out;
  SBM_INLINE Acc(T* out_, int64_t) : out(out_) { fill(x, T(0), N); }
  SBM_INLINE void add(T a, const T* __restrict p) {
#pragma omp simd
    for (int d = 0; d < N; ++d) x[d] += a * p[d];
  }
  SBM_INLINE void store() { std::memcpy(out, x, N * sizeof(T)); }
};

template <typename T>
struct Acc<T, 0> {
  T* out;
  int64_t n;
  SBM_INLINE Acc(T* out_, int64_t n_) : out(out_), n(n_) { fill(out, T(0), n); }
  SBM_INLINE void add(T a, const T* __restrict p) { axpy(a, p, out, n); }
  SBM_INLINE void store() {}
};

// Per-thread scratch for one row's (or column's) edges.
template <typename T>
struct Scratch {
  std::vector<T> s, w, t;
  void reserve(int64_t n) {
    if ((int64_t)s.size() < n) {
      s.resize(n);
      w.resize(n);
      t.resize(n);
    }
  }
};

// Brings the row at p (bytes long) towards the cache ahead of its use: the
// kernels gather one key (or query) row per edge, at random.
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(static_cast<const char*>(p) + off);
}

// How many edges ahead the gathers are prefetched.
constexpr int64_t kAhead = 8;

// out = sum_e g_e x_e over rows x_e = base + idx[e] * K (the membership
// gradients: K = k values per edge, 512 bytes at k = 128 in float32). The
// sums run tile by tile, each tile's accumulators in registers over all the
// edges, where an axpy per edge would load and store all K outputs for
// every edge (the stores bounded the loop). The first tile's pass
// prefetches each whole row kAhead edges ahead, so that the later tiles
// read it from the cache. Each output is summed in edge order, as the
// axpys did; edges with g_e = 0 add nothing.
template <typename T>
SBM_INLINE void weighted_sum(const T* __restrict g, const int32_t* __restrict idx,
                             int64_t n, const T* __restrict base, int64_t K,
                             T* __restrict out) {
  constexpr int64_t kTile = 32;
  const int64_t row_bytes = K * (int64_t)sizeof(T);
  int64_t v0 = 0;
  for (; v0 + kTile <= K; v0 += kTile) {
    T acc[kTile];
    fill(acc, T(0), kTile);
    for (int64_t e = 0; e < n; ++e) {
      if (v0 == 0 && e + kAhead < n)
        prefetch(base + idx[e + kAhead] * K, row_bytes);
      const T ge = g[e];
      if (ge == T(0)) continue;
      const T* __restrict x = base + idx[e] * K + v0;
#pragma omp simd
      for (int64_t d = 0; d < kTile; ++d) acc[d] += ge * x[d];
    }
    std::memcpy(out + v0, acc, sizeof(acc));
  }
  if (v0 == K) return;
  fill(out + v0, T(0), K - v0);
  for (int64_t e = 0; e < n; ++e)
    if (g[e] != T(0)) axpy(g[e], base + idx[e] * K + v0, out + v0, K - v0);
}

#if defined(__GNUC__) && defined(__x86_64__)
// Eight float32 dot products <x, base + idx[e] * N> at a time: each edge's
// products accumulate in one register, and the eight horizontal sums share
// one transpose-and-add (hadd) tree instead of one reduction per edge.
template <int N>
SBM_AVX2_FMA inline void dots_avx2(const float* __restrict x,
                                   const float* __restrict base,
                                   const int32_t* __restrict idx,
                                   int64_t count, float scale,
                                   float* __restrict out) {
  constexpr int V = N / 8;
  __m256 xv[V];
  for (int c = 0; c < V; ++c) xv[c] = _mm256_loadu_ps(x + 8 * c);
  const __m256 sv = _mm256_set1_ps(scale);
  int64_t e = 0;
  for (; e + 8 <= count; e += 8) {
    for (int j = 0; j < 8 && e + 8 + j < count; ++j)
      prefetch(base + (int64_t)idx[e + 8 + j] * N, N * sizeof(float));
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) {
      const float* p = base + (int64_t)idx[e + j] * N;
      __m256 a = _mm256_mul_ps(xv[0], _mm256_loadu_ps(p));
      for (int c = 1; c < V; ++c)
        a = _mm256_fmadd_ps(xv[c], _mm256_loadu_ps(p + 8 * c), a);
      acc[j] = a;
    }
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
                                     _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
                                     _mm256_hadd_ps(acc[6], acc[7]));
    // t0 = [e0..e3 of the low halves, e0..e3 of the high halves], t1 the
    // same for e4..e7: add the halves.
    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                                     _mm256_permute2f128_ps(t0, t1, 0x31));
    _mm256_storeu_ps(out + e, _mm256_mul_ps(sum, sv));
  }
  for (; e < count; ++e) out[e] = scale * dot<N>(x, base + (int64_t)idx[e] * N, N);
}
#endif

// out[e] = scale * <x, base + idx[e] * n> for e < count: one row's (or
// column's) scores. AVX: whether the caller was compiled for AVX2 + FMA.
template <typename T, int N, bool AVX>
SBM_INLINE void dots(const T* __restrict x, const T* __restrict base,
                     const int32_t* __restrict idx, int64_t count, int64_t n,
                     T scale, T* __restrict out) {
#if defined(__GNUC__) && defined(__x86_64__)
  if constexpr (AVX && std::is_same_v<T, float> && N > 0 && N % 8 == 0 &&
                N <= 64) {
    dots_avx2<N>(x, base, idx, count, scale, out);
    return;
  }
#endif
  const int64_t D = len<N>(n);
  for (int64_t e = 0; e < count; ++e) {
    if (e + kAhead < count) prefetch(base + (int64_t)idx[e + kAhead] * D, D * sizeof(T));
    out[e] = scale * dot<N>(x, base + (int64_t)idx[e] * D, D);
  }
}

// ---------------------------------------------------------------------------
// Work split: row ranges of about equal cost (edges + rows), taken
// dynamically, so that a dense head and a sparse one keep both threads busy.

std::vector<int64_t> chunks(const int32_t* ptr, int64_t rows) {
  const int64_t cost = ptr[rows] - ptr[0] + rows;
  const int threads = std::max(1, at::get_num_threads());
  // Small problems run on one thread: the fork costs more than the work.
  const int64_t n = cost < 32768 ? 1 : std::min<int64_t>(16 * threads, rows);
  std::vector<int64_t> bounds(n + 1, rows);
  bounds[0] = 0;
  for (int64_t c = 1; c < n; ++c) {
    const int64_t want = cost * c / n;
    // ptr[r] - ptr[0] + r is increasing in r: the first row at that cost.
    int64_t lo = bounds[c - 1], hi = rows;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (ptr[mid] - ptr[0] + mid < want) lo = mid + 1; else hi = mid;
    }
    bounds[c] = lo;
  }
  return bounds;
}

template <typename F>
void for_chunks(const std::vector<int64_t>& bounds, const F& body) {
  const int64_t n = (int64_t)bounds.size() - 1;
  if (n == 1) {
    body(bounds[0], bounds[1]);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) \
    num_threads(std::max(1, at::get_num_threads()))
  for (int64_t c = 0; c < n; ++c) body(bounds[c], bounds[c + 1]);
}

// ---------------------------------------------------------------------------
// Kernels, written once as templates over the dtype T and the compile-time
// head size N (0: any), instantiated in functions that simd.h clones per
// instruction set.

template <typename T>
struct Args {
  const int32_t *rowptr, *col, *colptr;  // int32 CSR
  const T *q, *k, *v;     // [R, D], [C, D], [C, Dv]
  const T *out, *lse;     // forward outputs, read by backward
  const T *dout, *qb, *km;  // qb [R, K], km [C, K]: null without SBM
  const T* glse;  // dL/d lse [R] (a sink's): null where none
  T *o, *alpha, *lse_out;   // forward outputs
  T *dq, *dk, *dv, *dprob, *dqb, *dkm, *delta;  // backward outputs, scratch
  const int32_t* row_t;     // row of each edge in column order (backward)
  int64_t D, Dv, K;
  T scale;
  int64_t ste;
  // Dropout (threshold 0: off): row r's stream state, the threshold, and
  // the factor of a kept weight.
  uint64_t dseed, dthreshold;
  T dscale;
  SBM_INLINE uint64_t dstate(int64_t r) const {
    return sbm_pyg::Rng(dseed, r, sbm_pyg::kStreamDropout).state;
  }
  // The factor of edge (r, c)'s weight: 1 without dropout, else 0 or dscale.
  SBM_INLINE T keep(uint64_t state, int64_t c) const {
    if (dthreshold == 0) return T(1);
    return sbm_pyg::dropout_keep(state, c, dthreshold) ? dscale : T(0);
  }
};

template <typename T, int N, bool AVX>
SBM_INLINE void forward_rows_impl(const Args<T>& a, Scratch<T>& sc, int64_t r0,
                                  int64_t r1) {
  const int64_t D = len<N>(a.D), Dv = len<N>(a.Dv);
  const int32_t* __restrict col = a.col;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t e0 = a.rowptr[r], e1 = a.rowptr[r + 1], n = e1 - e0;
    if (n == 0) {  // no key: the output is zero
      fill(a.o + r * Dv, T(0), Dv);
      a.lse_out[r] = -std::numeric_limits<T>::infinity();
      continue;
    }
    // The weights go to alpha when asked for, else to the thread's scratch.
    if (!a.alpha) sc.reserve(n);
    T* __restrict w = a.alpha ? a.alpha + e0 : sc.s.data();
    dots<T, N, AVX>(a.q + r * D, a.k, col + e0, n, D, a.scale, w);
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t e = 0; e < n; ++e) m = std::max(m, w[e]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t e = 0; e < n; ++e) {
      w[e] = exp_shifted(w[e] - m);
      sum += w[e];
    }
    const T inv = T(1) / sum;
    Acc<T, N> out(a.o + r * Dv, Dv);
    const uint64_t st = a.dthreshold ? a.dstate(r) : 0;
    for (int64_t e = 0; e < n; ++e) {
      if (e + kAhead < n) prefetch(a.v + col[e0 + e + kAhead] * Dv, Dv * sizeof(T));
      w[e] *= inv;
      out.add(w[e] * a.keep(st, col[e0 + e]), a.v + col[e0 + e] * Dv);
    }
    out.store();
    a.lse_out[r] = m + std::log(sum);
  }
}

// The estimator's dL/dp from dL/ds and the score.
template <typename T>
SBM_INLINE T ste_grad(int64_t ste, T ds, T s) {
  if (ste == sbm_pyg::kStePaper) return ds * s;
  if (ste == sbm_pyg::kStePublished) return std::min(T(1), std::max(T(-1), ds));
  return T(0);
}

// Pass 1: rows. Recomputes each edge's weight from the row's log-sum-exp
// (nothing per edge was kept) and writes dq, delta_r = <dout_r, out_r>,
// dL/dp in edge order and the query-side membership gradient.
template <typename T, int N, bool AVX>
SBM_INLINE void backward_rows_impl(const Args<T>& a, Scratch<T>& sc,
                                   int64_t r0, int64_t r1) {
  const int64_t D = len<N>(a.D), Dv = len<N>(a.Dv), K = a.K;
  const T scale = a.scale;
  const int64_t ste = a.ste;
  const int32_t* __restrict col = a.col;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t e0 = a.rowptr[r], n = a.rowptr[r + 1] - e0;
    T* dqb = a.dqb ? a.dqb + r * K : nullptr;
    if (dqb) fill(dqb, T(0), K);
    const T* dout = a.dout + r * Dv;
    // With a gradient of the log-sum-exp (an attention sink's), ds_e =
    // alpha_e (t_e - delta_r + dL/dlse_r): it joins delta.
    const T delta = dot<N>(dout, a.out + r * Dv, Dv) - (a.glse ? a.glse[r] : T(0));
    a.delta[r] = delta;
    Acc<T, N> dq(a.dq + r * D, D);
    if (n == 0) {
      dq.store();
      continue;
    }
    sc.reserve(n);
    T* __restrict s = sc.s.data();
    T* __restrict w = sc.w.data();
    T* __restrict t = sc.t.data();
    dots<T, N, AVX>(a.q + r * D, a.k, col + e0, n, D, scale, s);
    dots<T, N, AVX>(dout, a.v, col + e0, n, Dv, T(1), t);
    const T lse = a.lse[r];
#pragma omp simd
    for (int64_t e = 0; e < n; ++e) w[e] = exp_shifted(s[e] - lse);
    if (a.dthreshold) {  // dL/d alpha_e = keep_e <dout_r, v_c>
      const uint64_t st = a.dstate(r);
      for (int64_t e = 0; e < n; ++e) t[e] *= a.keep(st, col[e0 + e]);
    }
    for (int64_t e = 0; e < n; ++e) {
      const int64_t c = col[e0 + e];
      const T ds = w[e] * (t[e] - delta);
      dq.add(scale * ds, a.k + c * D);
      const T g = ste_grad(ste, ds, s[e]);
      if (a.dprob) a.dprob[e0 + e] = g;
      s[e] = g;  // the score is not read again
    }
    dq.store();
    if (dqb) weighted_sum(s, col + e0, n, a.km, K, dqb);
  }
}

// Pass 2: columns, over the transposed CSR: dk, dv and the key-side
// membership gradient, recomputing each edge from its row's log-sum-exp
// and delta.
template <typename T, int N, bool AVX>
SBM_INLINE void backward_cols_impl(const Args<T>& a, Scratch<T>& sc,
                                   int64_t c0, int64_t c1) {
  const int64_t D = len<N>(a.D), Dv = len<N>(a.Dv), K = a.K;
  const T scale = a.scale;
  const int64_t ste = a.ste;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t t0 = a.colptr[c], n = a.colptr[c + 1] - t0;
    T* dkm = a.dkm ? a.dkm + c * K : nullptr;
    if (dkm) fill(dkm, T(0), K);
    Acc<T, N> dk(a.dk + c * D, D), dv(a.dv + c * Dv, Dv);
    if (n == 0) {
      dk.store();
      dv.store();
      continue;
    }
    sc.reserve(n);
    T* __restrict s = sc.s.data();
    T* __restrict w = sc.w.data();
    T* __restrict t = sc.t.data();
    const int32_t* __restrict rows = a.row_t + t0;
    dots<T, N, AVX>(a.k + c * D, a.q, rows, n, D, scale, s);
    dots<T, N, AVX>(a.v + c * Dv, a.dout, rows, n, Dv, T(1), t);
    for (int64_t i = 0; i < n; ++i) w[i] = a.lse[rows[i]];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) w[i] = exp_shifted(s[i] - w[i]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      const T kept = a.dthreshold ? a.keep(a.dstate(r), c) : T(1);
      const T ds = w[i] * (kept * t[i] - a.delta[r]);
      dv.add(kept * w[i], a.dout + r * Dv);
      dk.add(scale * ds, a.q + r * D);
      s[i] = ste_grad(ste, ds, s[i]);  // the score is not read again
    }
    dk.store();
    dv.store();
    if (dkm) weighted_sum(s, rows, n, a.qb, K, dkm);
  }
}

// Calls IMPL<T, N> with N the head size where the kernels are specialized
// for it (D = Dv in 16, 32, 64, 128), else N = 0.
#define SBM_HEAD_SWITCH(T, AVX, IMPL, ...)                \
  if (a.D == a.Dv) {                                      \
    switch (a.D) {                                        \
      case 16: return IMPL<T, 16, AVX>(__VA_ARGS__);      \
      case 32: return IMPL<T, 32, AVX>(__VA_ARGS__);      \
      case 64: return IMPL<T, 64, AVX>(__VA_ARGS__);      \
      case 128: return IMPL<T, 128, AVX>(__VA_ARGS__);    \
      default: break;                                     \
    }                                                     \
  }                                                       \
  return IMPL<T, 0, AVX>(__VA_ARGS__);

// The entries: each compiled twice, for AVX2 with FMA and for the baseline
// (simd.h), with the specialized loops inlined into both; the CPU picks.
#define SBM_ENTRY(NAME, IMPL)                                                \
  template <typename T>                                                     \
  SBM_AVX2_FMA void NAME##_avx2(const Args<T>& a, int64_t i0, int64_t i1) {  \
    Scratch<T> sc;                                                          \
    SBM_HEAD_SWITCH(T, true, IMPL, a, sc, i0, i1)                           \
  }                                                                         \
  template <typename T>                                                     \
  void NAME##_base(const Args<T>& a, int64_t i0, int64_t i1) {              \
    Scratch<T> sc;                                                          \
    SBM_HEAD_SWITCH(T, false, IMPL, a, sc, i0, i1)                          \
  }                                                                         \
  template <typename T>                                                     \
  void NAME(const Args<T>& a, int64_t i0, int64_t i1) {                     \
    if (sbm_cpu_has_avx2_fma()) {                                           \
      NAME##_avx2(a, i0, i1);                                               \
    } else {                                                                \
      NAME##_base(a, i0, i1);                                               \
    }                                                                       \
  }

SBM_ENTRY(forward_rows, forward_rows_impl)
SBM_ENTRY(backward_rows, backward_rows_impl)
SBM_ENTRY(backward_cols, backward_cols_impl)

// ---------------------------------------------------------------------------
// Checks: the Python side validates user input; these catch misuse of the
// raw ops.

void check_graph(const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
                 const Tensor& row_t, const Tensor& q, const Tensor& k,
                 const Tensor& v) {
  for (const Tensor* t : {&rowptr, &col, &colptr, &row_t}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kInt &&
                    t->dim() == 1 && t->is_contiguous(),
                "sbm_pyg::sparse_attention: the CSR tensors must be "
                "contiguous 1-D int32 CPU tensors");
  }
  for (const Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 2 && t->is_contiguous() &&
                    t->scalar_type() == q.scalar_type(),
                "sbm_pyg::sparse_attention: q, k, v must be contiguous 2-D "
                "CPU tensors of one dtype");
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "sbm_pyg::sparse_attention: float32 or float64 expected, got ",
              q.scalar_type());
  TORCH_CHECK(rowptr.numel() == q.size(0) + 1 && colptr.numel() == k.size(0) + 1,
              "sbm_pyg::sparse_attention: rowptr must have R + 1 and colptr "
              "C + 1 entries");
  TORCH_CHECK(col.numel() == row_t.numel(),
              "sbm_pyg::sparse_attention: col and row_t differ in length");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(0) == k.size(0),
              "sbm_pyg::sparse_attention: q [R, D], k [C, D], v [C, D_v] "
              "expected");
  TORCH_CHECK(q.size(0) < (int64_t(1) << 31),
              "sbm_pyg::sparse_attention: at most 2^31 rows");
}

bool check_memberships(const std::optional<Tensor>& q_block,
                       const std::optional<Tensor>& k_memb, const Tensor& q,
                       const Tensor& k) {
  const bool has_q = q_block.has_value() && q_block->defined();
  const bool has_k = k_memb.has_value() && k_memb->defined();
  TORCH_CHECK(has_q == has_k,
              "sbm_pyg::sparse_attention: give both q_block and k_memb or "
              "neither");
  if (!has_q) return false;
  TORCH_CHECK(q_block->dim() == 2 && k_memb->dim() == 2 &&
                  q_block->size(0) == q.size(0) &&
                  k_memb->size(0) == k.size(0) &&
                  q_block->size(1) == k_memb->size(1),
              "sbm_pyg::sparse_attention: q_block [R, K] and k_memb [C, K] "
              "expected");
  TORCH_CHECK(q_block->is_contiguous() && k_memb->is_contiguous() &&
                  q_block->scalar_type() == q.scalar_type() &&
                  k_memb->scalar_type() == q.scalar_type(),
              "sbm_pyg::sparse_attention: q_block and k_memb must be "
              "contiguous, in q's dtype");
  return true;
}

// The graph, q, k, v and scale, which both passes read.
template <typename T>
Args<T> graph_args(const Tensor& rowptr, const Tensor& col,
                   const Tensor& colptr, const Tensor& row_t, const Tensor& q,
                   const Tensor& k, const Tensor& v, double scale,
                   int64_t dropout_seed, int64_t dropout_threshold) {
  TORCH_CHECK(dropout_threshold >= 0 && dropout_threshold < (int64_t(1) << 53),
              "sbm_pyg::sparse_attention: dropout_threshold must lie in "
              "[0, 2^53)");
  Args<T> a{};
  a.dseed = (uint64_t)dropout_seed;
  a.dthreshold = (uint64_t)dropout_threshold;
  // 2^53 / (2^53 - t): the inverse of the probability of keeping.
  a.dscale = (T)(0x1p53 / (double)((int64_t(1) << 53) - dropout_threshold));
  a.rowptr = rowptr.data_ptr<int32_t>();
  a.col = col.data_ptr<int32_t>();
  a.colptr = colptr.data_ptr<int32_t>();
  a.row_t = row_t.data_ptr<int32_t>();
  a.q = q.data_ptr<T>();
  a.k = k.data_ptr<T>();
  a.v = v.data_ptr<T>();
  a.D = q.size(1);
  a.Dv = v.size(1);
  a.scale = (T)scale;
  return a;
}

}  // namespace

namespace sbm_pyg {

std::tuple<Tensor, Tensor, Tensor> sparse_attention(
    const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
    const Tensor& row_t, const Tensor& q, const Tensor& k, const Tensor& v,
    const std::optional<Tensor>& edge_prob,
    const std::optional<Tensor>& q_block, const std::optional<Tensor>& k_memb,
    double scale, int64_t ste, bool weights,
    const std::optional<Tensor>& dropout_seed, int64_t dropout_threshold) {
  (void)edge_prob;
  (void)ste;
  check_graph(rowptr, col, colptr, row_t, q, k, v);
  check_memberships(q_block, k_memb, q, k);
  const int64_t R = q.size(0), E = col.numel();
  Tensor out = at::empty({R, v.size(1)}, v.options());
  Tensor alpha = at::empty({weights ? E : 0}, q.options());
  Tensor lse = at::empty({R}, q.options());
  const auto bounds = chunks(rowptr.data_ptr<int32_t>(), R);
  const int64_t seed = seed_value(dropout_seed, dropout_threshold > 0,
                                  "sbm_pyg::sparse_attention", "dropout_seed");
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sparse_attention", [&] {
    using T = scalar_t;
    Args<T> a = graph_args<T>(rowptr, col, colptr, row_t, q, k, v, scale,
                              seed, dropout_threshold);
    a.o = out.data_ptr<T>();
    a.alpha = weights ? alpha.data_ptr<T>() : nullptr;
    a.lse_out = lse.data_ptr<T>();
    for_chunks(bounds, [&](int64_t r0, int64_t r1) { forward_rows(a, r0, r1); });
  });
  return {out, alpha, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
sparse_attention_backward(const Tensor& rowptr, const Tensor& col,
                          const Tensor& colptr, const Tensor& row_t,
                          const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse,
                          const Tensor& grad_out,
                          const std::optional<Tensor>& q_block,
                          const std::optional<Tensor>& k_memb, double scale,
                          int64_t ste,
                          const std::optional<Tensor>& dropout_seed,
                          int64_t dropout_threshold,
                          const std::optional<Tensor>& grad_lse) {
  check_graph(rowptr, col, colptr, row_t, q, k, v);
  const bool memb = check_memberships(q_block, k_memb, q, k);
  TORCH_CHECK(ste == kSteNone || ste == kStePaper || ste == kStePublished,
              "sbm_pyg::sparse_attention_backward: unknown ste code ", ste);
  TORCH_CHECK(!memb || ste != kSteNone,
              "sbm_pyg::sparse_attention_backward: memberships need an "
              "estimator");
  const int64_t R = q.size(0), C = k.size(0), E = col.numel();
  for (const Tensor* t : {&out, &grad_out}) {
    TORCH_CHECK(t->sizes() == at::IntArrayRef({R, v.size(1)}) &&
                    t->is_contiguous() && t->scalar_type() == q.scalar_type(),
                "sbm_pyg::sparse_attention_backward: out and grad_out must "
                "be contiguous [R, D_v] in q's dtype");
  }
  TORCH_CHECK(lse.numel() == R && lse.is_contiguous() &&
                  lse.scalar_type() == q.scalar_type(),
              "sbm_pyg::sparse_attention_backward: lse must be [R] in q's "
              "dtype");
  TORCH_CHECK(!grad_lse || (grad_lse->numel() == R && grad_lse->is_contiguous() &&
                            grad_lse->scalar_type() == q.scalar_type()),
              "sbm_pyg::sparse_attention_backward: grad_lse must be [R] in "
              "q's dtype");
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  Tensor dprob = at::empty({ste != kSteNone && !memb ? E : 0}, q.options());
  Tensor dqb = memb ? at::empty_like(*q_block) : at::empty({0}, q.options());
  Tensor dkm = memb ? at::empty_like(*k_memb) : at::empty({0}, q.options());
  Tensor delta = at::empty({R}, q.options());
  const auto row_bounds = chunks(rowptr.data_ptr<int32_t>(), R);
  const auto col_bounds = chunks(colptr.data_ptr<int32_t>(), C);
  const int64_t seed =
      seed_value(dropout_seed, dropout_threshold > 0,
                 "sbm_pyg::sparse_attention_backward", "dropout_seed");
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sparse_attention_backward", [&] {
    using T = scalar_t;
    Args<T> a = graph_args<T>(rowptr, col, colptr, row_t, q, k, v, scale,
                              seed, dropout_threshold);
    a.out = out.data_ptr<T>();
    a.lse = lse.data_ptr<T>();
    a.dout = grad_out.data_ptr<T>();
    a.glse = grad_lse ? grad_lse->data_ptr<T>() : nullptr;
    a.qb = memb ? q_block->data_ptr<T>() : nullptr;
    a.km = memb ? k_memb->data_ptr<T>() : nullptr;
    a.dq = dq.data_ptr<T>();
    a.dk = dk.data_ptr<T>();
    a.dv = dv.data_ptr<T>();
    a.dprob = dprob.numel() ? dprob.data_ptr<T>() : nullptr;
    a.dqb = memb ? dqb.data_ptr<T>() : nullptr;
    a.dkm = memb ? dkm.data_ptr<T>() : nullptr;
    a.delta = delta.data_ptr<T>();
    a.K = memb ? q_block->size(1) : 0;
    a.ste = ste;
    for_chunks(row_bounds, [&](int64_t r0, int64_t r1) { backward_rows(a, r0, r1); });
    for_chunks(col_bounds, [&](int64_t c0, int64_t c1) { backward_cols(a, c0, c1); });
  });
  return {dq, dk, dv, dprob, dqb, dkm};
}

}  // namespace sbm_pyg
