// Dense-regime SBM attention (CPU): the mask sampled, the scores and the
// masked softmax computed block by block with matrix products, for
// (sequence, head) pairs whose sampled graph is dense. The CPU kernels of
// sbm_pyg::dense_attention and its backward (sbm_pyg/ops/dense_attention.py).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace sbm_pyg {

// Rows are (head, query) = h * N_q + i and columns (head, key) = h * N_k + j,
// heads-first as in sparse_attention: q [R, D], q_block = Q̂Ŝ [R, K],
// k [C, D], v [C, Dv], k_memb = K̂ [C, K]; ptr_q/ptr_k [G + 1] cut queries
// and keys into sequences; inc_ptr [N_q + 1] / inc_col (global keys) the
// included pairs, or both empty; dropout_threshold > 0 multiplies each
// weight by its keep factor (sbm_pyg/ops/dropout.py), as the sparse kernel
// does for the same (row, column). Returns out [R, Dv], lse [R] (-inf for a
// row without an edge), the mask bits (uint8, a row of ceil(n_k / 8) bytes
// per (sequence, head, query)) and the edge count of each pair [G, H].
// mask_bytes, where >= 0, is the mask's size as the caller read it (a GPU
// kernel allocates it without a read of its own): checked here.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dense_attention(
    const at::Tensor& ptr_q, const at::Tensor& ptr_k,
    const at::Tensor& inc_ptr, const at::Tensor& inc_col, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_block,
    const at::Tensor& k_memb, int64_t heads, double delta, bool exact,
    bool self_loops, const at::Tensor& seed, double scale, int64_t ste,
    const std::optional<at::Tensor>& dropout_seed, int64_t dropout_threshold,
    int64_t precision, int64_t mask_bytes);

// grad_q, grad_k, grad_v and, with an estimator (ste != 0), the membership
// gradients grad_q_block [R, K] and grad_k_memb [C, K] (else empty).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
dense_attention_backward(const at::Tensor& ptr_q, const at::Tensor& ptr_k,
                         const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& q_block,
                         const at::Tensor& k_memb, const at::Tensor& mask,
                         const at::Tensor& out, const at::Tensor& lse,
                         const at::Tensor& grad_out, int64_t heads,
                         double scale, int64_t ste,
                         const std::optional<at::Tensor>& dropout_seed,
                         int64_t dropout_threshold, int64_t precision,
                         const std::optional<at::Tensor>& grad_lse);

}  // namespace sbm_pyg
