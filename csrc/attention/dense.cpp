// Dense-regime SBM attention for sbm_pyg (CPU).
//
// For a (sequence, head) whose sampled graph is dense, the graph is never
// built: per block of query rows,
//
//   P = (Q̂Ŝ)_blk K̂ᵀ,  S = scale Q_blk Kᵀ                       (matrix products)
//   m_ij ~ Bernoulli(min(P_ij + δ, 1)) (exact) or 1 - exp(-(P_ij + δ)) (poisson)
//   A = softmax over the row's sampled keys of S,  out_blk = A V
//
// The trials read each row's sampler stream (sampler/stream.h) at the
// counters a dense row of the fastRG sampler reads, key by key, so the two
// paths draw the same distribution (and, up to rounding in p, the same
// graph). Self-loops and the included pairs are added as the sampler adds
// them. The mask is kept as one bit per (query, key) of a sequence, 1/32 of
// a float32 score matrix; backward recomputes S and A from it and the
// row's log-sum-exp, as FlashAttention does:
//
//   dA = dOut_blk Vᵀ,  ds = A ∘ (dA - rowsum(dOut ∘ out)),
//   g = ds ∘ s (paper) or clip(ds, -1, 1) (published) on sampled pairs,
//   dQ = scale ds K,  dK += scale dsᵀ Q,  dV += Aᵀ dOut,
//   d(Q̂Ŝ) = g K̂,  dK̂ += gᵀ (Q̂Ŝ).
//
// Every product is a BLAS call on a [rows, keys] tile; the elementwise work
// (trials, masking, softmax, estimator) is a few passes over each row,
// written to vectorize and compiled for AVX2 with FMA beside the baseline
// (the trials read the stream by counter, the mask as a byte per key before
// it is packed; at n = 2048 this halved the forward and backward's time).
// Many (sequence, head) pairs run in parallel, each on one thread in a
// fixed order; few run one after the other with parallel products and row
// passes. Every output row is written by one thread: no atomics.
#include "attention/dense.h"

#include "attention/attention.h"
#include "attention/exp.h"
#include "sampler/stream.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using at::Tensor;

namespace {

// Query rows per tile: the [rows, keys] tiles stay a few MB at n = 4096
// (256 rows took 330 ms forward and backward at n = 2048, 128 rows 341).
constexpr int64_t kBlockRows = 256;

inline int64_t row_bytes(int64_t nk) { return (nk + 7) >> 3; }

// Where each sequence's rows of mask bits start: (g, h, i) at
// base[g] + (h * nq_g + i) * row_bytes(nk_g).
std::vector<int64_t> mask_base(const int64_t* ptr_q, const int64_t* ptr_k,
                               int64_t G, int64_t H) {
  std::vector<int64_t> base(G + 1, 0);
  for (int64_t g = 0; g < G; ++g)
    base[g + 1] = base[g] + H * (ptr_q[g + 1] - ptr_q[g]) *
                                row_bytes(ptr_k[g + 1] - ptr_k[g]);
  return base;
}

struct Shape {
  const int64_t* ptr_q;
  const int64_t* ptr_k;
  int64_t G, H, Nq, Nk;
  std::vector<int64_t> base;
  Shape(const Tensor& ptr_q_, const Tensor& ptr_k_, int64_t H_, int64_t R,
        int64_t C)
      : ptr_q(ptr_q_.data_ptr<int64_t>()), ptr_k(ptr_k_.data_ptr<int64_t>()),
        G(ptr_q_.numel() - 1), H(H_), Nq(R / H_), Nk(C / H_),
        base(mask_base(ptr_q, ptr_k, G, H)) {}
};

// Runs fn(g, h) for every pair. With many pairs (a batch of sequences),
// in parallel over pairs, each pair on one thread (its products and row
// passes then run inline); with few, one pair after the other, each product
// and row pass parallel itself: measured at n = 2048, H = 2 on 2 threads,
// forward and backward took 330 ms over pairs against 220 ms within them.
template <typename Fn>
void for_each_pair(const Shape& sh, const Fn& fn) {
  const int64_t pairs = sh.G * sh.H;
  const int64_t grain = pairs >= 4 * at::get_num_threads() ? 1 : pairs;
  at::parallel_for(0, pairs, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b / sh.H, b % sh.H);
  });
}

// (double)x exactly for x < 2^53, by operations that vectorize without
// AVX-512 (the only x86 extension that converts 64-bit integers): x is
// 2 (x >> 1) + (x & 1), and a part below 2^52 is the mantissa of 2^52 + it.
SBM_INLINE double exact_double(uint64_t x) {
  constexpr uint64_t kTwo52 = 0x4330000000000000ULL;  // the bits of 2^52
  const double hi = __builtin_bit_cast(double, (x >> 1) | kTwo52) - 0x1p52;
  const double lo = __builtin_bit_cast(double, (x & 1) | kTwo52) - 0x1p52;
  return 2.0 * hi + lo;
}

// The t-th (1-based) uniform of a row's stream, Rng::uniform() at counter t
// (SplitMix64, stream.h), computed from the counter so that a row's trials
// vectorize.
SBM_INLINE double uniform_at(uint64_t state, uint64_t t) {
  return exact_double(sbm_pyg::mix64(state + t * 0x9E3779B97F4A7C15ULL) >>
                      11) * 0x1p-53;
}

// Attention dropout by counter (sbm_pyg/ops/dropout.py): row r's weight on
// key column c0 + j kept (times scale) or dropped, as the sparse kernel
// decides it for the same global (row, column).
template <typename T>
struct Dropout {
  uint64_t seed, threshold;  // threshold 0: off
  T scale;
  int64_t c0;  // the global column of the tile's first key
  SBM_INLINE void apply(int64_t r, T* __restrict x, int64_t nk) const {
    if (!threshold) return;
    const uint64_t state = sbm_pyg::Rng(seed, r, sbm_pyg::kStreamDropout).state;
    for (int64_t j = 0; j < nk; ++j)
      x[j] *= sbm_pyg::dropout_keep(state, c0 + j, threshold) ? scale : T(0);
  }
};

// The products' precision on the GPU (0 "ieee", 1 "tf32", 2 "bfloat16", 3
// "float16": sbm_pyg/ops/dense_attention.py); the CPU computes every
// product in the inputs' dtype whatever it says.
void check_precision(const char* op, int64_t precision) {
  TORCH_CHECK(precision >= 0 && precision <= 3, op,
              ": unknown precision code ", precision);
}

template <typename T>
Dropout<T> make_dropout(int64_t seed, int64_t threshold, int64_t c0) {
  TORCH_CHECK(threshold >= 0 && threshold < (int64_t(1) << 53),
              "sbm_pyg::dense_attention: dropout_threshold must lie in "
              "[0, 2^53)");
  return Dropout<T>{(uint64_t)seed, (uint64_t)threshold,
                    (T)(0x1p53 / (double)((int64_t(1) << 53) - threshold)), c0};
}

// A tile's forward row work: the trials, the mask bits and the masked
// softmax of rows t0..t1 of a [rows, n_k] tile.
template <typename T>
struct ForwardTile {
  const T* p;    // P = (Q̂Ŝ) K̂ᵀ without δ
  T* s;          // the scores, becoming the weights
  uint8_t* bits;  // the tile's first row of mask bytes
  T* lse;
  int64_t* count;
  int64_t nk, ks, qs, i0, r0;  // keys, first key, first query, rows
  double delta;
  bool exact, self_loops;
  uint64_t seed;
  const int64_t* inc_ptr;
  const int64_t* inc_col;
  T scale;
  Dropout<T> drop;
};

template <typename T>
SBM_INLINE void forward_rows_impl(const ForwardTile<T>& a, int64_t t0,
                                  int64_t t1) {
  // Locals, not the struct's fields: stores through the row pointers could
  // alias those, which kept the loops from vectorizing.
  const int64_t nk = a.nk, rb = row_bytes(nk);
  const double delta = a.delta;
  const T scale = a.scale;
  // One byte per trial (the tail past n_k stays 0), packed into bits after:
  // a loop setting bits in place would not vectorize.
  std::vector<uint8_t> on_(rb * 8, 0);
  uint8_t* __restrict on = on_.data();
  const T neg = -std::numeric_limits<T>::infinity();
  for (int64_t t = t0; t < t1; ++t) {
    const T* __restrict p = a.p + t * nk;
    const uint64_t state =
        sbm_pyg::Rng(a.seed, a.r0 + t, sbm_pyg::kStreamDraws).state;
    // (omp simd: GCC would not if-convert the loops' selects and
    // reductions itself without -ffast-math.)
    if (a.exact) {
#pragma omp simd
      for (int64_t j = 0; j < nk; ++j)
        on[j] = uniform_at(state, j + 1) < std::min((double)p[j] + delta, 1.0);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < nk; ++j)
        on[j] = uniform_at(state, j + 1) <
                1.0 - sbm_pyg::exp_shifted(-((double)p[j] + delta));
    }
    const int64_t i = a.qs + a.i0 + t;
    if (a.self_loops && i >= a.ks && i < a.ks + nk) on[i - a.ks] = 1;
    if (a.inc_ptr)
      for (int64_t e = a.inc_ptr[i]; e < a.inc_ptr[i + 1]; ++e)
        on[a.inc_col[e] - a.ks] = 1;
    uint8_t* bits = a.bits + t * rb;
    int64_t n = 0;
    for (int64_t b = 0; b < rb; ++b) {
      const uint8_t* o = on + 8 * b;
      bits[b] = (uint8_t)(o[0] | o[1] << 1 | o[2] << 2 | o[3] << 3 |
                          o[4] << 4 | o[5] << 5 | o[6] << 6 | o[7] << 7);
    }
    for (int64_t j = 0; j < nk; ++j) n += on[j];
    a.count[t] = n;
    // The softmax of the row's sampled scores in place (s becomes A) and
    // its log-sum-exp (-inf for a row without an edge, then A = 0).
    T* __restrict s = a.s + t * nk;
    T m = neg;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < nk; ++j) {
      const T x = s[j] * scale;
      const T y = on[j] ? x : neg;
      s[j] = y;
      m = y > m ? y : m;
    }
    if (m == neg) {
      std::fill(s, s + nk, T(0));
      a.lse[t] = neg;
      continue;
    }
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nk; ++j) {
      s[j] = sbm_pyg::exp_shifted(s[j] - m);
      sum += s[j];
    }
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < nk; ++j) s[j] *= inv;
    a.lse[t] = m + std::log(sum);
    a.drop.apply(a.r0 + t, s, nk);  // out = (A o keep) V
  }
}

// A tile's backward row work: the weights recomputed from the scores, the
// mask and the log-sum-exp, the scores' gradients and the estimator's.
template <typename T>
struct BackwardTile {
  T* s;          // the scores, becoming the weights A
  T* d;          // dOut Vᵀ, becoming ds
  T* gr;         // the estimator's gradients, or null
  const uint8_t* bits;  // the tile's first row of mask bytes
  const T* lse;
  const T* out;
  const T* grad_out;
  const T* glse;  // dL/d lse (a sink's), or null
  int64_t nk, dv, ste;
  T scale;
  Dropout<T> drop;
  int64_t r0;  // the tile's first global row
};

template <typename T>
SBM_INLINE void backward_rows_impl(const BackwardTile<T>& a, int64_t t0,
                                   int64_t t1) {
  const int64_t nk = a.nk, rb = row_bytes(nk);
  const T scale = a.scale;
  std::vector<uint8_t> on_(rb * 8);
  uint8_t* __restrict on = on_.data();
  for (int64_t t = t0; t < t1; ++t) {
    T* __restrict s = a.s + t * nk;
    T* __restrict d = a.d + t * nk;
    T* __restrict gr = a.gr ? a.gr + t * nk : nullptr;
    const T l = a.lse[t];
    if (l == -std::numeric_limits<T>::infinity()) {  // no edge
      std::fill(s, s + nk, T(0));
      std::fill(d, d + nk, T(0));
      if (gr) std::fill(gr, gr + nk, T(0));
      continue;
    }
    const uint8_t* bits = a.bits + t * rb;
    for (int64_t b = 0; b < rb; ++b)
      for (int u = 0; u < 8; ++u) on[8 * b + u] = (bits[b] >> u) & 1;
    T delta_r = 0;
    for (int64_t x = 0; x < a.dv; ++x)
      delta_r += a.grad_out[t * a.dv + x] * a.out[t * a.dv + x];
    if (a.glse) delta_r -= a.glse[t];  // ds = A (dA - delta + dL/dlse)
    // Under dropout dA is keep o (dOut V^T), and dV takes (A o keep)^T.
    a.drop.apply(a.r0 + t, d, nk);
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) {
      const T sc = s[j] * scale;
      // on as a factor, not a branch; ds = 0 off the mask, and so the
      // estimator's gradient.
      const T w = (T)on[j] * sbm_pyg::exp_shifted(std::min(sc - l, T(0)));
      d[j] = w * (d[j] - delta_r);
      s[j] = w;
      if (gr) gr[j] = sc;
    }
    a.drop.apply(a.r0 + t, s, nk);
    if (gr && a.ste == sbm_pyg::kStePaper) {
      for (int64_t j = 0; j < nk; ++j) gr[j] *= d[j];
    } else if (gr) {
      for (int64_t j = 0; j < nk; ++j)
        gr[j] = std::min(T(1), std::max(T(-1), d[j]));
    }
  }
}

// Each row function compiled for AVX2 with FMA and for the baseline
// (simd.h); the CPU picks.
#define SBM_ROWS(NAME, TILE)                                               \
  template <typename T>                                                    \
  SBM_AVX2_FMA void NAME##_avx2(const TILE<T>& a, int64_t t0, int64_t t1) { \
    NAME##_impl(a, t0, t1);                                                \
  }                                                                        \
  template <typename T>                                                    \
  void NAME##_base(const TILE<T>& a, int64_t t0, int64_t t1) {             \
    NAME##_impl(a, t0, t1);                                                \
  }                                                                        \
  template <typename T>                                                    \
  void NAME(const TILE<T>& a, int64_t t0, int64_t t1) {                    \
    if (sbm_cpu_has_avx2_fma()) {                                          \
      NAME##_avx2(a, t0, t1);                                              \
    } else {                                                               \
      NAME##_base(a, t0, t1);                                              \
    }                                                                      \
  }

SBM_ROWS(forward_rows, ForwardTile)
SBM_ROWS(backward_rows, BackwardTile)

void check_args(const char* op, const Tensor& ptr_q, const Tensor& ptr_k,
                const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& q_block, const Tensor& k_memb, int64_t heads) {
  TORCH_CHECK(ptr_q.scalar_type() == at::kLong &&
                  ptr_k.scalar_type() == at::kLong &&
                  ptr_q.numel() == ptr_k.numel() && ptr_q.numel() >= 1,
              op, ": ptr_q and ptr_k must be int64 [G + 1]");
  for (const Tensor* t : {&q, &k, &v, &q_block, &k_memb})
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() &&
                    t->scalar_type() == q.scalar_type() && t->is_cpu(),
                op, ": q, k, v, q_block, k_memb must be contiguous 2-D CPU "
                "tensors of one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              op, ": float32 or float64 expected");
  TORCH_CHECK(heads >= 1 && q.size(0) % heads == 0 && k.size(0) % heads == 0,
              op, ": rows must be heads * queries and heads * keys");
  TORCH_CHECK(k.size(0) == v.size(0) && q.size(1) == k.size(1) &&
                  q_block.size(0) == q.size(0) &&
                  k_memb.size(0) == k.size(0) &&
                  q_block.size(1) == k_memb.size(1),
              op, ": q [R, D], k [C, D], v [C, Dv], q_block [R, K], "
              "k_memb [C, K] expected");
}

}  // namespace

namespace sbm_pyg {

std::tuple<Tensor, Tensor, Tensor, Tensor> dense_attention(
    const Tensor& ptr_q, const Tensor& ptr_k, const Tensor& inc_ptr,
    const Tensor& inc_col, const Tensor& q_, const Tensor& k_,
    const Tensor& v_, const Tensor& q_block_, const Tensor& k_memb_,
    int64_t heads, double delta, bool exact, bool self_loops,
    const Tensor& seed_, double scale, int64_t ste,
    const std::optional<Tensor>& dropout_seed_, int64_t dropout_threshold,
    int64_t precision, int64_t mask_bytes) {
  (void)ste;  // the estimator acts in backward; an argument for autograd
  check_precision("sbm_pyg::dense_attention", precision);
  const int64_t seed =
      seed_value(seed_, true, "sbm_pyg::dense_attention", "seed");
  const int64_t dropout_seed =
      seed_value(dropout_seed_, dropout_threshold > 0,
                 "sbm_pyg::dense_attention", "dropout_seed");
  // The products below are this op's kernels, not autograd's business (on
  // every thread: a dispatch guard would hold on this one only).
  const Tensor q = q_.detach(), k = k_.detach(), v = v_.detach(),
               q_block = q_block_.detach(), k_memb = k_memb_.detach();
  check_args("sbm_pyg::dense_attention", ptr_q, ptr_k, q, k, v, q_block,
             k_memb, heads);
  const Shape sh(ptr_q, ptr_k, heads, q.size(0), k.size(0));
  const bool included = inc_ptr.numel() > 0;
  TORCH_CHECK(!included || (inc_ptr.numel() == sh.Nq + 1 &&
                            inc_ptr.scalar_type() == at::kLong &&
                            inc_col.scalar_type() == at::kLong),
              "sbm_pyg::dense_attention: inc_ptr must be int64 [N_q + 1]");
  Tensor out = at::zeros({q.size(0), v.size(1)}, q.options());
  Tensor lse = at::empty({q.size(0)}, q.options());
  TORCH_CHECK(mask_bytes < 0 || mask_bytes == sh.base[sh.G],
              "sbm_pyg::dense_attention: mask_bytes is ", mask_bytes,
              ", but ptr_q/ptr_k give a mask of ", sh.base[sh.G], " bytes");
  Tensor mask = at::empty({sh.base[sh.G]}, q.options().dtype(at::kByte));
  Tensor edges = at::zeros({sh.G, sh.H}, q.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "dense_attention", [&] {
    using T = scalar_t;
    uint8_t* mk = mask.data_ptr<uint8_t>();
    T* lp = lse.data_ptr<T>();
    int64_t* ep = edges.data_ptr<int64_t>();
    const int64_t* ip = included ? inc_ptr.data_ptr<int64_t>() : nullptr;
    const int64_t* ic = included ? inc_col.data_ptr<int64_t>() : nullptr;
    for_each_pair(sh, [&](int64_t g, int64_t h) {
      const int64_t qs = sh.ptr_q[g], nq = sh.ptr_q[g + 1] - qs;
      const int64_t ks = sh.ptr_k[g], nk = sh.ptr_k[g + 1] - ks;
      if (nk == 0) {  // no keys: every row empty, out stays 0
        std::fill(lp + h * sh.Nq + qs, lp + h * sh.Nq + qs + nq,
                  -std::numeric_limits<T>::infinity());
        return;
      }
      const int64_t c0 = h * sh.Nk + ks;
      const Tensor Kb = k.narrow(0, c0, nk), Vb = v.narrow(0, c0, nk);
      const Tensor KMt = k_memb.narrow(0, c0, nk).t();
      std::vector<int64_t> count(kBlockRows);
      for (int64_t i0 = 0; i0 < nq; i0 += kBlockRows) {
        const int64_t bq = std::min(kBlockRows, nq - i0);
        const int64_t r0 = h * sh.Nq + qs + i0;
        const Tensor P = at::mm(q_block.narrow(0, r0, bq), KMt);
        Tensor S = at::mm(q.narrow(0, r0, bq), Kb.t());
        const ForwardTile<T> tile{
            P.data_ptr<T>(), S.data_ptr<T>(),
            mk + sh.base[g] + (h * nq + i0) * row_bytes(nk), lp + r0,
            count.data(), nk, ks, qs, i0, r0, delta, exact, self_loops,
            (uint64_t)seed, ip, ic, (T)scale,
            make_dropout<T>(dropout_seed, dropout_threshold, c0)};
        at::parallel_for(0, bq, 16, [&](int64_t t0, int64_t t1) {
          forward_rows(tile, t0, t1);
        });
        for (int64_t t = 0; t < bq; ++t) ep[g * sh.H + h] += count[t];
        Tensor o = out.narrow(0, r0, bq);
        at::mm_out(o, S, Vb);
      }
    });
  });
  return {out, lse, mask, edges};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> dense_attention_backward(
    const Tensor& ptr_q, const Tensor& ptr_k, const Tensor& q_,
    const Tensor& k_, const Tensor& v_, const Tensor& q_block_,
    const Tensor& k_memb_, const Tensor& mask, const Tensor& out_,
    const Tensor& lse_, const Tensor& grad_out_, int64_t heads, double scale,
    int64_t ste, const std::optional<Tensor>& dropout_seed_,
    int64_t dropout_threshold, int64_t precision,
    const std::optional<Tensor>& grad_lse) {
  check_precision("sbm_pyg::dense_attention_backward", precision);
  const int64_t dropout_seed =
      seed_value(dropout_seed_, dropout_threshold > 0,
                 "sbm_pyg::dense_attention_backward", "dropout_seed");
  const Tensor q = q_.detach(), k = k_.detach(), v = v_.detach(),
               q_block = q_block_.detach(), k_memb = k_memb_.detach(),
               out = out_.detach(), lse = lse_.detach(),
               grad_out = grad_out_.detach();
  check_args("sbm_pyg::dense_attention_backward", ptr_q, ptr_k, q, k, v,
             q_block, k_memb, heads);
  TORCH_CHECK(ste == kSteNone || ste == kStePaper || ste == kStePublished,
              "sbm_pyg::dense_attention_backward: unknown ste code ", ste);
  TORCH_CHECK(grad_out.is_contiguous() && out.is_contiguous() &&
                  grad_out.sizes() == out.sizes(),
              "sbm_pyg::dense_attention_backward: grad_out must be "
              "contiguous and out's shape");
  TORCH_CHECK(!grad_lse || (grad_lse->numel() == q.size(0) &&
                            grad_lse->is_contiguous() &&
                            grad_lse->scalar_type() == q.scalar_type()),
              "sbm_pyg::dense_attention_backward: grad_lse must be [R] in "
              "q's dtype");
  const Shape sh(ptr_q, ptr_k, heads, q.size(0), k.size(0));
  TORCH_CHECK(mask.numel() == sh.base[sh.G],
              "sbm_pyg::dense_attention_backward: mask does not fit ptr_q/ptr_k");
  const bool memb = ste != kSteNone;
  Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  Tensor dqb = memb ? at::zeros_like(q_block) : at::empty({0}, q.options());
  Tensor dkm = memb ? at::zeros_like(k_memb) : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "dense_attention_backward", [&] {
    using T = scalar_t;
    const uint8_t* mk = mask.data_ptr<uint8_t>();
    const T* lp = lse.data_ptr<T>();
    const T* op = out.data_ptr<T>();
    const T* gp = grad_out.data_ptr<T>();
    const T* glp = grad_lse ? grad_lse->data_ptr<T>() : nullptr;
    const int64_t Dv = v.size(1);
    for_each_pair(sh, [&](int64_t g, int64_t h) {
      const int64_t qs = sh.ptr_q[g], nq = sh.ptr_q[g + 1] - qs;
      const int64_t ks = sh.ptr_k[g], nk = sh.ptr_k[g + 1] - ks;
      if (nk == 0 || nq == 0) return;
      const int64_t c0 = h * sh.Nk + ks;
      const Tensor Kb = k.narrow(0, c0, nk), Vb = v.narrow(0, c0, nk);
      const Tensor KM = k_memb.narrow(0, c0, nk);
      Tensor dKb = dk.narrow(0, c0, nk), dVb = dv.narrow(0, c0, nk);
      for (int64_t i0 = 0; i0 < nq; i0 += kBlockRows) {
        const int64_t bq = std::min(kBlockRows, nq - i0);
        const int64_t r0 = h * sh.Nq + qs + i0;
        const Tensor Qb = q.narrow(0, r0, bq), dOb = grad_out.narrow(0, r0, bq);
        Tensor S = at::mm(Qb, Kb.t());     // becomes A
        Tensor dA = at::mm(dOb, Vb.t());   // becomes ds
        Tensor Gt = memb ? at::empty({bq, nk}, q.options()) : Tensor();
        const BackwardTile<T> tile{
            S.data_ptr<T>(), dA.data_ptr<T>(),
            memb ? Gt.data_ptr<T>() : nullptr,
            mk + sh.base[g] + (h * nq + i0) * row_bytes(nk), lp + r0,
            op + r0 * Dv, gp + r0 * Dv, glp ? glp + r0 : nullptr, nk, Dv, ste,
            (T)scale,
            make_dropout<T>(dropout_seed, dropout_threshold, c0), r0};
        at::parallel_for(0, bq, 16, [&](int64_t t0, int64_t t1) {
          backward_rows(tile, t0, t1);
        });
        Tensor dQb = dq.narrow(0, r0, bq);
        at::mm_out(dQb, dA, Kb);
        dQb.mul_(scale);
        dKb.addmm_(dA.t(), Qb, 1.0, scale);
        dVb.addmm_(S.t(), dOb);
        if (memb) {
          Tensor dQBb = dqb.narrow(0, r0, bq);
          at::mm_out(dQBb, Gt, KM);
          dkm.narrow(0, c0, nk).addmm_(Gt.t(), q_block.narrow(0, r0, bq));
        }
      }
    });
  });
  return {dq, dk, dv, dqb, dkm};
}

}  // namespace sbm_pyg
