r"""The kernels under the layers, with their backends in one place.

* :mod:`sbm_pyg.ops.graph`: :class:`CSRGraph`, the int32 CSR form of an
  attention graph that every attention kernel takes.
* :mod:`sbm_pyg.ops.csr`: CSR kernels over the block-diagonal attention
  matrix of a sampled graph (PyTorch, any device).
* :mod:`sbm_pyg.ops.torch_attention`: the attention on those kernels as
  autograd functions: the reference path.
* :mod:`sbm_pyg.ops.fused_attention`: the fused attention as one torch
  operator, the C++ kernel on the CPU and the Triton one on CUDA, with
  autograd and fake kernels registered once.
* :mod:`sbm_pyg.ops.triton_attention`: the Triton kernels (CUDA).
* :mod:`sbm_pyg.ops.dense_attention`: the dense-regime attention (mask
  sampled and softmax taken with matrix products, no graph) as one torch
  operator (CPU).
* :mod:`sbm_pyg.ops.library`: the ``sbm_pyg`` operator namespace.
* :mod:`sbm_pyg.ops.backend_info`: which of them are built and which run.
"""
from sbm_pyg.ops.backend_info import (
    BACKENDS,
    WITH_EXTENSION,
    WITH_TORCH_SCATTER,
    WITH_TRITON,
    backends,
    resolve_backend,
    triton_runs,
)
from sbm_pyg.ops.csr import (
    full_precision,
    row_index,
    sddmm,
    segment_softmax,
    segment_sum,
    spmm,
)
from sbm_pyg.ops.dense_attention import DenseAttention, dense_attention
from sbm_pyg.ops.fused_attention import fused_attention
from sbm_pyg.ops.graph import CSRGraph

__all__ = [
    "CSRGraph",
    "BACKENDS",
    "resolve_backend",
    "triton_runs",
    "backends",
    "WITH_EXTENSION",
    "WITH_TRITON",
    "WITH_TORCH_SCATTER",
    "sddmm",
    "spmm",
    "segment_sum",
    "segment_softmax",
    "row_index",
    "full_precision",
    "fused_attention",
    "dense_attention",
    "DenseAttention",
]
