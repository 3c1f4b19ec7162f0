r"""The dense-regime SBM attention as one torch operator, for (sequence,
head) pairs whose sampled graph is dense.

Where a head attends densely, a graph costs more than it saves: the sparse
path pays per edge (drawing each pair, gathering rows, scattering the
membership gradients), dense attention a few operations per pair in matrix
products. ``sbm_pyg::dense_attention`` samples the mask and computes the
masked softmax attention block by block of query rows with matrix products,
and never builds the graph:

.. math::
    \mathbf{P} = \hat{\mathbf{Q}}\hat{\mathbf{S}}\hat{\mathbf{K}}^{\top},
    \quad m_{ij} \sim \mathrm{Bernoulli}(\min(p_{ij} + \delta, 1))
    \ \text{(exact) or}\ 1 - e^{-(p_{ij} + \delta)} \ \text{(poisson)},
    \quad \mathbf{out}_i = \sum_{j: m_{ij} = 1}
    \mathrm{softmax}_j(s_{ij}) \mathbf{v}_j.

Each row's trials read the row's sampler stream at the counters a dense row
of :func:`~sbm_pyg.sampling.fastrg` reads, so both paths sample the same
distribution (and the same graph up to rounding in :math:`p`); self-loops
and included pairs are added as the sampler adds them. The mask is kept as
one bit per (query, key) pair of a sequence for backward, which recomputes
the scores and weights from it and the rows' log-sum-exp and passes the
straight-through gradients to :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}` and
:math:`\hat{\mathbf{K}}` as matrix products
(:math:`\mathbf{G}\hat{\mathbf{K}}` and
:math:`\mathbf{G}^{\top}\hat{\mathbf{Q}}\hat{\mathbf{S}}`).

The CPU kernels are the compiled extension's (``csrc/attention/dense.cpp``),
the CUDA kernels the Triton twins of :mod:`sbm_pyg.ops.triton_dense`: the
same schema, the same row streams, so the same mask for the same seed.
Under ``TRITON_INTERPRET=1`` (tests without a GPU) the Triton kernels are
also registered for CPU tensors as the twin operators
``sbm_pyg::triton_dense_attention`` and ``_backward``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from sbm_pyg.ops.dropout import as_seed, dropout_arguments
from sbm_pyg.ops.library import OpSpec, define_autograd_ops
from sbm_pyg.ops.torch_attention import STE_CODES

__all__ = ["DenseAttention", "PRECISION_CODES", "dense_attention",
           "mask_bytes", "mask_keys", "matmul_precision"]

_SCHEMA = ("(Tensor ptr_q, Tensor ptr_k, Tensor inc_ptr, Tensor inc_col, "
           "Tensor q, Tensor k, Tensor v, Tensor q_block, Tensor k_memb, "
           "int heads, float delta, bool exact, bool self_loops, Tensor seed, "
           "float scale, int ste, Tensor? dropout_seed=None, "
           "int dropout_threshold=0, int precision=0, int mask_bytes=-1) -> "
           "(Tensor, Tensor, Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor ptr_q, Tensor ptr_k, Tensor q, Tensor k, "
                    "Tensor v, Tensor q_block, Tensor k_memb, Tensor mask, "
                    "Tensor out, Tensor lse, Tensor grad_out, int heads, "
                    "float scale, int ste, Tensor? dropout_seed=None, "
                    "int dropout_threshold=0, int precision=0, "
                    "Tensor? grad_lse=None) -> (Tensor, Tensor, Tensor, Tensor, "
                    "Tensor)")

# The products' precision on the GPU, by code in the schema.
PRECISION_CODES = {"ieee": 0, "tf32": 1, "bfloat16": 2, "float16": 3}


class DenseAttention(NamedTuple):
    r"""What :func:`dense_attention` returns: the output :obj:`[R, D_v]`,
    the edge count of each (sequence, head) :obj:`[G, H]`, and the mask
    (uint8, for each sequence :math:`g`, head and query a row of
    :math:`\lceil n_k / 8 \rceil` bytes, key :math:`j` in bit :math:`j \bmod
    8` of byte :math:`\lfloor j / 8 \rfloor`), and each row's log-sum-exp
    :obj:`[R]` of its scores (:math:`-\infty` for a row with no edge),
    differentiable, as an attention sink needs."""

    out: Tensor
    edges: Tensor
    mask: Tensor
    lse: Tensor


def matmul_precision(dtype: torch.dtype) -> str:
    r"""The :obj:`precision` of :func:`dense_attention` that does what
    PyTorch's matmuls do for inputs of :obj:`dtype`: bfloat16 and float16
    products for those dtypes (autocast's included), TF32 for float32 where
    :obj:`torch.backends.cuda.matmul.fp32_precision` (or the global
    :obj:`torch.backends.fp32_precision` it defaults to) says
    :obj:`"tf32"`, else :obj:`"ieee"`."""
    half = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype in half:
        return half[dtype]
    fp32 = torch.backends.cuda.matmul.fp32_precision
    if fp32 == "none":
        fp32 = getattr(torch.backends, "fp32_precision", "none")  # (no stub)
    return "tf32" if dtype == torch.float32 and fp32 == "tf32" else "ieee"


def mask_bytes(ptr_q: Tensor, ptr_k: Tensor, heads: int) -> Tensor:
    r"""The bytes of the mask of each sequence :obj:`[G]`: heads × queries ×
    :math:`\lceil n_k / 8 \rceil`."""
    return heads * ptr_q.diff() * ((ptr_k.diff() + 7) // 8)


def mask_keys(mask: Tensor, ptr_q: Tensor, ptr_k: Tensor, heads: int
              ) -> Tensor:
    r"""The sorted edge keys :math:`(h N_q + i) N_k + j` of a
    :class:`DenseAttention` mask: the graph it sampled, for inspection
    (:math:`O(\text{pairs})`, a bit per pair)."""
    Nq, Nk = int(ptr_q[-1]), int(ptr_k[-1])
    nq, nk = ptr_q.diff(), ptr_k.diff()
    row_bytes = (nk + 7) // 8
    sizes = mask_bytes(ptr_q, ptr_k, heads)
    base = torch.cumsum(sizes, 0) - sizes  # first byte of each sequence
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    pos = ((mask[:, None] >> shifts) & 1).flatten().nonzero().flatten()
    byte = pos // 8
    g = torch.searchsorted(base, byte, right=True) - 1
    offset = byte - base[g]
    row = offset // row_bytes[g]
    j = (offset % row_bytes[g]) * 8 + pos % 8
    h, i = row // nq[g], row % nq[g]
    key = (h * Nq + ptr_q[g] + i) * Nk + ptr_k[g] + j
    return torch.sort(key).values


def dense_attention(q: Tensor, k: Tensor, v: Tensor, q_block: Tensor,
                    k_memb: Tensor, ptr_q: Tensor, ptr_k: Tensor, *,
                    heads: int, scale: float, seed: Union[int, Tensor],
                    mode: str = "exact",
                    exploration: float = 0.0, self_loops: bool = False,
                    included: Optional[Tuple[Tensor, Tensor]] = None,
                    ste: Optional[str] = "paper", dropout: float = 0.0,
                    dropout_seed: Union[int, Tensor, None] = None,
                    precision: str = "ieee",
                    mask_bytes: Optional[int] = None,
                    triton_on_cpu: bool = False) -> DenseAttention:
    r"""Samples the SBM's mask of every (sequence, head) and computes the
    masked softmax attention over it, differentiable in :obj:`q`, :obj:`k`,
    :obj:`v` and, through the straight-through estimator :obj:`ste`, in
    :obj:`q_block` and :obj:`k_memb`.

    Rows are heads-first, as in
    :func:`~sbm_pyg.ops.fused_attention.fused_attention`: row
    :math:`h N_q + i` of :obj:`q` and :obj:`q_block`, row :math:`h N_k + j`
    of :obj:`k`, :obj:`v` and :obj:`k_memb`.

    Args:
        q (Tensor): :obj:`[H * N_q, D]`, float32 or float64, contiguous.
        k (Tensor): :obj:`[H * N_k, D]`.
        v (Tensor): :obj:`[H * N_k, D_v]`.
        q_block (Tensor): :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`
            :obj:`[H * N_q, K]`.
        k_memb (Tensor): :math:`\hat{\mathbf{K}}` :obj:`[H * N_k, K]`.
        ptr_q (LongTensor): :obj:`[G + 1]` sequences of the queries.
        ptr_k (LongTensor): :obj:`[G + 1]` sequences of the keys.
        heads (int): :math:`H`.
        scale (float): the scores' factor.
        seed (int or Tensor): the row streams' seed, in :math:`[0,
            2^{62})` (:func:`~sbm_pyg.sampling.fastrg_op.stream_seed`): a
            one-element int64 tensor on the device, which the kernels read
            there (a captured graph draws a new one each replay), or an int
            (:func:`~sbm_pyg.ops.dropout.as_seed`).
        mode (str): :obj:`"exact"` or :obj:`"poisson"`.
        exploration (float): :math:`\delta`.
        self_loops (bool): query :math:`i` always attends to key :math:`i`.
        included (tuple, optional): :obj:`(inc_ptr [N_q + 1], inc_col)`,
            the included keys (global indices) of each query.
        ste (str, optional): :obj:`"paper"`, :obj:`"published"` or
            :obj:`None` (no gradient to the memberships).
        dropout (float): dropout on the attention weights, by counter
            (:mod:`sbm_pyg.ops.dropout`): the sparse kernels' mask for the
            same seed and (row, column).
        dropout_seed (int or Tensor, optional): its seed, as
            :obj:`seed`; needed with :obj:`dropout`.
        precision (str): the GPU kernels' products for float32 inputs:
            :obj:`"ieee"` (exact float32 products, no tensor cores),
            :obj:`"tf32"`, :obj:`"bfloat16"` or :obj:`"float16"` (on tensor
            cores, accumulated in float32): the scores, outputs and
            gradients in that precision, the mask's probabilities
            :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}\hat{\mathbf{K}}^{\top}`
            in three-pass TF32 (near float32: the draws compare them with
            uniforms). float64 and the CPU kernels compute every product in
            the inputs' dtype whatever it says.
        mask_bytes (int, optional): the mask's size in bytes
            (:func:`mask_bytes` summed), where the caller has read it: the
            GPU kernel then allocates the mask without a host read of its
            own (checked on the device); :obj:`None`: read it.
        triton_on_cpu (bool): run the Triton kernels on CPU tensors (the
            twin operator, only under ``TRITON_INTERPRET=1``).

    Returns:
        :class:`DenseAttention`.

    Example:
        >>> H, N = 2, 6
        >>> q = k = v = torch.randn(H * N, 4)  # heads-first rows
        >>> memb = torch.ones(H * N, 3)  # p = 3 >= 1: every pair sampled
        >>> res = dense_attention(q, k, v, memb, memb, torch.tensor([0, N]),
        ...                       torch.tensor([0, N]), heads=H, scale=0.5,
        ...                       seed=0)
        >>> res.out.shape, res.edges.tolist()  # [R, D_v], edges [G, H]
        (torch.Size([12, 4]), [[36, 36]])
    """
    inc_ptr, inc_col = included if included is not None else (
        ptr_q.new_empty(0), ptr_q.new_empty(0))
    drop_seed, threshold = dropout_arguments(dropout, dropout_seed, q.device)
    op = (torch.ops.sbm_pyg.triton_dense_attention if triton_on_cpu
          else torch.ops.sbm_pyg.dense_attention)
    out, lse, mask, edges = op(
        ptr_q, ptr_k, inc_ptr, inc_col, q, k, v, q_block, k_memb, heads,
        float(exploration), mode == "exact", self_loops,
        as_seed("seed", seed, q.device), float(scale), STE_CODES[ste],
        drop_seed, threshold,
        _precision_code(precision), -1 if mask_bytes is None else int(mask_bytes))
    return DenseAttention(out, edges, mask, lse)


def _precision_code(precision: str) -> int:
    if precision not in PRECISION_CODES:
        raise ValueError(f"dense_attention: precision must be one of "
                         f"{sorted(PRECISION_CODES)}, got {precision!r}")
    return PRECISION_CODES[precision]


def _fake_forward(ptr_q, ptr_k, inc_ptr, inc_col, q, k, v, q_block, k_memb,
                  heads, delta, exact, self_loops, seed, scale, ste,
                  dropout_seed=None, dropout_threshold=0, precision=0, mask_bytes=-1):
    size = (mask_bytes if mask_bytes >= 0
            else torch.library.get_ctx().new_dynamic_size())
    return (q.new_empty(q.size(0), v.size(1)), q.new_empty(q.size(0)),
            q.new_empty(size, dtype=torch.uint8),
            q.new_empty(ptr_q.size(0) - 1, heads, dtype=torch.long))


def _fake_backward(ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out, lse,
                   grad_out, heads, scale, ste, dropout_seed=None,
                   dropout_threshold=0, precision=0, grad_lse=None):
    memb = (torch.empty_like(q_block), torch.empty_like(k_memb)) if ste else (
        q.new_empty(0), q.new_empty(0))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            *memb)


def _triton_forward(ptr_q, ptr_k, inc_ptr, inc_col, q, k, v, q_block,
                    k_memb, heads, delta, exact, self_loops, seed, scale, ste,
                    dropout_seed=None, dropout_threshold=0, precision=0, mask_bytes=-1):
    from sbm_pyg.ops.triton_dense import dense_forward
    _check("sbm_pyg::dense_attention", q, k, v, q_block, k_memb, heads,
           precision)
    return dense_forward(ptr_q, ptr_k, inc_ptr, inc_col, q, k, v, q_block,
                         k_memb, heads, delta, exact, self_loops, seed, scale,
                         dropout_seed, dropout_threshold, precision, mask_bytes)


def _triton_backward(ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out, lse,
                     grad_out, heads, scale, ste, dropout_seed=None,
                     dropout_threshold=0, precision=0, grad_lse=None):
    from sbm_pyg.ops.triton_dense import dense_backward
    _check("sbm_pyg::dense_attention_backward", q, k, v, q_block, k_memb,
           heads, precision)
    return dense_backward(ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out,
                          lse, grad_out, heads, scale, ste, dropout_seed,
                          dropout_threshold, precision, grad_lse)


def _check(op: str, q: Tensor, k: Tensor, v: Tensor, q_block: Tensor,
           k_memb: Tensor, heads: int, precision: int) -> None:
    # The CPU kernel's argument checks (csrc/attention/dense.cpp), for the
    # Triton kernels.
    xs = (q, k, v, q_block, k_memb)
    if not all(x.dim() == 2 and x.is_contiguous() and x.dtype == q.dtype
               for x in xs) or q.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{op}: q, k, v, q_block, k_memb must be "
                           f"contiguous 2-D float32 or float64 tensors of "
                           f"one dtype")
    if precision not in PRECISION_CODES.values():
        raise RuntimeError(f"{op}: unknown precision code {precision}")
    if heads < 1 or q.size(0) % heads or k.size(0) % heads or not (
            k.size(0) == v.size(0) and q.size(1) == k.size(1)
            and q_block.size(0) == q.size(0)
            and k_memb.size(0) == k.size(0)
            and q_block.size(1) == k_memb.size(1)):
        raise RuntimeError(f"{op}: q [R, D], k [C, D], v [C, Dv], q_block "
                           f"[R, K], k_memb [C, K] expected, R and C "
                           f"multiples of heads")


def _setup_context(ctx, inputs, output) -> None:
    # The dispatcher leaves out trailing arguments at their defaults.
    (ptr_q, ptr_k, _, _, q, k, v, q_block, k_memb, heads, _, _, _, _, scale,
     ste, dropout_seed, dropout_threshold, precision,
     _) = tuple(inputs) + (None, 0, 0, -1)[len(inputs) - 16:]
    out, lse, mask, _ = output
    ctx.save_for_backward(ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out,
                          lse, dropout_seed)
    ctx.heads, ctx.scale, ctx.ste = heads, scale, ste
    ctx.rest = (dropout_threshold, precision)
    ctx.set_materialize_grads(False)


def _autograd(backward_op):
    def backward(ctx, grad_out: Optional[Tensor], grad_lse: Optional[Tensor],
                 *_):
        if grad_out is None and grad_lse is None:  # no part in the loss
            return (None,) * 20
        (ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out,
         lse, dropout_seed) = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is not None:  # an attention sink's
            grad_lse = grad_lse.to(lse.dtype).contiguous()
        need = ctx.needs_input_grad
        ste = ctx.ste if need[7] or need[8] else 0
        dq, dk, dv, dqb, dkm = backward_op(
            ptr_q, ptr_k, q, k, v, q_block, k_memb, mask, out, lse,
            grad_out.contiguous(), ctx.heads, ctx.scale, ste, dropout_seed,
            *ctx.rest, grad_lse)
        return (None, None, None, None, dq if need[4] else None,
                dk if need[5] else None, dv if need[6] else None,
                dqb if need[7] and ste else None,
                dkm if need[8] and ste else None) + (None,) * 11
    return backward


# The CPU kernels come from the extension (TORCH_LIBRARY_IMPL in
# csrc/bindings.cpp), the CUDA ones from sbm_pyg/ops/triton_dense.py.
_OPS: OpSpec = {
    "dense_attention": (_SCHEMA, _fake_forward, _triton_forward),
    "dense_attention_backward": (_BACKWARD_SCHEMA, _fake_backward,
                                 _triton_backward),
}


define_autograd_ops(_OPS, "dense_attention", _autograd, _setup_context)
