r"""The tile plan of a sharp SBM head: its tokens sorted by their top
cluster, the tiles of pairs that hold its heavy cluster pairs, and the SBM
of what the tiles leave out.

A head whose memberships concentrate on one cluster per token samples a
graph that is a union of nearly full blocks between cluster pairs. Sorted by
their top cluster, the tokens of such a block are contiguous, and the block
is a few dense tiles of :obj:`tile_q x tile_k` pairs: matrix products where
the edge path gathers a row per edge (hash-sparse flash attention, FlashMoBA
and FlexAttention's block masks compute the same way).

The law splits exactly. Write the query memberships as their top cluster's
share and the rest, :math:`\hat{\mathbf{Q}} = \mathbf{A} + \mathbf{A}'`
(:math:`A_{iu} = \hat{Q}_{iu} [u = c_i]`, :math:`c_i` the top cluster of
query :math:`i`), the keys' likewise, :math:`\hat{\mathbf{K}} = \mathbf{B} +
\mathbf{B}'`, and let :math:`T_h` be the cluster pairs of head :math:`h`
whose expected fill over the batch reaches :obj:`min_fill`. Then

.. math::
    p_{ij} = \underbrace{\mathbf{A}_i (\hat{\mathbf{S}} \odot T)
    \mathbf{B}_j^{\top}}_{\text{cut}} +
    \underbrace{[\mathbf{A}_i, \mathbf{A}'_i]
    \begin{bmatrix} \hat{\mathbf{S}} \odot \bar{T} & \hat{\mathbf{S}} \\
    \hat{\mathbf{S}} & \hat{\mathbf{S}} \end{bmatrix}
    [\mathbf{B}_j, \mathbf{B}'_j]^{\top}}_{\text{rest}},

and the cut part is zero outside the rectangles of :math:`T_h`'s cluster
pairs, which the plan's tiles cover. So the graph is drawn in two
independent parts: every pair of a tile by one Bernoulli of its whole
probability (:math:`\min(p_{ij} + \delta, 1)`, or :math:`1 - e^{-(p_{ij} +
\delta)}` in the Poisson mode, as the dense-regime kernel draws it), and the
rest by fastRG from the rest's SBM (:math:`2k` clusters), its edges that fall
in a tile dropped. Outside the tiles the rest's rate is :math:`p_{ij}`
itself, so each pair is an edge with the mode's probability, independently,
in both modes; fastRG draws only the rest's mass, which for a sharp head is
a small part (the draws it wastes in tiles are the rest's mass there).
:func:`draw_tiled` is that construction (a reference: its tiles draw
with torch's generator), :func:`sample_tiled` its graph.

Tiles are numbered per sequence in the sorted order: query tile :math:`a` of
sequence :math:`g` holds its sorted positions :math:`[a\,t_q, (a + 1)\,t_q)`
(the last one shorter), globally :obj:`q_tiles[g] + a`; the active tile pairs
are a CSR over (head, query tile) rows, as FlexAttention's block mask lists
key blocks by query block.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.sampling.checks import PtrLike, check_sampler_options, check_sbm
from sbm_pyg.sampling.edges import sorted_unique
from sbm_pyg.sampling.fastrg import fastrg
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import check_generator, sync

__all__ = ["TilePlan", "TiledGraph", "plan_tiles", "in_tiles", "tile_rows",
           "tile_pairs", "draw_tiled", "sample_tiled"]


class TilePlan(NamedTuple):
    r"""What :func:`plan_tiles` returns.

    Attributes:
        q_order (LongTensor): :obj:`[H, N_q]`, each head's query rows sorted
            by (sequence, top cluster); :obj:`q_pos` its inverse
            (:obj:`q_pos[h, q_order[h, r]] == r`).
        k_order (LongTensor): :obj:`[H, N_k]`, the same for the keys, and
            :obj:`k_pos` its inverse.
        q_tiles (LongTensor): :obj:`[G + 1]`, the query tiles of each
            sequence (:math:`\lceil n_g / t_q \rceil`), :obj:`k_tiles` the
            key tiles'.
        tile_ptr (LongTensor): :obj:`[H T_q + 1]`, CSR pointer over the
            (head, query tile) rows :math:`h T_q + a` (:math:`T_q` the
            query tiles of the batch).
        tile_col (LongTensor): :obj:`[P]`, the key tile of each active tile
            pair, increasing within its row.
        selected (BoolTensor): :obj:`[H, k, k]`, the cluster pairs whose
            blocks the tiles hold.
        rest (tuple): the SBM :obj:`([N_q, H, 2k], [H, 2k, 2k], [N_k, H,
            2k])` of the probability the tiles' cluster pairs leave out.
        ptr_q (LongTensor): :obj:`[G + 1]`, the query sequences;
            :obj:`ptr_k` the keys'.
        tile_q (int): :math:`t_q`; :obj:`tile_k`: :math:`t_k`.
        num_q_tiles (int): :math:`T_q`, the query tiles of the batch;
            :obj:`num_k_tiles`: :math:`T_k`, the key tiles'.
    """

    q_order: Tensor
    q_pos: Tensor
    k_order: Tensor
    k_pos: Tensor
    q_tiles: Tensor
    k_tiles: Tensor
    tile_ptr: Tensor
    tile_col: Tensor
    selected: Tensor
    rest: Tuple[Tensor, Tensor, Tensor]
    ptr_q: Tensor
    ptr_k: Tensor
    tile_q: int
    tile_k: int
    num_q_tiles: int
    num_k_tiles: int

    @property
    def num_tiles(self) -> int:
        r"""The active tile pairs :math:`P`, all heads."""
        return self.tile_col.numel()


def _rows_of(ptr: Tensor, num_rows: int) -> Tensor:
    # The sequence of each row.
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device),
                                   ptr.diff(), output_size=num_rows)


def _tile_ptr(ptr: Tensor, tile: int) -> Tensor:
    # The tiles of each sequence, as a pointer [G + 1].
    tiles = torch.zeros_like(ptr)
    tiles[1:] = torch.cumsum(torch.div(ptr.diff() + tile - 1, tile,
                                       rounding_mode="floor"), 0)
    return tiles


def _sorted_side(memb: Tensor, ptr: Tensor
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # One side's order by (sequence, top cluster), the inverse, and each
    # (sequence, head, cluster)'s main mass, count and first sorted
    # position.
    N, H, k = memb.shape
    G = ptr.numel() - 1
    seq = _rows_of(ptr, N)
    top = memb.argmax(-1)  # [N, H]
    main = memb.gather(-1, top[..., None]).squeeze(-1)
    # One stable integer sort per head (a radix sort on CUDA).
    order = torch.argsort((seq[:, None] * k + top).t(), dim=1, stable=True)
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(N, device=memb.device).expand(H, N))
    cell = (seq[:, None] * H + torch.arange(H, device=memb.device)) * k + top
    mass = memb.new_zeros(G * H * k).index_add_(0, cell.flatten(), main.flatten())
    count = torch.zeros(G * H * k, dtype=torch.long, device=memb.device)
    count.index_add_(0, cell.flatten(), torch.ones_like(cell.flatten()))
    count = count.view(G, H, k)
    first = ptr[:-1, None, None] + count.cumsum(-1) - count
    return order, pos, mass.view(G, H, k), count, first


def plan_tiles(q_memb: Tensor, block: Tensor, k_memb: Tensor, *,
               ptr_q: PtrLike = None, ptr_k: PtrLike = None,
               tile_q: int = 64, tile_k: int = 64,
               min_fill: float = 0.5) -> TilePlan:
    r"""The tile plan of an SBM (see the module's text): each head's tokens
    sorted by their top cluster, the cluster pairs :math:`(u, v)` whose
    expected fill over the batch, :math:`\sum_g a_{guv} / \sum_g n_{gu}
    m_{gv}` with :math:`a_{guv}` the cut part's expected edges between the
    queries of top cluster :math:`u` and the keys of top cluster :math:`v`
    of sequence :math:`g` (:math:`n_{gu}`, :math:`m_{gv}` their counts),
    reaches :obj:`min_fill`, the tiles that cover their blocks, and the SBM
    of the rest.

    Everything comes from per-(sequence, head, cluster) sums: time
    :math:`O((N_q + N_k) H k + G H k^2)` plus the tiles enumerated; no
    per-pair pass. The plan's sizes are read in one host sync.

    Args:
        q_memb (Tensor): query memberships :obj:`[N_q, H, k]`, :math:`\geq 0`.
        block (Tensor): :obj:`[H, k, k]`, :math:`\geq 0`.
        k_memb (Tensor): key memberships :obj:`[N_k, H, k]`, :math:`\geq 0`.
        ptr_q, ptr_k (LongTensor, optional): :obj:`[G + 1]`, the sequences
            (:obj:`None`: one).
        tile_q (int): query rows of a tile. (default: :obj:`64`)
        tile_k (int): key columns of a tile. (default: :obj:`64`)
        min_fill (float): the least expected fill of a cluster pair computed
            as tiles, :math:`> 0`. (default: :obj:`0.5`)

    Returns:
        :class:`TilePlan`.

    Example:
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]  # [6, 1, 2]
        >>> block = torch.tensor([[[0.9, 0.0], [0.0, 0.9]]])
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> plan.tile_ptr.tolist(), plan.tile_col.tolist()  # the two blocks
        ([0, 1, 2], [0, 1])
    """
    for name, size in (("tile_q", tile_q), ("tile_k", tile_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be an int >= 1, got {size!r}")
    if isinstance(min_fill, bool) or not isinstance(min_fill, (int, float)) \
            or not (math.isfinite(min_fill) and min_fill > 0):
        raise ValueError(f"min_fill must be a finite number > 0, got {min_fill!r}")
    ptr_q, ptr_k, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                     self_loops=False)
    # The checks and the batch's tile counts in one read.
    q_tiles, k_tiles = _tile_ptr(ptr_q, tile_q), _tile_ptr(ptr_k, tile_k)
    Tq, Tk = (int(x) for x in sync(checks, q_tiles[-1], k_tiles[-1]))
    H = q_memb.size(1)
    device = q_memb.device
    q_order, q_pos, mass_q, count_q, first_q = _sorted_side(q_memb, ptr_q)
    k_order, k_pos, mass_k, count_k, first_k = _sorted_side(k_memb, ptr_k)

    # The cut part's expected edges and the pairs of each cluster pair.
    mass = torch.einsum("ghu,ghv->huv", mass_q, mass_k) * block
    pairs = torch.einsum("ghu,ghv->huv", count_q.to(block.dtype),
                         count_k.to(block.dtype))
    selected = (pairs > 0) & (mass >= min_fill * pairs)

    # The rectangles: every (sequence, head, u, v) with (u, v) selected and
    # both clusters present, as ranges of tiles.
    g, h, u = (count_q > 0).nonzero(as_tuple=True)
    row_pairs = selected[h, u]  # [R, k]: the selected key clusters
    r, v = (row_pairs & (count_k[g, h] > 0)).nonzero(as_tuple=True)
    g, h, u = g[r], h[r], u[r]
    a0 = (first_q[g, h, u] - ptr_q[g]) // tile_q
    a1 = (first_q[g, h, u] + count_q[g, h, u] - 1 - ptr_q[g]) // tile_q
    b0 = (first_k[g, h, v] - ptr_k[g]) // tile_k
    b1 = (first_k[g, h, v] + count_k[g, h, v] - 1 - ptr_k[g]) // tile_k
    wide = b1 - b0 + 1
    area = (a1 - a0 + 1) * wide
    total = int(sync([], area.sum())[0]) if area.numel() else 0
    rect = torch.repeat_interleave(torch.arange(area.numel(), device=device),
                                   area, output_size=total)
    offset = torch.arange(total, device=device) - (area.cumsum(0) - area)[rect]
    a = a0[rect] + torch.div(offset, wide[rect], rounding_mode="floor")
    b = b0[rect] + offset % wide[rect]
    row = h[rect] * Tq + q_tiles[g[rect]] + a
    key = sorted_unique(row * Tk + k_tiles[g[rect]] + b)
    tile_row = torch.div(key, max(Tk, 1), rounding_mode="floor")
    tile_ptr = torch.searchsorted(tile_row, torch.arange(H * Tq + 1, device=device))
    tile_col = key - tile_row * Tk

    rest = (_split(q_memb), torch.cat([
        torch.cat([block * ~selected, block], 2),
        torch.cat([block, block], 2)], 1), _split(k_memb))
    return TilePlan(q_order, q_pos, k_order, k_pos, q_tiles, k_tiles,
                    tile_ptr, tile_col, selected, rest, ptr_q, ptr_k,
                    tile_q, tile_k, Tq, Tk)


def _split(memb: Tensor) -> Tensor:
    # [A, A']: the top cluster's share and the rest, [N, H, 2k].
    top = memb.argmax(-1, keepdim=True)
    main = torch.zeros_like(memb).scatter_(-1, top, memb.gather(-1, top))
    return torch.cat([main, memb - main], -1)


def _tile_keys(plan: TilePlan) -> Tensor:
    # Each active tile pair as row * T_k + column, increasing.
    rows = torch.arange(plan.tile_ptr.numel() - 1, device=plan.tile_ptr.device)
    row = torch.repeat_interleave(rows, plan.tile_ptr.diff(),
                                  output_size=plan.num_tiles)
    return row * plan.num_k_tiles + plan.tile_col


def in_tiles(plan: TilePlan, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
    r"""Whether each pair (:obj:`head`, :obj:`query`, :obj:`key`), all
    :obj:`[E]` and within one sequence, lies in an active tile of
    :obj:`plan`: :obj:`[E]` bool, in :math:`O(E \log P)`.

    Example:
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]
        >>> plan = plan_tiles(memb, torch.eye(2)[None], memb, tile_q=3, tile_k=3)
        >>> zero = torch.zeros(2, dtype=torch.long)
        >>> in_tiles(plan, zero, torch.tensor([0, 0]), torch.tensor([1, 4])).tolist()
        [True, False]
    """
    seq = _rows_of(plan.ptr_q, plan.q_pos.size(1))[query]
    a = torch.div(plan.q_pos[head, query] - plan.ptr_q[seq], plan.tile_q,
                  rounding_mode="floor")
    b = torch.div(plan.k_pos[head, key] - plan.ptr_k[seq], plan.tile_k,
                  rounding_mode="floor")
    Tq, Tk = plan.num_q_tiles, plan.num_k_tiles
    want = (head * Tq + plan.q_tiles[seq] + a) * Tk + plan.k_tiles[seq] + b
    keys = _tile_keys(plan)
    if keys.numel() == 0:
        return torch.zeros_like(want, dtype=torch.bool)
    at = torch.searchsorted(keys, want).clamp(max=keys.numel() - 1)
    return keys[at] == want


def tile_rows(plan: TilePlan) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The active tiles as a tile kernel reads them: the head of each
    :obj:`[P]`, its query rows :obj:`[P, t_q]` and key rows :obj:`[P, t_k]`
    (:obj:`-1` past the end of a sequence's last tile).

    Example:
        >>> memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0])][:, None]
        >>> plan = plan_tiles(memb, torch.eye(2)[None], memb, tile_q=2, tile_k=2)
        >>> head, rows, cols = tile_rows(plan)
        >>> rows.tolist()  # sorted [0 0 0 | 1 1]: tiles [1, 3], [4, 0], [2, -1]
        [[1, 3], [1, 3], [4, 0], [4, 0], [4, 0], [2, -1], [2, -1]]
    """
    Tq, device = plan.num_q_tiles, plan.tile_ptr.device
    rows = torch.arange(plan.tile_ptr.numel() - 1, device=device)
    row = torch.repeat_interleave(rows, plan.tile_ptr.diff(),
                                  output_size=plan.num_tiles)
    head = torch.div(row, max(Tq, 1), rounding_mode="floor")
    qt = row - head * Tq
    g = torch.searchsorted(plan.q_tiles, qt, right=True) - 1
    q0 = plan.ptr_q[g] + (qt - plan.q_tiles[g]) * plan.tile_q
    k0 = plan.ptr_k[g] + (plan.tile_col - plan.k_tiles[g]) * plan.tile_k
    q = q0[:, None] + torch.arange(plan.tile_q, device=device)
    k = k0[:, None] + torch.arange(plan.tile_k, device=device)
    q_in, k_in = q < plan.ptr_q[g + 1, None], k < plan.ptr_k[g + 1, None]
    q_rows = torch.where(q_in, plan.q_order[head[:, None], q.clamp(
        max=max(plan.q_order.size(1) - 1, 0))], -1)
    k_rows = torch.where(k_in, plan.k_order[head[:, None], k.clamp(
        max=max(plan.k_order.size(1) - 1, 0))], -1)
    return head, q_rows, k_rows


def tile_pairs(plan: TilePlan) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Every (head, query, key) pair of the plan's active tiles, each
    :obj:`[M]` (:math:`M \leq P t_q t_k`), tile by tile (for references
    and tests)."""
    head, q_rows, k_rows = tile_rows(plan)
    query = q_rows[:, :, None].expand(-1, -1, plan.tile_k)
    key = k_rows[:, None, :].expand(-1, plan.tile_q, -1)
    real = (query >= 0) & (key >= 0)
    return (head[:, None, None].expand_as(query)[real], query[real], key[real])


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
        >>> memb = torch.eye(2).repeat_interleave(3, 0)[:, None]
        >>> block = torch.eye(2)[None]
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> tiled = draw_tiled(memb, block, memb, plan, mode="exact")
        >>> int(tiled.mask.sum()), tiled.rest.num_edges  # the blocks, complete
        (18, 0)
    """
    check_sampler_options(mode, exploration, None)
    check_generator(generator, q_memb.device)
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    if plan.q_pos.shape != (H, Nq) or plan.k_pos.shape != (H, Nk):
        raise ValueError(f"plan must be made from these memberships: it "
                         f"orders {tuple(plan.q_pos.shape)} queries and "
                         f"{tuple(plan.k_pos.shape)} keys, got [H, N_q] = "
                         f"[{H}, {Nq}] and [H, N_k] = [{H}, {Nk}]")
    rest = fastrg(*plan.rest, ptr_q=plan.ptr_q, ptr_k=plan.ptr_k, mode=mode,
                  exploration=exploration, self_loops=self_loops,
                  generator=generator)
    key, query = rest.edge_index
    keep = ~in_tiles(plan, rest.head, query, key)
    rest = SampledGraph.from_keys(
        ((rest.head * Nq + query) * Nk + key)[keep], H, Nq, Nk,
        ptr_q=plan.ptr_q, ptr_k=plan.ptr_k)

    head, q_rows, k_rows = tile_rows(plan)
    qs = torch.einsum("nhk,hkl->nhl", q_memb, block)
    p = torch.bmm(qs[q_rows.clamp(min=0), head[:, None]],
                  k_memb[k_rows.clamp(min=0), head[:, None]].transpose(1, 2))
    p = p + exploration
    prob = p.clamp(max=1) if mode == "exact" else -torch.expm1(-p)
    mask = torch.rand(p.shape, generator=generator, device=p.device,
                      dtype=p.dtype) < prob
    if self_loops:
        mask |= q_rows[:, :, None] == k_rows[:, None, :]
    mask &= (q_rows[:, :, None] >= 0) & (k_rows[:, None, :] >= 0)
    return TiledGraph(plan, mask, rest)


def sample_tiled(q_memb: Tensor, block: Tensor, k_memb: Tensor,
                 plan: TilePlan, *, mode: str = "poisson",
                 exploration: float = 0.0, self_loops: bool = False,
                 generator: Optional[torch.Generator] = None) -> SampledGraph:
    r"""The graph of :func:`draw_tiled`, tiles and rest in one
    :class:`SampledGraph`.

    Example:
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
