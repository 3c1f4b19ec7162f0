r"""Sparse attention on PyTorch's CSR kernels (:mod:`sbm_pyg.ops.csr`) as
autograd functions: the reference path of
:func:`~sbm_pyg.nn.functional.sparse_attention`, on any device.

The graph argument is a :class:`~sbm_pyg.ops.graph.CSRGraph` (a
:class:`~sbm_pyg.sampling.CSRGraph`'s :attr:`csr`).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from sbm_pyg.ops.csr import _segment_max, sddmm, segment_sum, spmm
from sbm_pyg.ops.dropout import dropout_keep, dropout_threshold, keep_scale
from sbm_pyg.ops.graph import CSRGraph

# The estimators by the code the fused kernels take: none, the paper's
# equation (dL/da_e * s_e), the published code's (clip(dL/da_e, -1, 1)).
STE_CODES = {None: 0, "paper": 1, "published": 2}

__all__ = ["STE_CODES", "SDDMM", "SDDMMGradOnly", "SparseAttention", "ste_gradient",
           "spmm_t", "clip_grad"]


def spmm_t(graph: CSRGraph, values: Tensor, dense: Tensor) -> Tensor:
    r"""The transposed product :math:`\mathbf{A}^{\top} \mathbf{X}` of the
    graph's CSR matrix with values in edge order."""
    return spmm(graph.colptr, graph.row_t(), values.index_select(0, graph.perm), dense)


class SDDMM(torch.autograd.Function):
    r""":math:`v_e = \langle a_{r(e)}, b_{c(e)} \rangle` with gradients as
    sparse-dense products."""

    @staticmethod
    def forward(ctx, graph: CSRGraph, a: Tensor, b: Tensor) -> Tensor:
        ctx.graph = graph
        ctx.save_for_backward(a, b)
        rowptr, col = graph.rowptr, graph.col
        return sddmm(rowptr, col, a, b).to(a.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        graph = ctx.graph
        grad_a = grad_b = None
        if ctx.needs_input_grad[1]:
            rowptr, col = graph.rowptr, graph.col
            grad_a = spmm(rowptr, col, grad, b).to(a.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = spmm_t(graph, grad, a).to(b.dtype)
        return None, grad_a, grad_b


class SDDMMGradOnly(SDDMM):
    r"""The gradients of :class:`SDDMM` with zeros for values: for the
    straight-through estimator, whose forward never reads :math:`p_e`, so
    the :math:`O(E k)` forward product is skipped."""

    @staticmethod
    def forward(ctx, graph: CSRGraph, a: Tensor, b: Tensor) -> Tensor:
        ctx.graph = graph
        ctx.save_for_backward(a, b)
        return a.new_zeros(graph.num_edges)


def ste_gradient(grad_score: Tensor, score: Optional[Tensor],
                  ste: str) -> Tensor:
    r""":math:`\partial L / \partial p_e` from :math:`\partial L / \partial a_e`
    under either estimator (see
    :func:`~sbm_pyg.nn.functional.sparse_attention`)."""
    if ste == "paper":
        assert score is not None  # saved in forward for this estimator
        return grad_score * score
    return grad_score.clamp(-1.0, 1.0)


class SparseAttention(torch.autograd.Function):
    r"""Fused SDDMM → segment softmax → SpMM with a hand-written backward
    (the PyTorch path).

    Saved for backward: the flattened :obj:`q, k, v` (:obj:`[H N, D]`), the
    attention weights and, when needed, the scores and the dropout factors
    (:obj:`[E]` each). The dropout mask is the fused kernels' (by counter,
    :mod:`sbm_pyg.ops.dropout`), the same for the same seed. Returns
    :obj:`(out, alpha, lse)`: :obj:`lse` :obj:`[H N]`, each row's
    log-sum-exp (:math:`-\infty` for a row with no edge), differentiable
    (an attention sink's gradient enters the scores through it).
    """

    @staticmethod
    def forward(ctx, graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                edge_prob: Optional[Tensor], scale: float, dropout: float,
                dropout_seed: Union[int, Tensor], ste: str
                ) -> Tuple[Tensor, Tensor, Tensor]:
        rowptr, col = graph.rowptr, graph.col
        score = sddmm(rowptr, col, q, k, scale)  # [E]
        # The segment softmax, with each row's log-sum-exp kept.
        row_max = _segment_max(score, rowptr)
        alpha = torch.sub(score, row_max.index_select(0, graph.row())).exp_()
        total = segment_sum(alpha, rowptr)
        alpha.div_(total.index_select(0, graph.row()))
        lse = total.log_().add_(row_max)  # empty rows: -inf
        keep = None
        weight = alpha
        if dropout > 0:
            threshold = dropout_threshold(dropout)
            keep = dropout_keep(dropout_seed, graph.row(), col, threshold)
            keep = keep.to(alpha.dtype) * keep_scale(threshold)
            weight = alpha * keep
        out = spmm(rowptr, col, weight, v)  # [H * N_q, D]
        ctx.graph, ctx.scale, ctx.ste = graph, scale, ste
        ctx.prob_dtype = edge_prob.dtype if edge_prob is not None else None
        keep_score = edge_prob is not None and ste == "paper"
        ctx.save_for_backward(q, k, v, alpha, keep,
                              score if keep_score else None)
        ctx.mark_non_differentiable(alpha)
        # No zeros [E] for alpha's (never used) gradient.
        ctx.set_materialize_grads(False)
        return out.to(v.dtype), alpha, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Optional[Tensor], _grad_alpha: Tensor,
                 grad_lse: Optional[Tensor]):
        if grad_out is None and grad_lse is None:  # no part in the loss
            return (None,) * 9
        q, k, v, alpha, keep, score = ctx.saved_tensors
        if grad_out is None:
            grad_out = v.new_zeros(q.size(0), v.size(1))
        graph, scale = ctx.graph, ctx.scale
        rowptr, col = graph.rowptr, graph.col
        weight = alpha if keep is None else alpha * keep
        grad_v = spmm_t(graph, weight, grad_out)
        grad_alpha = sddmm(rowptr, col, grad_out, v)  # [E]
        if keep is not None:
            grad_alpha.mul_(keep)
        # Softmax backward, in place: a_e (g_e - sum_{e' in row} a_e' g_e'
        # + dL/dlse_r), d lse_r / d s_e being a_e.
        row_dot = segment_sum(alpha * grad_alpha, rowptr)
        if grad_lse is not None:
            row_dot = row_dot - grad_lse.to(row_dot.dtype)
        grad_score = grad_alpha.sub_(row_dot.index_select(0, graph.row()))
        grad_score.mul_(alpha)
        grad_prob = None
        if ctx.prob_dtype is not None:
            grad_prob = ste_gradient(grad_score, score, ctx.ste)
            grad_prob = grad_prob.to(ctx.prob_dtype)
        grad_score.mul_(scale)
        grad_q = spmm(rowptr, col, grad_score, k)
        grad_k = spmm_t(graph, grad_score, q)
        return (None, grad_q.to(q.dtype), grad_k.to(k.dtype),
                grad_v.to(v.dtype), grad_prob, None, None, None, None)


class _ClipGrad(torch.autograd.Function):
    r"""Identity forward; backward clips the gradient to :math:`[-1, 1]`."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.clamp(-1.0, 1.0)


def clip_grad(x: Tensor) -> Tensor:
    r"""Identity whose gradient is clipped to :math:`[-1, 1]`: the
    published code's straight-through estimator on an edge probability."""
    return _ClipGrad.apply(x)
