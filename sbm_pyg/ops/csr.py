r"""CSR kernels over the block-diagonal attention matrix of a sampled graph.

A :class:`~sbm_pyg.sampling.SampledGraph` with :math:`H` heads over
:math:`N_q` queries and :math:`N_k` keys is stored as one sparse matrix of
shape :math:`[H \cdot N_q, H \cdot N_k]`: row :math:`h N_q + i` is query
:math:`i` of head :math:`h`, column :math:`h N_k + j` is key :math:`j` of
head :math:`h`. Heads and sequences are diagonal blocks of that matrix, so one
kernel call serves the whole ragged batch with no Python loop and no padding.

These are raw kernels without autograd; :mod:`sbm_pyg.nn.functional` wraps
them in :class:`torch.autograd.Function` s.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch
from torch import Tensor

__all__ = ["sddmm", "spmm", "segment_sum", "segment_softmax", "row_index",
           "full_precision", "heads_first", "nodes_first"]

from sbm_pyg.ops.backend_info import WITH_TORCH_SCATTER

if WITH_TORCH_SCATTER:  # optional (pip install .[ext]); see _segment_max
    import torch_scatter

# torch's sparse CSR/CSC kernels warn that they are "beta" on every
# construction (SampledGraph.to_edge_index builds a CSC tensor).
warnings.filterwarnings("ignore", message="Sparse CS[RC] tensor support is in beta")


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """A context in which float32 computes in float32 on :obj:`device`:
    autocast is off (where torch has autocast for it), and float32 matmuls
    run in IEEE float32 whatever the global setting
    (:func:`torch.set_float32_matmul_precision`,
    :obj:`torch.backends.cuda.matmul.allow_tf32`: TF32 on a GPU, bfloat16
    passes in oneDNN on a CPU). The kernels here and the sampler choose
    their compute dtype themselves: autocast would cast their CSR products
    to half precision, which torch's CSR kernels do not support, and TF32
    products feeding the sampler move its probabilities by ~1e-3.

    The previous precision is restored on exit, through the per-backend
    settings, which read the same whichever of torch's two APIs set them.

    Under :func:`torch.compile` only autocast is turned off: a compiled
    graph's products take the precision set when it is compiled (reading
    the setting inside the graph would break it there, and run the
    attention around it eagerly)."""
    autocast = (torch.autocast(device.type, enabled=False)
                if device.type in ("cpu", "cuda") else contextlib.nullcontext())
    if torch.compiler.is_compiling():
        with autocast:
            yield
        return
    matmul = (torch.backends.cuda.matmul,
              torch.backends.mkldnn.matmul)  # type: ignore[attr-defined]
    saved = [backend.fp32_precision for backend in matmul]
    for backend in matmul:
        backend.fp32_precision = "ieee"
    try:
        with autocast:
            yield
    finally:
        for backend, value in zip(matmul, saved):
            backend.fp32_precision = value


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # torch's CSR kernels support float32/float64 only: reduced precision
    # inputs are computed (and accumulated) in float32.
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _csr(rowptr: Tensor, col: Tensor, values: Tensor, num_cols: int) -> Tensor:
    # The device is named: left out, torch's default device would win over
    # the inputs' (torch.set_default_device).
    return torch.sparse_csr_tensor(rowptr, col, values,
                                   (rowptr.numel() - 1, num_cols),
                                   device=values.device, check_invariants=False)


def sddmm(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor,
          scale: float = 1.0) -> Tensor:
    r"""Sampled dense-dense product:
    :math:`v_e = s \, \langle a_{r(e)}, b_{c(e)}\rangle`.

    Args:
        rowptr (IntTensor or LongTensor): CSR row pointer :obj:`[R + 1]`.
        col (IntTensor or LongTensor): column of each nonzero :obj:`[E]`, in
            :obj:`rowptr`'s dtype.
        a (Tensor): :obj:`[R, D]`.
        b (Tensor): :obj:`[C, D]`.
        scale (float): :math:`s`.

    Returns:
        Tensor :obj:`[E]`, one value per nonzero, written in place: no
        :obj:`[E, D]` intermediate and no second :obj:`[E]` buffer.
    """
    dtype = _compute_dtype(a.dtype)
    a, b = a.to(dtype), b.to(dtype)
    values = a.new_zeros(col.numel())
    pattern = _csr(rowptr, col, values, b.size(0))
    with full_precision(a.device):
        torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=scale,
                                   out=pattern)
    return values


def spmm(rowptr: Tensor, col: Tensor, values: Tensor, dense: Tensor) -> Tensor:
    r"""Sparse-dense product :math:`\mathbf{A} \mathbf{X}` with
    :math:`\mathbf{A}` given in CSR form.

    Args:
        rowptr (LongTensor): :obj:`[R + 1]`.
        col (LongTensor): :obj:`[E]`.
        values (Tensor): :obj:`[E]`.
        dense (Tensor): :obj:`[C, D]`.

    Returns:
        Tensor :obj:`[R, D]`; rows without nonzeros are zero.
    """
    dtype = _compute_dtype(torch.promote_types(values.dtype, dense.dtype))
    with full_precision(dense.device):
        return (_csr(rowptr, col, values.to(dtype), dense.size(0))
                @ dense.to(dtype))


def segment_sum(values: Tensor, rowptr: Tensor) -> Tensor:
    r"""Sum of :obj:`values [E]` over each CSR row; :obj:`[R]`, empty rows 0."""
    return torch.segment_reduce(values, "sum", offsets=rowptr, unsafe=True)


def row_index(rowptr: Tensor, num_edges: int) -> Tensor:
    r"""The row of each nonzero, :obj:`[E]`, int32 where it fits (4 bytes
    per edge). Broadcasting a per-row value with it costs one :obj:`[E]`
    buffer, where :meth:`Tensor.repeat_interleave` builds an int64 index
    each time. :obj:`num_edges` is known on the host: no device sync."""
    # repeat_interleave of the counts alone is the row index itself, in the
    # counts' dtype: no arange to gather from.
    counts = rowptr.diff()
    if counts.dtype != torch.int32 and rowptr.numel() - 1 < 2**31:
        counts = counts.int()
    return torch.repeat_interleave(counts, output_size=num_edges)


def _segment_max(values: Tensor, rowptr: Tensor) -> Tensor:
    # torch-scatter's segment_csr takes 0.42-0.60x the time of
    # torch.segment_reduce for the max on the CPU (n=16384, 1-5% density,
    # the benchmark's ext section); for sums, and torch-sparse's SpMM, ours
    # are faster (2.5-3.9x), so only the max uses it. Empty rows differ
    # (0 vs -inf) and are never read.
    if WITH_TORCH_SCATTER and values.device.type == "cpu":
        return torch_scatter.segment_csr(values, rowptr.long(), reduce="max")
    return torch.segment_reduce(values, "max", offsets=rowptr, unsafe=True)


def segment_softmax(scores: Tensor, rowptr: Tensor, row: Tensor) -> Tensor:
    r"""Softmax over the nonzeros of each CSR row, max-subtracted.

    .. math::
        \alpha_e = \frac{\exp(s_e - \max_{e' \in r(e)} s_{e'})}
        {\sum_{e' \in r(e)} \exp(s_{e'} - \max_{e'' \in r(e)} s_{e''})}

    Args:
        scores (Tensor): :obj:`[E]`, sorted by row.
        rowptr (LongTensor): :obj:`[R + 1]`.
        row (IntTensor): :obj:`[E]` from :func:`row_index`.

    Returns:
        Tensor :obj:`[E]` (one new buffer). Empty rows have no entries, so no
        :obj:`0/0`.
    """
    row_max = _segment_max(scores, rowptr)
    exp = torch.sub(scores, row_max.index_select(0, row)).exp_()
    norm = segment_sum(exp, rowptr).reciprocal_()
    return exp.mul_(norm.index_select(0, row))


def heads_first(x: Tensor) -> Tensor:
    r""":obj:`[N, H, D]` → :obj:`[H * N, D]`: row :obj:`h * N + i`, the
    rows and columns of the block-diagonal CSR matrix."""
    N, H, D = x.shape
    return x.transpose(0, 1).reshape(H * N, D)


def nodes_first(x: Tensor, H: int) -> Tensor:
    r""":obj:`[H * N, D]` → :obj:`[N, H, D]`, the inverse of :func:`heads_first`."""
    return x.view(H, -1, x.size(-1)).transpose(0, 1)
