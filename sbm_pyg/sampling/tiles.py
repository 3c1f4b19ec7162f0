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
:mod:`sbm_pyg.sampling.tiled_graph` draws it.

Each (sequence, head, top cluster)'s tokens are cut into tiles of their own
(the last one shorter), as FlashMoBA gathers the queries of a key block and
variable-block kernels take k-means clusters: a tile pair lies inside one
cluster pair's block, and the tiles are exactly the selected blocks. The
active tile pairs are a CSR over query tiles, as FlexAttention's block
mask lists key blocks by query block.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Tuple

import torch
from torch import Tensor
from torch_geometric.utils.sparse import ptr2index

from sbm_pyg.ops.csr import full_precision
from sbm_pyg.sampling.checks import PtrLike, check_sbm
from sbm_pyg.validation import sync

__all__ = ["TilePlan", "TileSequences", "plan_tiles", "check_plan",
           "check_tile_options", "tile_edges",
           "in_tiles", "tile_rows", "tile_pairs", "tile_sequences"]


class TilePlan(NamedTuple):
    r"""What :func:`plan_tiles` returns. Tiles are numbered over the whole
    batch, query tiles by (sequence, head, top cluster) and then by their
    place in the cluster, key tiles alike. For the queries: :obj:`q_order`
    :obj:`[H, N_q]`, each head's rows sorted by (sequence, top cluster),
    stably; :obj:`q_tile` :obj:`[H, N_q]`, each row's tile in each head;
    and per tile :obj:`[T_q]` its first place in its head's order
    (:obj:`q_start`), its rows (:obj:`q_len`, :math:`\leq t_q`) and its head
    (:obj:`q_head`); the keys' fields alike (:obj:`k_*`, :obj:`[T_k]`). The
    active tile pairs: :obj:`tile_ptr` :obj:`[T_q + 1]`, a CSR pointer over
    the query tiles, and :obj:`tile_col` :obj:`[P]`, each pair's key tile,
    increasing within its query tile. :obj:`selected` :obj:`[H, k, k]`: the
    cluster pairs whose blocks the tiles hold; :obj:`rest`: the SBM
    :obj:`([N_q, H, 2k], [H, 2k, 2k], [N_k, H, 2k])` of the probability they
    leave out; :obj:`ptr_q`, :obj:`ptr_k` :obj:`[G + 1]`: the sequences;
    :obj:`tile_q`, :obj:`tile_k`: :math:`t_q`, :math:`t_k`."""

    q_order: Tensor
    q_tile: Tensor
    q_start: Tensor
    q_len: Tensor
    q_head: Tensor
    k_order: Tensor
    k_tile: Tensor
    k_start: Tensor
    k_len: Tensor
    k_head: Tensor
    tile_ptr: Tensor
    tile_col: Tensor
    selected: Tensor
    rest: Tuple[Tensor, Tensor, Tensor]
    ptr_q: Tensor
    ptr_k: Tensor
    tile_q: int
    tile_k: int

    @property
    def num_tiles(self) -> int:
        r"""The active tile pairs :math:`P`, all heads."""
        return self.tile_col.numel()


class _Cells(NamedTuple):
    # One side's tokens by (sequence, head, top cluster): each token's top
    # cluster [N, H]; each cell's main mass, tokens and tiles [G, H, k].
    top: Tensor
    mass: Tensor
    size: Tensor
    tiles: Tensor


class _Side(NamedTuple):
    # One side's cells, its order and each cell's first sorted place and
    # first tile.
    cells: _Cells
    order: Tensor
    pos: Tensor
    first: Tensor
    first_tile: Tensor


def _cells(memb: Tensor, seq: Tensor, G: int, tile: int) -> _Cells:
    # seq: each token's sequence [N], of G.
    N, H, k = memb.shape
    top = memb.argmax(-1)  # [N, H]
    main = memb.gather(-1, top[..., None]).squeeze(-1)
    cell = ((seq[:, None] * H + torch.arange(H, device=memb.device)) * k + top).flatten()
    # Summed in float32 whatever autocast made the memberships: a bfloat16
    # sum stops growing at 256.
    acc = torch.promote_types(memb.dtype, torch.float32)
    mass = memb.new_zeros(G * H * k, dtype=acc).index_add_(0, cell, main.flatten().to(acc))
    # Counted by index_add_, not bincount: CUDA's bincount reads the largest
    # index to the host to size its output, a sync in the forward.
    count = torch.zeros(G * H * k, dtype=torch.long, device=memb.device
                        ).index_add_(0, cell, torch.ones_like(cell))
    tiles = torch.div(count + (tile - 1), tile, rounding_mode="floor")
    return _Cells(top, mass.view(G, H, k), count.view(G, H, k), tiles.view(G, H, k))


def _sequences(ptr_q: Tensor, ptr_k: Tensor, Nq: int, Nk: int) -> Tuple[Tensor, Tensor]:
    # Each query's and key's sequence, once where the pointers are one.
    seq_q = ptr2index(ptr_q, Nq)
    return seq_q, seq_q if ptr_k is ptr_q and Nk == Nq else ptr2index(ptr_k, Nk)


def _selection(qc: _Cells, kc: _Cells, block: Tensor, tile_q: int, tile_k: int,
               min_fill: float) -> Tuple[Tensor, Tensor]:
    # The cut part's expected edges of each cluster pair [H, k, k], and the
    # pairs whose tiles (padding counted) they fill to min_fill.
    dtype = qc.mass.dtype  # float32 or wider, autocast off
    with full_precision(block.device):
        mass = torch.einsum("ghu,ghv->huv", qc.mass, kc.mass) * block.to(dtype)
        pairs = torch.einsum("ghu,ghv->huv", (qc.tiles * tile_q).to(dtype),
                             (kc.tiles * tile_k).to(dtype))
    return mass, (pairs > 0) & (mass >= min_fill * pairs)


def _sorted_side(memb: Tensor, ptr: Tensor, seq: Tensor, tile: int) -> _Side:
    N, H, k = memb.shape
    cells = _cells(memb, seq, ptr.numel() - 1, tile)
    # One stable integer sort per head (a radix sort on CUDA).
    order = torch.argsort((seq[:, None] * k + cells.top).t(), dim=1, stable=True)
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(N, device=memb.device).expand(H, N))
    first = cells.size.cumsum(-1) - cells.size + ptr[:-1, None, None]
    tiles = cells.tiles.flatten()
    first_tile = (tiles.cumsum(0) - tiles).view_as(cells.tiles)
    return _Side(cells, order, pos, first, first_tile)


def tile_edges(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
               ptr_k: Tensor, *, tile_q: int = 64, tile_k: int = 64,
               min_fill: float = 0.5) -> Tensor:
    r"""The expected edges that :func:`plan_tiles` with these options would
    compute as tiles, per head :obj:`[H]` (the cut part of its selected
    cluster pairs, see the module's text): on the device, from the same
    per-(sequence, head, cluster) sums, with no host read and no sort. The
    SBM and the pointers :obj:`[G + 1]` are taken as checked (as
    :func:`~sbm_pyg.nn.sbm_attention`'s regime choice has them).

    Example:
        >>> memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0, 1])][:, None]
        >>> block = torch.tensor([[[0.9, 0.0], [0.0, 0.1]]])
        >>> ptr = torch.tensor([0, 6])
        >>> tile_edges(memb, block, memb, ptr, ptr, tile_q=3, tile_k=3)
        tensor([8.1000])
    """
    check_tile_options(tile_q=tile_q, tile_k=tile_k, min_fill=min_fill)
    seq_q, seq_k = _sequences(ptr_q, ptr_k, q_memb.size(0), k_memb.size(0))
    G = ptr_q.numel() - 1
    mass, selected = _selection(_cells(q_memb, seq_q, G, tile_q),
                                _cells(k_memb, seq_k, G, tile_k), block,
                                tile_q, tile_k, min_fill)
    return (mass * selected).sum((1, 2))


def _tile_table(side: _Side, total: int, tile: int, memb: Tensor, ptr: Tensor
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    # Each row's tile [H, N] and each tile's first sorted place, rows and
    # head [T].
    N, H, k = memb.shape
    seq = ptr2index(ptr, N)
    top, size, tiles = side.cells.top, side.cells.size, side.cells.tiles
    heads = torch.arange(H, device=memb.device)
    rank = side.pos.t() - side.first[seq[:, None], heads, top]  # [N, H]
    row_tile = side.first_tile[seq[:, None], heads, top] + torch.div(
        rank, tile, rounding_mode="floor")
    segment = torch.repeat_interleave(
        torch.arange(tiles.numel(), device=memb.device),
        tiles.flatten(), output_size=total)
    local = torch.arange(total, device=memb.device) - side.first_tile.flatten()[segment]
    start = side.first.flatten()[segment] + local * tile
    length = torch.minimum(size.flatten()[segment] - local * tile,
                           torch.full_like(local, tile))
    head = torch.div(segment, k, rounding_mode="floor") % H
    return row_tile.t().contiguous(), start, length, head


def check_tile_options(**options) -> None:
    r"""Checks a tile plan's options by name: sizes (ints :math:`\geq 1`)
    and fills (finite numbers :math:`> 0`, names ending in ``fill``)."""
    for name, value in options.items():
        if name.endswith("fill"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def plan_tiles(q_memb: Tensor, block: Tensor, k_memb: Tensor, *,
               ptr_q: PtrLike = None, ptr_k: PtrLike = None,
               tile_q: int = 64, tile_k: int = 64,
               min_fill: float = 0.5) -> TilePlan:
    r"""The tile plan of an SBM (see the module's text): each head's tokens
    sorted by their top cluster, each (sequence, head, cluster)'s tokens
    cut into tiles of :obj:`tile_q` queries (:obj:`tile_k` keys), the
    cluster pairs :math:`(u, v)` whose expected fill over the batch,
    :math:`\sum_g a_{guv} / \sum_g t_q \lceil n_{gu} / t_q \rceil \, t_k
    \lceil m_{gv} / t_k \rceil` with :math:`a_{guv}` the cut part's
    expected edges between the queries of top cluster :math:`u` and the
    keys of top cluster :math:`v` of sequence :math:`g` (:math:`n_{gu}`,
    :math:`m_{gv}` their counts: the tiles' pairs, padding counted),
    reaches :obj:`min_fill`, the tile pairs of their blocks, and the SBM of
    the rest.

    Everything comes from per-(sequence, head, cluster) sums: time
    :math:`O((N_q + N_k) H k + G H k^2)` plus the tile pairs; no per-pair
    pass. The checks and the plan's sizes take three host reads.

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
        >>> memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0, 1])][:, None]
        >>> block = torch.tensor([[[0.9, 0.0], [0.0, 0.9]]])
        >>> plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
        >>> plan.q_order.tolist()  # cluster 0, then cluster 1
        [[1, 3, 4, 0, 2, 5]]
        >>> plan.tile_ptr.tolist(), plan.tile_col.tolist()  # the two blocks
        ([0, 1, 2], [0, 1])
    """
    check_tile_options(tile_q=tile_q, tile_k=tile_k, min_fill=min_fill)
    ptr_q, ptr_k, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                     self_loops=False)
    device = q_memb.device
    seq_q, seq_k = _sequences(ptr_q, ptr_k, q_memb.size(0), k_memb.size(0))
    qs = _sorted_side(q_memb, ptr_q, seq_q, tile_q)
    ks = _sorted_side(k_memb, ptr_k, seq_k, tile_k)
    qc, kc = qs.cells, ks.cells
    _, selected = _selection(qc, kc, block, tile_q, tile_k, min_fill)
    # The blocks: every (sequence, head, u, v) with (u, v) selected and both
    # clusters present, as a rectangle of tiles. The checks, the batch's
    # tile counts, the blocks' count and their tiles in one read (sums of
    # integers below 2^53, exact in float64), so that the nonzeros below
    # are sized without a read of their own.
    present_q, present_k = qc.size > 0, kc.size > 0
    wide_sel = selected.double()
    Tq, Tk, cells, blocks, total = (int(x) for x in sync(
        checks, qc.tiles.sum(), kc.tiles.sum(), present_q.sum(),
        torch.einsum("ghu,huv,ghv->", present_q.double(), wide_sel,
                     present_k.double()),
        torch.einsum("ghu,huv,ghv->", qc.tiles.double(), wide_sel,
                     kc.tiles.double())))
    q_tile, q_start, q_len, q_head = _tile_table(qs, Tq, tile_q, q_memb, ptr_q)
    k_tile, k_start, k_len, k_head = _tile_table(ks, Tk, tile_k, k_memb, ptr_k)
    g, h, u = torch.nonzero_static(present_q, size=cells).unbind(1)
    r, v = torch.nonzero_static(selected[h, u] & present_k[g, h],
                                size=blocks).unbind(1)
    g, h, u = g[r], h[r], u[r]
    wide = kc.tiles[g, h, v]
    area = qc.tiles[g, h, u] * wide
    rect = torch.repeat_interleave(torch.arange(area.numel(), device=device),
                                   area, output_size=total)
    offset = torch.arange(total, device=device) - (area.cumsum(0) - area)[rect]
    a = qs.first_tile[g, h, u][rect] + torch.div(offset, wide[rect],
                                                  rounding_mode="floor")
    b = ks.first_tile[g, h, v][rect] + offset % wide[rect]
    key = torch.sort(a * Tk + b).values  # distinct: the blocks are disjoint
    tile_row = torch.div(key, max(Tk, 1), rounding_mode="floor")
    tile_ptr = torch.searchsorted(tile_row, torch.arange(Tq + 1, device=device))
    tile_col = key - tile_row * Tk

    rest = (_split(q_memb, qc.top), torch.cat([
        torch.cat([block * ~selected, block], 2),
        torch.cat([block, block], 2)], 1), _split(k_memb, kc.top))
    return TilePlan(qs.order, q_tile, q_start, q_len, q_head,
                    ks.order, k_tile, k_start, k_len, k_head,
                    tile_ptr, tile_col, selected, rest, ptr_q, ptr_k,
                    tile_q, tile_k)


def _split(memb: Tensor, top: Tensor) -> Tensor:
    # [A, A']: the top cluster's share and the rest, [N, H, 2k] (top: each
    # token's top cluster [N, H]).
    top = top[..., None]
    main = torch.zeros_like(memb).scatter_(-1, top, memb.gather(-1, top))
    return torch.cat([main, memb - main], -1)


def _tile_keys(plan: TilePlan) -> Tensor:
    # Each active tile pair as query tile * T_k + key tile, increasing.
    rows = torch.arange(plan.tile_ptr.numel() - 1, device=plan.tile_ptr.device)
    row = torch.repeat_interleave(rows, plan.tile_ptr.diff(),
                                  output_size=plan.num_tiles)
    return row * plan.k_start.numel() + plan.tile_col


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
    want = plan.q_tile[head, query] * plan.k_start.numel() + plan.k_tile[head, key]
    keys = _tile_keys(plan)
    if keys.numel() == 0:
        return torch.zeros_like(want, dtype=torch.bool)
    at = torch.searchsorted(keys, want).clamp(max=keys.numel() - 1)
    return keys[at] == want


def tile_rows(plan: TilePlan) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The active tiles as a tile kernel reads them: the head of each
    :obj:`[P]`, its query rows :obj:`[P, t_q]` and key rows :obj:`[P, t_k]`
    (:obj:`-1` past the end of a cluster's last tile).

    Example:
        >>> memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0])][:, None]
        >>> plan = plan_tiles(memb, torch.eye(2)[None], memb, tile_q=2, tile_k=2)
        >>> head, rows, cols = tile_rows(plan)
        >>> rows.tolist()  # cluster 0: [1, 3], [4]; cluster 1: [0, 2]
        [[1, 3], [1, 3], [4, -1], [4, -1], [0, 2]]
        >>> cols.tolist()
        [[1, 3], [4, -1], [1, 3], [4, -1], [0, 2]]
    """
    device = plan.tile_ptr.device
    qt = torch.repeat_interleave(torch.arange(plan.tile_ptr.numel() - 1, device=device),
                                 plan.tile_ptr.diff(), output_size=plan.num_tiles)
    kt = plan.tile_col
    head = plan.q_head[qt]
    q = torch.arange(plan.tile_q, device=device)
    k = torch.arange(plan.tile_k, device=device)
    q_in, k_in = q < plan.q_len[qt, None], k < plan.k_len[kt, None]
    q_at = (plan.q_start[qt, None] + q).clamp(max=max(plan.q_order.size(1) - 1, 0))
    k_at = (plan.k_start[kt, None] + k).clamp(max=max(plan.k_order.size(1) - 1, 0))
    return (head, torch.where(q_in, plan.q_order[head[:, None], q_at], -1),
            torch.where(k_in, plan.k_order[head[:, None], k_at], -1))


def tile_pairs(plan: TilePlan) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Every (head, query, key) pair of the plan's active tiles, each
    :obj:`[M]` (:math:`M \leq P t_q t_k`), tile by tile (for references
    and tests)."""
    head, q_rows, k_rows = tile_rows(plan)
    query = q_rows[:, :, None].expand(-1, -1, plan.tile_k)
    key = k_rows[:, None, :].expand(-1, plan.tile_q, -1)
    real = (query >= 0) & (key >= 0)
    return (head[:, None, None].expand_as(query)[real], query[real], key[real])


def check_plan(plan: TilePlan, heads: int, num_queries: int, num_keys: int) -> None:
    r"""Refuses a :obj:`plan` made for other memberships than :obj:`heads`
    heads of :obj:`num_queries` queries and :obj:`num_keys` keys."""
    if not isinstance(plan, TilePlan):
        raise TypeError(f"plan must be a TilePlan (plan_tiles), got "
                        f"{type(plan).__name__}")
    if plan.q_tile.shape != (heads, num_queries) or \
            plan.k_tile.shape != (heads, num_keys):
        raise ValueError(f"plan must be made from these memberships: it "
                         f"orders {tuple(plan.q_tile.shape)} queries and "
                         f"{tuple(plan.k_tile.shape)} keys, got [H, N_q] = "
                         f"[{heads}, {num_queries}] and [H, N_k] = "
                         f"[{heads}, {num_keys}]")


class TileSequences(NamedTuple):
    r"""A plan's tiles laid out as the dense-regime kernel's sequences
    (:func:`tile_sequences`): a sequence is a run of consecutive query
    tiles of one head with the same active key tiles, its queries attending
    to those tiles' keys. Places are positions in that layout, rows
    heads-first (:math:`h N_q + i`, :math:`h N_k + j`): :obj:`q_rows`
    :obj:`[H N_q]`, the row at each query place (every row once);
    :obj:`q_place` :obj:`[H, N_q]`, each row's place; :obj:`ptr_q`
    :obj:`[B + 1]`; :obj:`k_rows` :obj:`[C]`, the row at each key place (a
    key once per sequence that pairs with its tile); :obj:`ptr_k`
    :obj:`[B + 1]`; :obj:`loops` :obj:`([L], [L])`, the (query place, key
    place) of each query whose own key (the same index) is among its
    sequence's keys; :obj:`owner` :obj:`[B]`, each sequence's (batch
    sequence, head) as :math:`g H + h` (one with keys lies in one batch
    sequence)."""

    q_rows: Tensor
    q_place: Tensor
    ptr_q: Tensor
    k_rows: Tensor
    ptr_k: Tensor
    loops: Tuple[Tensor, Tensor]
    owner: Tensor


def tile_sequences(plan: TilePlan) -> TileSequences:
    r"""The tiles of :obj:`plan` as the dense-regime kernel's sequences
    (:class:`TileSequences`): its kernel then draws and attends every pair
    of the active tiles with matrix products. A cluster's query tiles share
    their key tiles, so they are one sequence and its keys are laid out
    once. One host read (the sequences and key places).

    Example:
        >>> memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0])][:, None]
        >>> plan = plan_tiles(memb, torch.eye(2)[None], memb, tile_q=2, tile_k=2)
        >>> seq = tile_sequences(plan)
        >>> seq.q_rows.tolist(), seq.ptr_q.tolist()  # clusters 0 and 1
        ([1, 3, 4, 0, 2], [0, 3, 5])
        >>> seq.k_rows.tolist(), seq.ptr_k.tolist()
        ([1, 3, 4, 0, 2], [0, 3, 5])
    """
    H, Nq = plan.q_order.shape
    Nk = plan.k_order.size(1)
    Tq, P = plan.q_start.numel(), plan.num_tiles
    device = plan.q_order.device
    heads = torch.arange(H, device=device)[:, None]
    # A query tile continues the previous one's sequence where it is of the
    # same head and has the same key tiles (pair by pair).
    count = plan.tile_ptr.diff()
    qt = ptr2index(plan.tile_ptr, P)
    pos = torch.arange(P, device=device) - plan.tile_ptr[qt]
    before = (qt - 1).clamp(min=0)
    twin = (plan.tile_ptr[before] + pos).clamp(max=max(P - 1, 0))
    same = (qt > 0) & (pos < count[before]) & (plan.tile_col[twin] == plan.tile_col)
    differ = torch.zeros_like(count).index_add_(0, qt, (~same).long())
    new = torch.ones(Tq, dtype=torch.bool, device=device)
    new[1:] = ((plan.q_head[1:] != plan.q_head[:-1]) | (count[1:] != count[:-1])
               | (differ[1:] > 0))
    seq_of = new.cumsum(0) - 1  # each query tile's sequence
    # The keys: the pairs of each sequence's first tile.
    head, _, k_cols = tile_rows(plan)
    real = (k_cols >= 0) & new[qt][:, None]
    pair_len = real.sum(1)
    B, C = (int(x) for x in sync([], new.sum(), pair_len.sum()))
    # Queries: each tile's rows in its order, tile after tile.
    q_first = plan.q_len.cumsum(0) - plan.q_len
    q_pos = torch.empty_like(plan.q_order).scatter_(
        1, plan.q_order, torch.arange(Nq, device=device).expand(H, Nq))
    q_place = q_first[plan.q_tile] + q_pos - plan.q_start[plan.q_tile]
    rows = (heads * Nq + torch.arange(Nq, device=device)).flatten()
    q_rows = torch.empty_like(rows).scatter_(0, q_place.flatten(), rows)
    zero = count.new_zeros(1)
    ptr_q = torch.cat([zero, count.new_zeros(B).index_add_(0, seq_of, plan.q_len).cumsum(0)])
    # (nonzero_static: the size read above, not a second read on CUDA)
    at_key = torch.nonzero_static(real.flatten(), size=C).flatten()
    k_rows = (head[:, None] * Nk + k_cols).flatten()[at_key]
    pair_first = pair_len.cumsum(0) - pair_len
    ptr_k = torch.cat([zero, count.new_zeros(B).index_add_(
        0, seq_of[qt], pair_len).cumsum(0)])
    first = torch.full((B,), Tq, device=device).scatter_reduce(
        0, seq_of, torch.arange(Tq, device=device), "amin")
    head_of = plan.q_head[first]
    token = plan.q_order[head_of, plan.q_start[first]]
    owner = ptr2index(plan.ptr_q, Nq)[token] * H + head_of
    # Self-loops: query i's key i sits in its sequence where the pair
    # (the sequence's first tile, key i's tile) is active.
    loops = (q_place.new_empty(0), q_place.new_empty(0))
    if Nq == Nk and P > 0:
        keys = _tile_keys(plan)
        want = first[seq_of[plan.q_tile]] * plan.k_start.numel() + plan.k_tile
        at = torch.searchsorted(keys, want).clamp(max=P - 1)
        hit = keys[at] == want
        k_pos = torch.empty_like(plan.k_order).scatter_(
            1, plan.k_order, torch.arange(Nk, device=device).expand(H, Nk))
        k_place = pair_first[at] + k_pos - plan.k_start[plan.k_tile]
        loops = (q_place[hit], k_place[hit])
    return TileSequences(q_rows, q_place, ptr_q, k_rows, ptr_k, loops, owner)
