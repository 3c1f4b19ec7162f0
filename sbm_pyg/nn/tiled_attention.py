r"""Attention over a graph drawn through a tile plan: the tiles as dense
batched products, the rest's edges by the sparse kernels, merged row by row
through their log-sum-exps.

For each (head, query) row :math:`i` with tile edges :math:`\mathcal{T}(i)`
and rest edges :math:`\mathcal{R}(i)` (disjoint,
:class:`~sbm_pyg.sampling.tiled_graph.TiledGraph`):

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
(:math:`8 P t_q t_k` bytes in float32 with the mask): the fallback of
:func:`tiled_sbm_attention` where the dense-regime kernel does not run,
on a graph drawn by :func:`~sbm_pyg.sampling.tiled_graph.draw_tiled`.

:func:`tiled_sbm_attention` draws and attends in one pass where the
dense-regime kernel runs (:func:`~sbm_pyg.ops.dense_attention`: the
extension's on the CPU, Triton's on CUDA): the tiles laid out as its
sequences (:func:`~sbm_pyg.sampling.tiles.tile_sequences`, a query tile
against the keys of its active tile pairs), each pair drawn by the
kernel's counter-based stream and attended with matrix products, the
straight-through gradients as its products
(:math:`\mathbf{G}\hat{\mathbf{K}}`, :math:`\mathbf{G}^{\top}
\hat{\mathbf{Q}}\hat{\mathbf{S}}`); the rest as above, merged by the
two parts' log-sum-exps.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.utils.sparse import ptr2index

from sbm_pyg.nn.functional import STE_MODES, check_sbm_shapes, edge_attention, sbm_factors
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend
from sbm_pyg.ops.csr import heads_first, nodes_first
from sbm_pyg.ops.dense_attention import dense_attention, mask_keys, matmul_precision
from sbm_pyg.sampling.fastrg_op import included_csr, stream_seed
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.sampling.tiled_graph import TiledGraph, draw_rest, draw_tiled
from sbm_pyg.sampling.tiles import (
    TilePlan,
    check_plan,
    plan_tiles,
    tile_rows,
    tile_sequences,
)
from sbm_pyg.validation import Check, check_generator, require_tensor, sync

if TYPE_CHECKING:  # the options import this module's package
    from sbm_pyg.nn.options import SBMAttentionOptions

__all__ = ["tiled_attention", "tiled_sbm_attention", "tiled_parts", "tiled_regime"]


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
            :func:`~sbm_pyg.sampling.tiled_graph.draw_tiled`.
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
        >>> from sbm_pyg.sampling.tiled_graph import draw_tiled
        >>> from sbm_pyg.sampling.tiles import plan_tiles
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]  # [6, 1, 2]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> tiled = draw_tiled(memb, block, memb, plan, mode="exact")
        >>> q = k = v = torch.randn(6, 1, 4)
        >>> tiled_attention(q, k, v, tiled).shape
        torch.Size([6, 1, 4])
    """
    rest = tiled.rest
    _check_qkv(query, key, value, rest.num_queries, rest.num_keys, rest.num_heads)
    Nq, H, D = query.shape
    if ste not in STE_MODES:
        raise ValueError(f"ste must be one of {STE_MODES}, got {ste!r}")
    if sbm is not None:
        check_sbm_shapes(sbm, Nq, key.size(0), H)
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v = (heads_first(x.to(dtype)) for x in (query, key, value))
    scale = 1.0 / math.sqrt(D)

    # The SBM's factors, the straight-through gradients' (one product for
    # the rest's edges and the tiles).
    factors = None if sbm is None else sbm_factors(sbm, dtype)
    # The rest: normalized output and log-sum-exp per heads-first row.
    out_r, _, lse_r = edge_attention(
        rest, q, k, v, None, factors, scale, ste, False, 0.0, 0,
        resolve_backend("attention", backend, query.device))

    # The tiles: scores, the straight-through term, masked exponentials
    # relative to each row's largest tile score (a constant: it cancels).
    head, q_rows, k_rows = tile_rows(tiled.plan)
    qi = head[:, None] * Nq + q_rows.clamp(min=0)  # heads-first rows
    kj = head[:, None] * key.size(0) + k_rows.clamp(min=0)
    score = torch.bmm(q[qi], k[kj].transpose(1, 2)) * scale
    if factors is not None:
        score = _TileEstimator.apply(score, *factors, qi, kj, ste == "paper")
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


def _check_qkv(query: Tensor, key: Tensor, value: Tensor, Nq: int, Nk: int,
               H: int) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        require_tensor(name, x, 3, floating=True)
    D = query.size(2)
    if (query.shape[:2] != (Nq, H) or key.shape != (Nk, H, D)
            or value.shape[:2] != (Nk, H)):
        raise ValueError(f"query [N_q, H, D], key [N_k, H, D] and value "
                         f"[N_k, H, D_v] must match each other and the "
                         f"graph's [N_q, N_k, H] = [{Nq}, {Nk}, {H}], got "
                         f"{tuple(query.shape)}, {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")


def _merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    # The softmax over two disjoint edge sets from each one's normalized
    # output and log-sum-exp (-inf for a row with none of its edges).
    ref = torch.maximum(lse_a, lse_b).detach()
    ref = torch.where(torch.isfinite(ref), ref, 0.0)
    w_a, w_b = torch.exp(lse_a - ref), torch.exp(lse_b - ref)
    total = w_a + w_b
    total = torch.where(total > 0, total, 1.0)  # a row with no edge: 0
    return (w_a[:, None] * out_a + w_b[:, None] * out_b) / total[:, None]


def tiled_sbm_attention(query: Tensor, key: Tensor, value: Tensor,
                        sbm: Tuple[Tensor, Tensor, Tensor], plan: TilePlan, *,
                        mode: str = "poisson", exploration: float = 0.0,
                        self_loops: bool = False, ste: Optional[str] = "paper",
                        generator: Optional[torch.Generator] = None,
                        backend: Optional[str] = "auto", return_graph: bool = False
                        ) -> Union[Tensor, Tuple[Tensor, SampledGraph]]:
    r"""The SBM's attention drawn and computed through :obj:`plan` (made by
    :func:`~sbm_pyg.sampling.tiles.plan_tiles` from the same SBM): a graph
    of :func:`~sbm_pyg.sampling.fastrg`'s law, the softmax over its edges
    and the straight-through gradients to the SBM, as
    :func:`~sbm_pyg.nn.functional.sparse_attention` computes them on it.
    The tiles run on the dense-regime kernel (the module's text) where it
    runs on the device, else through
    :func:`~sbm_pyg.sampling.tiled_graph.draw_tiled` and :func:`tiled_attention`
    (a pure PyTorch fallback: the same law, other draws).

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        sbm ((Tensor, Tensor, Tensor)): memberships :obj:`[N_q, H, k]`, block
            :obj:`[H, k, k]`, memberships :obj:`[N_k, H, k]`.
        plan (TilePlan): the tiles.
        mode (str): :obj:`"exact"` or :obj:`"poisson"`, as
            :func:`~sbm_pyg.sampling.fastrg`'s.
        exploration (float): :math:`\delta`, added to every pair's
            probability.
        self_loops (bool): every query attends to the key of its index.
        ste (str, optional): :obj:`"paper"`, :obj:`"published"` or
            :obj:`None` (no gradient to the SBM).
        generator (torch.Generator, optional): the draws' randomness.
        backend (str, optional): the rest's sparse kernel, as
            :func:`~sbm_pyg.nn.functional.sparse_attention`'s.
        return_graph (bool): also return the graph drawn.

    Returns:
        Tensor :obj:`[N_q, H, D_v]`, or :obj:`(out, graph)`.

    Example:
        >>> from sbm_pyg.sampling.tiles import plan_tiles
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]  # [6, 1, 2]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> q = k = v = torch.randn(6, 1, 4)
        >>> out, graph = tiled_sbm_attention(q, k, v, (memb, block, memb), plan,
        ...                                  mode="exact", return_graph=True)
        >>> out.shape, graph.num_edges  # the two blocks, complete
        (torch.Size([6, 1, 4]), 18)
    """
    out, graph, _ = tiled_parts(query, key, value, sbm, plan, mode=mode,
                                exploration=exploration, self_loops=self_loops,
                                ste=ste, generator=generator, backend=backend,
                                need_graph=return_graph)
    if return_graph:
        assert graph is not None  # asked for
        return out, graph
    return out


def tiled_parts(query: Tensor, key: Tensor, value: Tensor,
                sbm: Tuple[Tensor, Tensor, Tensor], plan: TilePlan, *, mode: str,
                exploration: float, self_loops: bool, ste: Optional[str],
                generator: Optional[torch.Generator], backend: Optional[str],
                need_graph: bool, sampler: Optional[str] = "auto"
                ) -> Tuple[Tensor, Optional[SampledGraph], Tensor]:
    r""":func:`tiled_sbm_attention`'s output, its graph where
    :obj:`need_graph` (else :obj:`None`) and the edges of each (sequence,
    head) :obj:`[G, H]` (:func:`~sbm_pyg.nn.sbm_attention`'s tiled
    regime reports them); the rest drawn by fastRG's :obj:`sampler`
    backend."""
    q_memb, block, k_memb = check_sbm_shapes(sbm, query.size(0), key.size(0),
                                             query.size(1))
    Nq, H, D = query.shape
    Nk = key.size(0)
    _check_qkv(query, key, value, Nq, Nk, H)
    check_plan(plan, H, Nq, Nk)
    if ste is not None and ste not in STE_MODES:
        raise ValueError(f"ste must be one of {STE_MODES} or None, got {ste!r}")
    check_generator(generator, query.device)
    if not dense_runs(query.device):  # the pure PyTorch path
        tiled = draw_tiled(q_memb.detach(), block.detach(), k_memb.detach(), plan, mode=mode,
                           exploration=exploration, self_loops=self_loops,
                           generator=generator)
        out = tiled_attention(query, key, value, tiled,
                              sbm=None if ste is None else sbm,
                              ste=ste or "paper", backend=backend)
        graph = tiled.graph()
        return (out, graph if need_graph else None,
                _per_sequence(graph.csr.rowptr.diff(), plan.ptr_q, H))
    rest = draw_rest(plan, mode=mode, exploration=exploration,
                     self_loops=self_loops, generator=generator, backend=sampler)
    seq = tile_sequences(plan)
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    # The tiles' products as the dense regime takes them: as PyTorch's
    # matmuls would for the queries' dtype (bfloat16 under autocast).
    precision = matmul_precision(query.dtype)
    q, k, v = (heads_first(x.to(dtype)) for x in (query, key, value))
    scale = 1.0 / math.sqrt(D)
    grad = ste is not None and torch.is_grad_enabled()
    # Q̂Ŝ feeds the draws: in full precision, whatever autocast says.
    qs, km = sbm_factors((q_memb, block, k_memb), dtype)
    if not grad:
        qs, km = qs.detach(), km.detach()
    tiles = dense_attention(
        q.index_select(0, seq.q_rows), k.index_select(0, seq.k_rows),
        v.index_select(0, seq.k_rows), qs.index_select(0, seq.q_rows),
        km.index_select(0, seq.k_rows), seq.ptr_q, seq.ptr_k, heads=1,
        scale=scale, seed=stream_seed(generator, query.device), mode=mode,
        exploration=exploration,
        included=included_csr(*seq.loops, H * Nq, seq.k_rows.numel())
        if self_loops else None, ste=ste if grad else None,
        precision=precision, triton_on_cpu=False)
    place = seq.q_place.flatten()
    out_t, lse_t = tiles.out.index_select(0, place), tiles.lse.index_select(0, place)
    # The rest's straight-through gradients take the tiles' factors: Q̂Ŝ
    # formed once.
    out_r, _, lse_r = edge_attention(
        rest, q, k, v, None, (qs, km) if grad else None, scale, ste or "paper",
        False, 0.0, 0, resolve_backend("attention", backend, query.device))
    # A row with no rest edge takes no weight from it (the Triton kernel
    # writes its log-sum-exp as 0, the others as -inf).
    lse_r = torch.where(rest.csr.rowptr.diff() > 0, lse_r, -math.inf)
    out = nodes_first(_merge(out_t, lse_t, out_r, lse_r).to(value.dtype), H)
    G = plan.ptr_q.numel() - 1
    edges = _per_sequence(rest.csr.rowptr.diff(), plan.ptr_q, H) + torch.zeros(
        G * H, dtype=torch.long, device=query.device).index_add_(
        0, seq.owner, tiles.edges[:, 0].long()).view(G, H)
    if not need_graph:
        return out, None, edges
    key_t = mask_keys(tiles.mask, seq.ptr_q, seq.ptr_k, 1)
    C = max(seq.k_rows.numel(), 1)
    row, col = seq.q_rows[key_t // C], seq.k_rows[key_t % C]
    head = torch.div(row, Nq, rounding_mode="floor")
    keys = torch.cat([(rest.head * Nq + rest.edge_index[1]) * Nk + rest.edge_index[0],
                      row * Nk + col - head * Nk])
    return out, SampledGraph.from_keys(torch.sort(keys).values, H, Nq, Nk,
                                       ptr_q=plan.ptr_q, ptr_k=plan.ptr_k), edges


def _per_sequence(counts: Tensor, ptr_q: Tensor, H: int) -> Tensor:
    # Per heads-first row [H * N_q] -> per (sequence, head) [G, H].
    Nq = counts.numel() // max(H, 1)
    G = ptr_q.numel() - 1
    cell = ptr2index(ptr_q, Nq)[None, :] * H + torch.arange(H, device=counts.device)[:, None]
    return torch.zeros(G * H, dtype=torch.long, device=counts.device).index_add_(
        0, cell.flatten(), counts.long()).view(G, H)


def tiled_regime(query: Tensor, key: Tensor, value: Tensor,
                 sbm: Tuple[Tensor, Tensor, Tensor], ptr_q: Tensor, ptr_k: Tensor,
                 options: SBMAttentionOptions, checks: List[Check],
                 unsupported: Dict[str, bool], *,
                 generator: Optional[torch.Generator], sampler: str, rest: str,
                 need_graph: bool) -> Tuple[Tensor, Optional[SampledGraph], Tensor]:
    r""":func:`~sbm_pyg.nn.sbm_attention`'s tiled regime
    (:obj:`attention_backend="tiles"`): its deferred :obj:`checks` read,
    the plan made with the :obj:`options`' tiles, :func:`tiled_parts` on
    it. A request it cannot serve (:obj:`unsupported`, by name) is a
    :class:`ValueError`."""
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"attention_backend='tiles' does not take {name}")
    sync(checks)
    plan = plan_tiles(*(x.detach() for x in sbm), ptr_q=ptr_q, ptr_k=ptr_k,
                      tile_q=options.tile_size, tile_k=options.tile_size,
                      min_fill=options.tile_fill)
    return tiled_parts(query, key, value, sbm, plan, mode=options.mode,
                       exploration=options.exploration,
                       self_loops=options.self_loops,
                       ste=options.ste if sbm[0].requires_grad else None,
                       generator=generator, backend=rest, need_graph=need_graph,
                       sampler=sampler)
