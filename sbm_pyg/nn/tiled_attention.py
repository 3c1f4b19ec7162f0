r"""Attention over a graph drawn through a tile plan: the tiles as dense
batched products, the rest's edges by the sparse kernels, merged row by row
through their log-sum-exps.

For each (head, query) row :math:`i` with tile edges :math:`\mathcal{T}(i)`
and rest edges :math:`\mathcal{R}(i)` (disjoint,
:class:`~sbm_pyg.sampling.tiles.TiledGraph`):

.. math::
    \mathbf{o}_i = \frac{\sum_{j \in \mathcal{T}(i)} e^{a_{ij}} \mathbf{v}_j
    + e^{\mathrm{lse}^{\mathcal{R}}_i} \mathbf{o}^{\mathcal{R}}_i}
    {\sum_{j \in \mathcal{T}(i)} e^{a_{ij}} + e^{\mathrm{lse}^{\mathcal{R}}_i}},

with :math:`\mathbf{o}^{\mathcal{R}}` and :math:`\mathrm{lse}^{\mathcal{R}}`
the sparse kernels' output and log-sum-exp on the rest: the softmax over
the union, as :func:`~sbm_pyg.nn.functional.sparse_attention` computes it
on :meth:`TiledGraph.graph`, with the same straight-through gradients to
the SBM. This is the tiled regime in PyTorch: one batched product per tile
where the edge path gathers a row per edge, the estimator's gradients two
more per tile (:math:`O(t_q t_k k)`), the tiles' scores kept for backward
(:math:`8 P t_q t_k` bytes in float32 with the mask). No fused kernel
computes it yet, and :func:`~sbm_pyg.nn.sbm_attention` does not choose it:
it takes a graph drawn by :func:`~sbm_pyg.sampling.tiles.draw_tiled`.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn.functional import STE_MODES, check_sbm_shapes, edge_attention
from sbm_pyg.ops.backend_info import resolve_backend
from sbm_pyg.ops.csr import heads_first, nodes_first
from sbm_pyg.sampling.tiles import TiledGraph, tile_rows
from sbm_pyg.validation import require_tensor

__all__ = ["tiled_attention"]


class _TileEstimator(torch.autograd.Function):
    # The straight-through estimator on the tiles: the scores pass
    # unchanged, and each pair's probability p = (Q S)_i K_j^T takes the
    # gradient dL/ds * s ("paper") or clip(dL/ds, -1, 1) ("published"),
    # summed into Q S and K as two batched products per tile. The forward
    # never forms p: its value does not enter the output.

    @staticmethod
    def forward(ctx, score: Tensor, qs: Tensor, k_memb: Tensor, qi: Tensor,
                kj: Tensor, paper: bool) -> Tensor:
        ctx.save_for_backward(score, qs, k_memb, qi, kj)
        ctx.paper = paper
        return score.view_as(score)

    @staticmethod
    def backward(ctx, grad: Tensor):
        score, qs, k_memb, qi, kj = ctx.saved_tensors
        # Off the mask the scores' gradient is 0 (masked_fill's backward).
        g = grad * score if ctx.paper else grad.clamp(-1.0, 1.0)
        d_qs = torch.zeros_like(qs).index_add_(
            0, qi.flatten(), torch.bmm(g, k_memb[kj]).flatten(0, 1))
        d_k = torch.zeros_like(k_memb).index_add_(
            0, kj.flatten(), torch.bmm(g.transpose(1, 2), qs[qi]).flatten(0, 1))
        return grad, d_qs, d_k, None, None, None


def tiled_attention(query: Tensor, key: Tensor, value: Tensor,
                    tiled: TiledGraph, *,
                    sbm: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
                    ste: str = "paper", backend: Optional[str] = "auto") -> Tensor:
    r"""Softmax attention over the edges of :obj:`tiled` (see the module's
    text): equal to :func:`~sbm_pyg.nn.functional.sparse_attention` on
    :obj:`tiled.graph()`, its gradients included.

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        tiled (TiledGraph): the graph, from
            :func:`~sbm_pyg.sampling.tiles.draw_tiled`.
        sbm ((Tensor, Tensor, Tensor), optional): the SBM the graph was
            drawn from, for the straight-through gradient to each edge's
            probability :math:`p_{ij} = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}
            \hat{\mathbf{K}}_j^{\top}` (as :obj:`sparse_attention`'s).
        ste (str): :obj:`"paper"` or :obj:`"published"`, as
            :obj:`sparse_attention`'s.
        backend (str, optional): the rest's sparse kernel, as
            :obj:`sparse_attention`'s.

    Returns:
        Tensor :obj:`[N_q, H, D_v]`.

    Example:
        >>> from sbm_pyg.sampling.tiles import draw_tiled, plan_tiles
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]  # [6, 1, 2]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> tiled = draw_tiled(memb, block, memb, plan, mode="exact")
        >>> q = k = v = torch.randn(6, 1, 4)
        >>> tiled_attention(q, k, v, tiled).shape
        torch.Size([6, 1, 4])
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_tensor(name, x, 3, floating=True)
    Nq, H, D = query.shape
    rest = tiled.rest
    if (key.shape != (key.size(0), H, D) or value.shape[:2] != key.shape[:2]
            or (rest.num_queries, rest.num_keys, rest.num_heads)
            != (Nq, key.size(0), H)):
        raise ValueError(f"query [N_q, H, D], key [N_k, H, D] and value "
                         f"[N_k, H, D_v] must match each other and the "
                         f"graph's [{rest.num_queries}, {rest.num_keys}, "
                         f"{rest.num_heads}], got {tuple(query.shape)}, "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if ste not in STE_MODES:
        raise ValueError(f"ste must be one of {STE_MODES}, got {ste!r}")
    if sbm is not None:
        check_sbm_shapes(sbm, Nq, key.size(0), H)
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v = (heads_first(x.to(dtype)) for x in (query, key, value))
    scale = 1.0 / math.sqrt(D)

    # The rest: normalized output and log-sum-exp per heads-first row.
    out_r, _, lse_r = edge_attention(
        rest, q, k, v, None, sbm, scale, ste, False, 0.0, 0,
        resolve_backend("attention", backend, query.device))

    # The tiles: scores, the straight-through term, masked exponentials
    # relative to each row's largest tile score (a constant: it cancels).
    head, q_rows, k_rows = tile_rows(tiled.plan)
    qi = head[:, None] * Nq + q_rows.clamp(min=0)  # heads-first rows
    kj = head[:, None] * key.size(0) + k_rows.clamp(min=0)
    score = torch.bmm(q[qi], k[kj].transpose(1, 2)) * scale
    if sbm is not None:
        q_memb, block, k_memb = (x.to(dtype) for x in sbm)
        qs = torch.bmm(q_memb.transpose(0, 1), block).reshape(H * Nq, -1)
        score = _TileEstimator.apply(score, qs, heads_first(k_memb), qi, kj,
                                     ste == "paper")
    score = score.masked_fill(~tiled.mask, -math.inf)
    R = H * Nq
    top = score.new_full((R,), -math.inf).scatter_reduce(
        0, qi.flatten(), score.detach().amax(-1).flatten(), "amax")
    # A row with no rest edge takes no weight from it (the Triton kernel
    # writes its log-sum-exp as 0, the others as -inf).
    has_rest = rest.csr.rowptr.diff() > 0
    lse_r = torch.where(has_rest, lse_r, -math.inf)
    # The merge's reference point: the larger of the two parts' maxima.
    ref = torch.maximum(top, lse_r.detach())
    ref = torch.where(torch.isfinite(ref), ref, 0.0)
    weight = torch.exp(score - ref[qi][..., None])  # 0 off the mask
    num = q.new_zeros(R, v.size(-1)).index_add_(
        0, qi.flatten(), torch.bmm(weight, v[kj]).flatten(0, 1))
    den = q.new_zeros(R).index_add_(0, qi.flatten(), weight.sum(-1).flatten())
    rest_weight = torch.exp(lse_r - ref)  # 0 for a row with no rest edge
    total = den + rest_weight
    total = torch.where(total > 0, total, 1.0)  # a row with no edge: 0
    out = (num + rest_weight[:, None] * out_r) / total[:, None]
    return nodes_first(out.to(value.dtype), H)
