// Fused sparse attention on a sampled graph (int32 CSR), with the straight-through
// gradients of its edge probabilities (CPU).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace sbm_pyg {

// Straight-through estimators, the codes of the `ste` argument.
enum SteMode : int64_t { kSteNone = 0, kStePaper = 1, kStePublished = 2 };

// A seed given as a tensor (0-dim int64, on the op's device): a captured GPU
// graph reads it on the device, so that each replay can draw a new one. The
// CPU kernels read it here, from host memory. A seed the call does not use
// (dropout off) may be absent: 0.
inline int64_t seed_value(const std::optional<at::Tensor>& seed, bool used,
                          const char* op, const char* name) {
  if (!used) return 0;
  TORCH_CHECK(seed.has_value() && seed->numel() == 1 &&
                  seed->scalar_type() == at::kLong && seed->device().is_cpu(),
              op, ": ", name, " must be a one-element int64 CPU tensor");
  return seed->item<int64_t>();
}

// out [R, Dv], alpha [E] (empty unless weights), lse [R]: softmax over each CSR row's edges of
// scale * <q_r, k_c>, the weighted sum of the values (each weight dropped
// or scaled by 1 / (1 - p) under dropout_threshold > 0: the mask is a
// function of dropout_seed (a tensor, read only under dropout) and (r, c), sampler/stream.h, recomputed by the
// backward; alpha is before dropout), and each row's
// log-sum-exp (-inf for a row with no edge), which backward reads. The edge
// probabilities and memberships are not read; they are arguments so that
// autograd routes their straight-through gradients through this op.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row_t, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const std::optional<at::Tensor>& edge_prob,
    const std::optional<at::Tensor>& q_block,
    const std::optional<at::Tensor>& k_memb, double scale, int64_t ste,
    bool weights, const std::optional<at::Tensor>& dropout_seed,
    int64_t dropout_threshold);

// grad_q, grad_k, grad_v, grad_prob [E] (empty without an estimator) and the
// membership gradients grad_q_block [R, K], grad_k_memb [C, K] (empty
// without memberships): dL/dp_e summed into Q̂Ŝ by rows and K̂ by columns.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
sparse_attention_backward(const at::Tensor& rowptr, const at::Tensor& col,
                          const at::Tensor& colptr, const at::Tensor& row_t,
                          const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& out,
                          const at::Tensor& lse, const at::Tensor& grad_out,
                          const std::optional<at::Tensor>& q_block,
                          const std::optional<at::Tensor>& k_memb,
                          double scale, int64_t ste,
                          const std::optional<at::Tensor>& dropout_seed,
                          int64_t dropout_threshold,
                          const std::optional<at::Tensor>& grad_lse);

}  // namespace sbm_pyg
