r"""The fused CPU attention of the compiled extension as torch operators.

``sbm_pyg::sparse_attention`` computes scores, softmax and the weighted sum
of values in one pass per (head, query) row, and keeps only each row's
log-sum-exp :obj:`[R]` (and the output) for backward. Its backward,
``sbm_pyg::sparse_attention_backward``, goes once over the rows (query
gradient, the straight-through gradient :math:`\partial L / \partial p_e`
and its sum into :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`) and once over the
columns (key and value gradients and the sum into :math:`\hat{\mathbf{K}}`),
recomputing each edge's weight from its row's log-sum-exp as
FlashAttention does, with no atomics: the result does not depend on the
thread count. See
``csrc/attention/attention.cpp``.

The operators are defined in C++ (``TORCH_LIBRARY``); their autograd
formula and fake (meta) kernels are registered here, so that
:func:`torch.compile` traces :func:`fused_attention` and
:func:`torch.library.opcheck` can check it.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.ops.backend_info import WITH_EXTENSION
from sbm_pyg.ops.graph import CSRGraph

__all__ = ["fused_attention", "STE_CODES"]

# The estimators by the code the kernels take (the Triton kernels too):
# none, the paper's equation (dL/da_e * s_e), the published code's
# (clip(dL/da_e, -1, 1)).
STE_CODES = {None: 0, "paper": 1, "published": 2}


def fused_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                    edge_prob: Optional[Tensor] = None,
                    q_block: Optional[Tensor] = None,
                    k_memb: Optional[Tensor] = None, *, scale: float,
                    ste: Optional[str] = "paper", weights: bool = False
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""Softmax attention over the nonzeros of a CSR matrix, differentiable,
    with the straight-through gradient of the edge probabilities.

    The edge probabilities are given either as :obj:`edge_prob`, or as the
    factors of :math:`p_e = (\hat{\mathbf{Q}}\hat{\mathbf{S}})_{r(e)}
    \cdot \hat{\mathbf{K}}_{c(e)}`, :obj:`q_block` and :obj:`k_memb`, whose
    gradients the kernel sums directly, with no :obj:`[E]` tensor
    :math:`p`. Neither is read in the forward.

    Args:
        graph (CSRGraph): the edges; the op reads :obj:`rowptr`, :obj:`col`,
            :obj:`colptr` and :meth:`~sbm_pyg.ops.graph.CSRGraph.row_t`.
        q (Tensor): :obj:`[R, D]`, float32 or float64, contiguous.
        k (Tensor): :obj:`[C, D]`.
        v (Tensor): :obj:`[C, D_v]`.
        edge_prob (Tensor, optional): :obj:`[E]`.
        q_block (Tensor, optional): :obj:`[R, K]`.
        k_memb (Tensor, optional): :obj:`[C, K]`.
        scale (float): the scores' factor, :math:`1/\sqrt{D}`.
        ste (str, optional): :obj:`"paper"` or :obj:`"published"`.
        weights (bool): also return the attention weights (else
            :obj:`None`: nothing per edge is allocated in the forward).

    Returns:
        :obj:`(out [R, D_v], alpha [E] or None)`; :obj:`alpha` is not
        differentiable.
    """
    out, alpha, _ = torch.ops.sbm_pyg.sparse_attention(
        graph.rowptr, graph.col, graph.colptr, graph.row_t(), q, k, v,
        edge_prob, q_block, k_memb, float(scale), STE_CODES[ste], weights)
    return out, alpha.detach() if weights else None


def _fake_forward(rowptr, col, colptr, row_t, q, k, v, edge_prob, q_block,
                  k_memb, scale, ste, weights):
    return (q.new_empty(q.size(0), v.size(1)),
            q.new_empty(col.size(0) if weights else 0), q.new_empty(q.size(0)))


def _fake_backward(rowptr, col, colptr, row_t, q, k, v, out, lse, grad_out,
                   q_block, k_memb, scale, ste):
    memb = q_block is not None
    empty = q.new_empty(0)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty(col.size(0) if ste and not memb else 0),
            torch.empty_like(q_block) if memb else empty,
            torch.empty_like(k_memb) if memb else empty)


def _setup_context(ctx, inputs, output) -> None:
    (rowptr, col, colptr, row_t, q, k, v, edge_prob, q_block, k_memb, scale,
     ste, weights) = inputs
    out, _, lse = output
    ctx.save_for_backward(rowptr, col, colptr, row_t, q, k, v, out, lse,
                          q_block, k_memb)
    ctx.scale, ctx.ste = scale, ste
    # No zeros [E] for the gradient of alpha, which is never used.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out: Tensor, _grad_alpha: Tensor, _grad_lse: Tensor):
    (rowptr, col, colptr, row_t, q, k, v, out, lse, q_block,
     k_memb) = ctx.saved_tensors
    need = ctx.needs_input_grad
    if grad_out is None:  # the output took no part in the loss
        return (None,) * 13
    want_prob, want_memb = need[7], need[8] or need[9]
    ste = ctx.ste if want_prob or want_memb else 0
    grads = torch.ops.sbm_pyg.sparse_attention_backward(
        rowptr, col, colptr, row_t, q, k, v, out, lse, grad_out.contiguous(),
        q_block if want_memb else None, k_memb if want_memb else None,
        ctx.scale, ste)
    dq, dk, dv, dprob, dqb, dkm = grads
    return (None, None, None, None, dq if need[4] else None,
            dk if need[5] else None, dv if need[6] else None,
            dprob if want_prob else None, dqb if need[8] else None,
            dkm if need[9] else None, None, None, None)


if WITH_EXTENSION:
    torch.library.register_fake("sbm_pyg::sparse_attention")(_fake_forward)
    torch.library.register_fake("sbm_pyg::sparse_attention_backward")(
        _fake_backward)
    torch.library.register_autograd("sbm_pyg::sparse_attention", _backward,
                                    setup_context=_setup_context)
