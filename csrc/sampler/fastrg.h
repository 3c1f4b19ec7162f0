// The compiled fastRG sampler (CPU): two passes, so that the caller can check
// the draw count against its memory guard before the graph is allocated.
// They are the CPU kernels of sbm_pyg::fastrg_plan and sbm_pyg::fastrg_sample.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace sbm_pyg {

using FourTensors =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using SixTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                              at::Tensor, at::Tensor>;

// Pass 1: per-row degree (or -1 for a row tested densely), inflation, the
// key clusters' masses and maxima ([2, G, H, k]: the sample's key tables
// are scaled by the maxima, computed once here) and the input checks'
// statistics.
FourTensors fastrg_plan(at::Tensor Y, at::Tensor W, at::Tensor Z,
                        at::Tensor ptr_q, at::Tensor ptr_k, double delta,
                        bool exact, int64_t seed, double threshold);

// Pass 2: rowptr, col (head * Nk + key), perm, colptr and row_t (the row of
// each edge in column order) of the sampled graph, int32, and row (the row of
// each edge) where slots > 0. capacity sizes the CUDA kernel's draw buffer;
// this kernel merges each row's draws in buffers of its own and does not read
// it. slots > 0 pads col, perm, row_t and row to that length (at least the
// edge count); 0 sizes them by the edge count and leaves row empty.
SixTensors fastrg_sample(at::Tensor W, at::Tensor Z, at::Tensor mass,
                         at::Tensor ptr_q, at::Tensor ptr_k, double delta,
                         bool exact, int64_t seed, at::Tensor degree,
                         at::Tensor inflation, bool self_loops,
                         at::Tensor inc_ptr, at::Tensor inc_col,
                         int64_t capacity, int64_t slots);

}  // namespace sbm_pyg
