r"""A graph drawn through a tile plan (:mod:`sbm_pyg.sampling.tiles`): the
pairs of its tiles by one Bernoulli each, the rest by fastRG from the
plan's rest SBM with its edges in tiles dropped. The plan's module proves
the union's law that of :func:`~sbm_pyg.sampling.fastrg`, pair by pair in
both modes. :func:`draw_tiled` is that construction (a reference: its
tiles draw with torch's generator), :func:`sample_tiled` its graph;
:func:`draw_rest` the rest alone, which the tiled regime
(:func:`~sbm_pyg.nn.tiled_sbm_attention`) draws beside the dense-regime
kernel's tiles."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from sbm_pyg.sampling.checks import check_sampler_options
from sbm_pyg.sampling.fastrg import fastrg
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.sampling.tiles import TilePlan, check_plan, in_tiles, tile_rows
from sbm_pyg.validation import check_generator

__all__ = ["TiledGraph", "draw_tiled", "draw_rest", "sample_tiled"]


class TiledGraph(NamedTuple):
    r"""A graph drawn through a :class:`TilePlan` (:func:`draw_tiled`):
    the edges of the plan's tiles as a mask :obj:`[P, t_q, t_k]` over the
    pairs of :func:`tile_rows` (false on padding), and the rest's edges,
    none of them in a tile, as a :class:`~sbm_pyg.sampling.SampledGraph`;
    the two are disjoint and their union is the graph
    (:meth:`graph`)."""

    plan: TilePlan
    mask: Tensor
    rest: SampledGraph

    def graph(self) -> SampledGraph:
        r"""The whole graph, tiles and rest, as one :class:`SampledGraph`."""
        rest = self.rest
        H, Nq, Nk = rest.num_heads, rest.num_queries, rest.num_keys
        key, query = rest.edge_index
        head, q_rows, k_rows = tile_rows(self.plan)
        pair = ((head[:, None, None] * Nq + q_rows[:, :, None]) * Nk
                + k_rows[:, None, :])
        keys = torch.cat([(rest.head * Nq + query) * Nk + key, pair[self.mask]])
        return SampledGraph.from_keys(torch.sort(keys).values, H, Nq, Nk,
                                      ptr_q=rest.ptr_q, ptr_k=rest.ptr_k)


def draw_tiled(q_memb: Tensor, block: Tensor, k_memb: Tensor,
               plan: TilePlan, *, mode: str = "poisson",
               exploration: float = 0.0, self_loops: bool = False,
               generator: Optional[torch.Generator] = None) -> TiledGraph:
    r"""A graph of :func:`~sbm_pyg.sampling.fastrg`'s law drawn through
    :obj:`plan` (made from the same SBM and sequences): one Bernoulli per
    pair of the active tiles, the rest's SBM by fastRG with its edges in
    tiles dropped (the module's text proves the law the same); self-loops
    in a tile are its mask's. Each tile's probabilities are one product
    :math:`(\hat{\mathbf{Q}}\hat{\mathbf{S}})_{\text{rows}}
    \hat{\mathbf{K}}_{\text{cols}}^{\top}`, drawn with :obj:`generator`
    (not the dense-regime kernel's per-pair stream); no
    :obj:`include_edges`.

    Example:
        >>> from sbm_pyg.sampling.tiles import plan_tiles
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> tiled = draw_tiled(memb, block, memb, plan, mode="exact")
        >>> int(tiled.mask.sum()), tiled.rest.num_edges  # the blocks, complete
        (18, 0)
    """
    Nq, H, _ = q_memb.shape
    check_plan(plan, H, Nq, k_memb.size(0))
    rest = draw_rest(plan, mode=mode, exploration=exploration,
                     self_loops=self_loops, generator=generator)
    head, q_rows, k_rows = tile_rows(plan)
    dtype = torch.promote_types(torch.promote_types(q_memb.dtype, block.dtype),
                                k_memb.dtype)
    qs = torch.einsum("nhk,hkl->nhl", q_memb.to(dtype), block.to(dtype))
    p = torch.bmm(qs[q_rows.clamp(min=0), head[:, None]],
                  k_memb.to(dtype)[k_rows.clamp(min=0), head[:, None]].transpose(1, 2))
    p = p + exploration
    prob = p.clamp(max=1) if mode == "exact" else -torch.expm1(-p)
    mask = torch.rand(p.shape, generator=generator, device=p.device,
                      dtype=p.dtype) < prob
    if self_loops:
        mask |= q_rows[:, :, None] == k_rows[:, None, :]
    mask &= (q_rows[:, :, None] >= 0) & (k_rows[:, None, :] >= 0)
    return TiledGraph(plan, mask, rest)


def draw_rest(plan: TilePlan, *, mode: str = "poisson", exploration: float = 0.0,
              self_loops: bool = False,
              generator: Optional[torch.Generator] = None,
              backend: Optional[str] = "auto") -> SampledGraph:
    r"""The rest of a graph drawn through :obj:`plan`: fastRG (its
    :obj:`backend`) from the plan's rest SBM, its edges that fall in a tile
    dropped (the tiles draw their pairs themselves, :func:`draw_tiled`)."""
    check_sampler_options(mode, exploration, None)
    check_generator(generator, plan.q_order.device)
    rest = fastrg(*plan.rest, ptr_q=plan.ptr_q, ptr_k=plan.ptr_k, mode=mode,
                  exploration=exploration, self_loops=self_loops,
                  generator=generator, backend=backend)
    key, query = rest.edge_index
    return rest.edge_subgraph(~in_tiles(plan, rest.head, query, key))


def sample_tiled(q_memb: Tensor, block: Tensor, k_memb: Tensor,
                 plan: TilePlan, *, mode: str = "poisson",
                 exploration: float = 0.0, self_loops: bool = False,
                 generator: Optional[torch.Generator] = None) -> SampledGraph:
    r"""The graph of :func:`draw_tiled`, tiles and rest in one
    :class:`SampledGraph`.

    Example:
        >>> from sbm_pyg.sampling.tiles import plan_tiles
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> graph = sample_tiled(memb, block, memb, plan, mode="exact")
        >>> graph.num_edges  # the two blocks, complete
        18
    """
    return draw_tiled(q_memb, block, k_memb, plan, mode=mode,
                      exploration=exploration, self_loops=self_loops,
                      generator=generator).graph()
