r"""The fused sparse attention as one torch operator with a kernel per
device.

``sbm_pyg::sparse_attention`` computes scores, softmax, attention dropout
(by counter, :mod:`sbm_pyg.ops.dropout`) and the weighted sum of values in
one pass per (head, query) row, and keeps only each row's
log-sum-exp :obj:`[R]` (and the output) for backward. Its backward,
``sbm_pyg::sparse_attention_backward``, goes once over the rows (query
gradient, the straight-through gradient :math:`\partial L / \partial p_e`
and its sum into :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`) and once over the
columns (key and value gradients and the sum into :math:`\hat{\mathbf{K}}`),
recomputing each edge's weight from its row's log-sum-exp as
FlashAttention does, with no atomics.

The schemas are defined here, once; the CPU kernels are the compiled
extension's (``csrc/attention/attention.cpp``), the CUDA kernels the Triton
ones of :mod:`sbm_pyg.ops.triton_attention`. The autograd formula and the
fake (meta) kernels are registered once for both, so that
:func:`torch.compile` traces :func:`fused_attention` on either device and
:func:`torch.library.opcheck` can check it.

Under ``TRITON_INTERPRET=1`` (tests without a GPU), the Triton kernels are
also registered for CPU tensors as a twin operator,
``sbm_pyg::triton_sparse_attention``, with the same autograd formula and
fake kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from sbm_pyg.ops.csr import row_index, sddmm
from sbm_pyg.ops.dropout import dropout_arguments
from sbm_pyg.ops.graph import CSRGraph
from sbm_pyg.ops.library import OpSpec, define_autograd_ops
from sbm_pyg.ops.torch_attention import STE_CODES

__all__ = ["fused_attention"]

_GRAPH = "Tensor rowptr, Tensor col, Tensor colptr, Tensor row_t"
_SCHEMAS = {
    "": (f"({_GRAPH}, Tensor q, Tensor k, Tensor v, Tensor? edge_prob, "
         "Tensor? q_block, Tensor? k_memb, float scale, int ste, "
         "bool weights, Tensor? dropout_seed=None, int dropout_threshold=0) -> "
         "(Tensor, Tensor, Tensor)"),
    "_backward": (f"({_GRAPH}, Tensor q, Tensor k, Tensor v, Tensor out, "
                  "Tensor lse, Tensor grad_out, Tensor? q_block, "
                  "Tensor? k_memb, float scale, int ste, "
                  "Tensor? dropout_seed=None, int dropout_threshold=0, "
                  "Tensor? grad_lse=None) -> (Tensor, Tensor, Tensor, Tensor, "
                  "Tensor, Tensor)"),
}
_STE_NAMES = {code: name for name, code in STE_CODES.items()}


def fused_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                    edge_prob: Optional[Tensor] = None,
                    q_block: Optional[Tensor] = None,
                    k_memb: Optional[Tensor] = None, *, scale: float,
                    ste: Optional[str] = "paper", weights: bool = False,
                    dropout: float = 0.0,
                    dropout_seed: Union[int, Tensor, None] = None,
                    triton_on_cpu: bool = False,
                    ) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    r"""Softmax attention over the nonzeros of a CSR matrix, differentiable,
    with the straight-through gradient of the edge probabilities.

    The edge probabilities are given either as :obj:`edge_prob`, or as the
    factors of :math:`p_e = (\hat{\mathbf{Q}}\hat{\mathbf{S}})_{r(e)}
    \cdot \hat{\mathbf{K}}_{c(e)}`, :obj:`q_block` and :obj:`k_memb`, whose
    gradients the kernels sum directly, with no :obj:`[E]` tensor
    :math:`p`. Neither is read in the forward.

    Args:
        graph (CSRGraph): the edges; the op reads :obj:`rowptr`, :obj:`col`,
            :obj:`colptr` and :meth:`~sbm_pyg.ops.graph.CSRGraph.row_t`.
        q (Tensor): :obj:`[R, D]`, contiguous: float32 or float64, or (the
            Triton kernels) float16 or bfloat16, computed in float32.
        k (Tensor): :obj:`[C, D]`.
        v (Tensor): :obj:`[C, D_v]`.
        edge_prob (Tensor, optional): :obj:`[E]`.
        q_block (Tensor, optional): :obj:`[R, K]`.
        k_memb (Tensor, optional): :obj:`[C, K]`.
        scale (float): the scores' factor, :math:`1/\sqrt{D}`.
        ste (str, optional): :obj:`"paper"` or :obj:`"published"`.
        weights (bool): also return the attention weights (else
            :obj:`None`: nothing per edge is allocated in the forward),
            before dropout.
        dropout (float): dropout on the attention weights, by counter
            (:mod:`sbm_pyg.ops.dropout`): the mask is a function of
            :obj:`dropout_seed` and each edge's (row, column), which the
            backward recomputes.
        dropout_seed (int or Tensor, optional): the mask's seed, in
            :math:`[0, 2^{62})`, needed with :obj:`dropout`: a one-element
            int64 tensor on :obj:`q`'s device, which the kernels read there
            (never on the host: a captured graph draws a new one each
            replay), or an int (:func:`~sbm_pyg.ops.dropout.as_seed`).
        triton_on_cpu (bool): run the Triton kernels on CPU tensors (the
            twin operator, only under ``TRITON_INTERPRET=1``).

    Returns:
        :obj:`(out [R, D_v], alpha [E] or None, lse [R])`: :obj:`alpha` is
        not differentiable; :obj:`lse`, each row's log-sum-exp of its scores
        (:math:`-\infty` for a row with no edge; float32 for half precision
        rows), is, as an attention sink needs
        (:func:`~sbm_pyg.nn.functional.sparse_attention`).
    """
    seed, threshold = dropout_arguments(dropout, dropout_seed, q.device)
    op = (torch.ops.sbm_pyg.triton_sparse_attention if triton_on_cpu
          else torch.ops.sbm_pyg.sparse_attention)
    out, alpha, lse = op(graph.rowptr, graph.col, graph.colptr, graph.row_t(),
                         q, k, v, edge_prob, q_block, k_memb, float(scale),
                         STE_CODES[ste], weights, seed, threshold)
    return out, alpha.detach() if weights else None, lse


def _triton_forward(rowptr, col, colptr, row_t, q, k, v, edge_prob, q_block,
                    k_memb, scale, ste, weights, dropout_seed=None,
                    dropout_threshold=0):
    from sbm_pyg.ops.triton_attention import attention_forward
    out, lse = attention_forward(rowptr, col, q, k, v, scale, dropout_seed,
                                 dropout_threshold)
    alpha = q.new_empty(0)
    if weights:  # recomputed from the log-sum-exp: the kernel keeps none
        # with the scale the kernel used, rounded to the accumulation dtype,
        # as the log-sum-exp was made with it
        kernel_scale = float(torch.tensor(scale, dtype=lse.dtype, device="cpu"))
        score = sddmm(rowptr, col, q, k, kernel_scale)
        row = row_index(rowptr, col.numel())
        alpha = score.sub_(lse.to(score.dtype)[row]).exp_().to(q.dtype)
    return out, alpha, lse


def _triton_backward(rowptr, col, colptr, row_t, q, k, v, out, lse, grad_out,
                     q_block, k_memb, scale, ste, dropout_seed=None,
                     dropout_threshold=0, grad_lse=None):
    from sbm_pyg.ops.triton_attention import attention_backward
    dq, dk, dv, dprob, dqb, dkm = attention_backward(
        rowptr, col, colptr, row_t, q, k, v, out, lse, grad_out, scale,
        _STE_NAMES[ste], q_block, k_memb, dropout_seed, dropout_threshold,
        grad_lse)
    empty = q.new_empty(0)
    return (dq, dk, dv, empty if dprob is None else dprob,
            empty if dqb is None else dqb, empty if dkm is None else dkm)


def _accumulation(q: Tensor) -> torch.dtype:
    # The kernels accumulate half precision inputs in float32: the row
    # log-sum-exp and the edge gradients are kept in it.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _fake_forward(rowptr, col, colptr, row_t, q, k, v, edge_prob, q_block,
                  k_memb, scale, ste, weights, dropout_seed=None,
                  dropout_threshold=0):
    return (v.new_empty(q.size(0), v.size(1)),
            q.new_empty(col.size(0) if weights else 0),
            q.new_empty(q.size(0), dtype=_accumulation(q)))


def _fake_backward(rowptr, col, colptr, row_t, q, k, v, out, lse, grad_out,
                   q_block, k_memb, scale, ste, dropout_seed=None,
                   dropout_threshold=0, grad_lse=None):
    memb = q_block is not None
    empty = q.new_empty(0)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty(col.size(0) if ste and not memb else 0,
                        dtype=_accumulation(q)),
            torch.empty_like(q_block) if memb else empty,
            torch.empty_like(k_memb) if memb else empty)


def _setup_context(ctx, inputs, output) -> None:
    # The dispatcher leaves out trailing arguments at their defaults.
    (rowptr, col, colptr, row_t, q, k, v, edge_prob, q_block, k_memb, scale,
     ste, weights, dropout_seed, dropout_threshold) = (
        tuple(inputs) + (None, 0)[len(inputs) - 13:])
    out, _, lse = output
    ctx.save_for_backward(rowptr, col, colptr, row_t, q, k, v, out, lse,
                          q_block, k_memb, dropout_seed)
    ctx.scale, ctx.ste, ctx.threshold = scale, ste, dropout_threshold
    # No zeros [E] for the gradient of alpha, which is never used.
    ctx.set_materialize_grads(False)


def _autograd(backward_op):
    def backward(ctx, grad_out: Optional[Tensor], _grad_alpha: Tensor,
                 grad_lse: Optional[Tensor]):
        if grad_out is None and grad_lse is None:  # no part in the loss
            return (None,) * 15
        (rowptr, col, colptr, row_t, q, k, v, out, lse, q_block,
         k_memb, dropout_seed) = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is not None:  # an attention sink's: in lse's dtype
            grad_lse = grad_lse.to(lse.dtype).contiguous()
        need = ctx.needs_input_grad
        want_prob, want_memb = need[7], need[8] or need[9]
        ste = ctx.ste if want_prob or want_memb else 0
        dq, dk, dv, dprob, dqb, dkm = backward_op(
            rowptr, col, colptr, row_t, q, k, v, out, lse,
            grad_out.contiguous(), q_block if want_memb else None,
            k_memb if want_memb else None, ctx.scale, ste, dropout_seed,
            ctx.threshold, grad_lse)
        return (None, None, None, None, dq if need[4] else None,
                dk if need[5] else None, dv if need[6] else None,
                dprob if want_prob else None, dqb if need[8] else None,
                dkm if need[9] else None, None, None, None, None, None)
    return backward


_OPS: OpSpec = {
    "sparse_attention": (_SCHEMAS[""], _fake_forward, _triton_forward),
    "sparse_attention_backward": (_SCHEMAS["_backward"], _fake_backward,
                                  _triton_backward),
}


define_autograd_ops(_OPS, "sparse_attention", _autograd, _setup_context)
