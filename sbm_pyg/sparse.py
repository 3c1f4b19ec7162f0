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

import warnings

import torch
from torch import Tensor

__all__ = ["sddmm", "spmm", "segment_sum", "segment_softmax", "expand_rows"]

# torch's sparse CSR kernels warn that they are "beta" on every construction.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # torch's CSR kernels support float32/float64 only: reduced precision
    # inputs are computed (and accumulated) in float32.
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _csr(rowptr: Tensor, col: Tensor, values: Tensor, num_cols: int) -> Tensor:
    return torch.sparse_csr_tensor(rowptr, col, values,
                                   (rowptr.numel() - 1, num_cols),
                                   check_invariants=False)


def sddmm(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    r"""Sampled dense-dense product: :math:`v_e = \langle a_{r(e)}, b_{c(e)}\rangle`.

    Args:
        rowptr (LongTensor): CSR row pointer :obj:`[R + 1]`.
        col (LongTensor): column of each nonzero :obj:`[E]`.
        a (Tensor): :obj:`[R, D]`.
        b (Tensor): :obj:`[C, D]`.

    Returns:
        Tensor :obj:`[E]`, one value per nonzero, never an :obj:`[E, D]`
        intermediate.
    """
    dtype = _compute_dtype(a.dtype)
    a, b = a.to(dtype), b.to(dtype)
    pattern = _csr(rowptr, col, a.new_zeros(col.numel()), b.size(0))
    return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0).values()


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
    return _csr(rowptr, col, values.to(dtype), dense.size(0)) @ dense.to(dtype)


def segment_sum(values: Tensor, rowptr: Tensor) -> Tensor:
    r"""Sum of :obj:`values [E]` over each CSR row; :obj:`[R]`, empty rows 0."""
    return torch.segment_reduce(values, "sum", offsets=rowptr, unsafe=True)


def expand_rows(row_values: Tensor, rowptr: Tensor, num_edges: int) -> Tensor:
    r"""Broadcasts :obj:`row_values [R]` to the nonzeros of each row; :obj:`[E]`.

    :obj:`num_edges` is passed in (it is known on the host) so that no device
    sync is needed.
    """
    return row_values.repeat_interleave(rowptr.diff(), output_size=num_edges)


def segment_softmax(scores: Tensor, rowptr: Tensor) -> Tensor:
    r"""Softmax over the nonzeros of each CSR row, max-subtracted.

    .. math::
        \alpha_e = \frac{\exp(s_e - \max_{e' \in r(e)} s_{e'})}
        {\sum_{e' \in r(e)} \exp(s_{e'} - \max_{e'' \in r(e)} s_{e''})}

    Args:
        scores (Tensor): :obj:`[E]`, sorted by row.
        rowptr (LongTensor): :obj:`[R + 1]`.

    Returns:
        Tensor :obj:`[E]`. Empty rows have no entries, so no :obj:`0/0`.
    """
    row_max = torch.segment_reduce(scores, "max", offsets=rowptr, unsafe=True)
    num_edges = scores.numel()
    exp = (scores - expand_rows(row_max, rowptr, num_edges)).exp()
    return exp / expand_rows(segment_sum(exp, rowptr), rowptr, num_edges)
