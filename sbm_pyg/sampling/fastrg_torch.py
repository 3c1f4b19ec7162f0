r"""The pure-PyTorch backend of :func:`~sbm_pyg.sampling.fastrg` (any
device): cell-major fastRG.

All cells :math:`(g, h, u, v)` are drawn at once; each draw's query and key
are found in one float64 cumulative sum over all heads, clusters and rows
(:class:`Cdf`), so one :func:`torch.searchsorted` call serves every sequence,
head and cluster (exact up to float64 rounding of that sum). Exact mode
draws at an inflated rate and thins (:func:`thin`). Time and memory are
:math:`O(m + (N_q + N_k) H k + G H k^2)` for :math:`m` draws, plus
:math:`O(m \log m)` for sorting the edges.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from sbm_pyg.ops.csr import sddmm
from sbm_pyg.sampling.checks import check_draws
from sbm_pyg.sampling.edges import (
    SampledEdges,
    edges_from_keys,
    keys_to_csr,
    sorted_unique,
)
from sbm_pyg.validation import Check, invalid_values, sync

__all__ = ["sample", "Cells", "forced_keys"]

# Largest rate inflation used by mode="exact": exp(-40) = 4e-18 is below the
# float64 resolution near 1, so an edge with p >= 1 is kept with probability
# 1 - exp(-40 p), which is 1 in float64.
MAX_INFLATION = 40.0
# Peak bytes per drawn (multi-)edge, output graph included (cell ids,
# endpoint ranges, uniforms, search results, the sort in unique()).
# Measured with ru_maxrss at ~10M draws: 82 (poisson) and 97 (exact).
BYTES_PER_DRAW = 104


def sample(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
           ptr_k: Tensor, checks: List[Check], mode: str, exploration: float,
           self_loops: bool, included: Optional[Sequence[Tensor]],
           max_edges: Optional[int],
           generator: Optional[torch.Generator]) -> SampledEdges:
    r"""Samples the graph (arguments validated by
    :func:`~sbm_pyg.sampling.fastrg`; :obj:`included` is :obj:`None` or the
    clamped :obj:`(i, j)` pairs); raises :obj:`checks` at its one sync."""
    Nq, H, _ = q_memb.shape
    Nk, device = k_memb.size(0), q_memb.device
    cells = Cells(q_memb, block, k_memb, ptr_q, ptr_k, mode, exploration)
    cdf_q, cdf_k, rate, inflation = cells.cdf_q, cells.cdf_k, cells.rate, cells.inflation
    Y, B, Z = cells.Y, cells.B, cells.Z
    checks = checks + cells.checks
    # Invalid input raises at the sync below, before anything is drawn.
    counts = torch.poisson(torch.nan_to_num(rate, 0.0, 0.0, 0.0).clamp(min=0),
                           generator=generator)
    num_draws, expected = sync(checks, counts.sum(), rate.sum())
    check_draws(num_draws, expected, num_draws * BYTES_PER_DRAW, max_edges,
                device, ptr_q.numel() - 1, H, Nq, Nk)
    num_draws = int(num_draws)

    # Per cell (g, h, u, v): the query segment (g, h, u), the key segment
    # (g, h, v), and offsets that turn flat CDF indices into the edge key
    # (h * N_q + i) * N_k + j.
    cell = torch.repeat_interleave(torch.arange(counts.numel(), device=device),
                                   counts.reshape(-1).long(),
                                   output_size=num_draws)
    shape = counts.shape
    heads = torch.arange(H, device=device)[None, :, None, None]
    i = cdf_q.draw(cell, 2, shape, generator)
    i += per_cell(heads * Nq - cdf_q.base[None, :, :, None], shape, cell)
    j = cdf_k.draw(cell, 3, shape, generator)
    j -= per_cell(cdf_k.base[None, :, None, :], shape, cell)
    del cell, cdf_q, cdf_k
    key = sorted_unique(i * Nk + j)  # (head, query, key) order
    del i, j
    if inflation is not None:
        assert Y is not None and Z is not None
        key = thin(key, Y, B, Z, inflation, ptr_q, H, Nq, Nk, generator)
    key = with_forced_keys(key, included, self_loops, H, Nq, Nk)
    return edges_from_keys(key, H, Nq, Nk, num_draws, expected)


class Cells:
    r"""The cells :math:`(g, h, u, v)` of a call: the memberships'
    :class:`Cdf` (:obj:`cdf_q`, :obj:`cdf_k`), the explored block
    :obj:`B`, each cell's Poisson rate :obj:`rate` :obj:`[G, H, k, k]`
    (exact mode: inflated by each sequence and head's :obj:`inflation`
    :obj:`[G, H]`, its explored memberships :obj:`Y` and :obj:`Z` kept for
    the thinning; else all three :obj:`None`), and the :obj:`checks` of
    the memberships and the rates."""

    def __init__(self, q_memb: Tensor, block: Tensor, k_memb: Tensor,
                 ptr_q: Tensor, ptr_k: Tensor, mode: str, exploration: float):
        explore = exploration > 0
        self.cdf_q = Cdf(q_memb, ptr_q, explore, "q_memb")
        self.cdf_k = Cdf(k_memb, ptr_k, explore, "k_memb")
        self.B = B = explored_block(block, exploration)
        rate = (self.cdf_q.mass[:, :, :, None] * B[None]
                * self.cdf_k.mass[:, :, None, :])  # [G, H, k, k]
        self.inflation: Optional[Tensor] = None
        self.Y: Optional[Tensor] = None
        self.Z: Optional[Tensor] = None
        if mode == "exact":
            self.Y = Y = explored_memberships(q_memb, exploration)
            self.Z = Z = explored_memberships(k_memb, exploration)
            bound = torch.einsum("ghu,huv,ghv->gh", sequence_max(Y, ptr_q), B,
                                 sequence_max(Z, ptr_k))
            self.inflation = inflation_for(bound)  # [G, H]
            rate = rate * self.inflation[:, :, None, None]
        self.rate = rate
        self.checks: List[Check] = [
            self.cdf_q.check, self.cdf_k.check,
            (~torch.isfinite(rate).all(),
             "the SBM's edge rates overflow (q_memb, block or k_memb too large)")]


def explored_block(block: Tensor, exploration: float) -> Tensor:
    r"""float64 block matrices; exploration :math:`\delta` becomes one more
    cluster (membership 1 for every node, see :class:`Cdf`) with block entry
    :math:`\delta`, so every pair's rate is :math:`p_{ij} + \delta` without
    any :math:`n \times n` matrix."""
    B = block.detach().double()
    if exploration > 0:
        B = torch.nn.functional.pad(B, (0, 1, 0, 1))
        B[:, -1, -1] = exploration
    return B


def explored_memberships(memb: Tensor, exploration: float) -> Tensor:
    r"""float64 memberships with the exploration cluster (exact mode)."""
    memb = memb.detach().double()
    if exploration > 0:
        memb = torch.cat([memb, memb.new_ones(memb.shape[:2] + (1,))], dim=-1)
    return memb


def sequence_max(memb: Tensor, ptr: Tensor) -> Tensor:
    r"""The largest membership of each sequence, head and cluster:
    :obj:`[N, H, k]` → :obj:`[G, H, k]`; 0 for an empty sequence."""
    return sequence_reduce(memb, ptr, "max").clamp(min=0)


# Rows of one piece of sequence_reduce's first pass.
PIECE_ROWS = 256


def sequence_reduce(x: Tensor, ptr: Tensor, reduce: str) -> Tensor:
    r""":obj:`reduce` (``"sum"`` or ``"max"``) of :obj:`x [N, ...]` over
    the rows of each sequence cut by :obj:`ptr [G + 1]`:
    :obj:`[G, ...]` (0 for an empty sequence), in the same order on every
    call and device.

    Two passes of :func:`torch.segment_reduce`: each sequence cut into
    pieces of :data:`PIECE_ROWS` rows, then the pieces of each sequence. One
    pass over long sequences gives one thread each output entry and a loop
    over all rows (1.6 ms for 16384 rows of 256 float64 entries on an
    H200, 0.09 ms in pieces: docs/performance.md); the pieces give the GPU
    :math:`N / 256` times more threads, and
    their bound :math:`N / 256 + G` is known without reading the device."""
    N, G = x.size(0), ptr.numel() - 1
    B = PIECE_ROWS
    if N <= B:  # one piece a sequence
        return torch.segment_reduce(x, reduce, offsets=ptr, axis=0,
                                    unsafe=True)
    P = N // B + G  # at most sum(ceil(n_g / B)) pieces
    pieces = torch.zeros(G + 1, dtype=ptr.dtype, device=ptr.device)
    torch.cumsum((ptr.diff() + B - 1) // B, 0, out=pieces[1:])
    p = torch.arange(P, dtype=ptr.dtype, device=ptr.device)
    g = torch.searchsorted(pieces[1:], p, right=True).clamp(max=max(G - 1, 0))
    # Piece p of sequence g starts B rows after the one before it; the
    # pieces past the last are empty at N.
    start = torch.where(p < pieces[-1], ptr[g] + (p - pieces[g]) * B, N)
    offsets = torch.cat([start, start.new_full((1,), N)])
    partial = torch.segment_reduce(x, reduce, offsets=offsets, axis=0,
                                   unsafe=True)  # [P, ...]
    return torch.segment_reduce(partial, reduce, offsets=pieces, axis=0,
                                unsafe=True)


def inflation_for(bound: Tensor) -> Tensor:
    r"""Smallest :math:`c \geq 1` with :math:`p \leq 1 - e^{-cp}` for all
    :math:`p \leq` :obj:`bound`: :math:`c = -\log(1 - P) / P`."""
    P = bound.clamp(0.0, 1.0)
    c = torch.where(P > 0, -torch.log1p(-P) / P.clamp(min=1e-300), 1.0)
    return c.clamp(1.0, MAX_INFLATION)


class Cdf:
    r"""One monotone float64 cumulative sum of a membership tensor over
    :obj:`(head, cluster, row)`, so that one :func:`torch.searchsorted` call
    draws the rows of every sequence, head and cluster.

    With :obj:`explore`, an extra cluster with membership 1 for every row is
    appended (random edge exploration)."""

    def __init__(self, memb: Tensor, ptr: Tensor, explore: bool, name: str):
        N, H, k = memb.shape
        k += int(explore)
        # One buffer, one copy, an in-place cumsum: cum[0] = 0 and
        # cum[t + 1] = sum of the first t + 1 entries in (head, cluster, row)
        # order.
        self.cum = memb.new_empty(H * k * N + 1, dtype=torch.float64)
        self.cum[0] = 0.0
        flat = self.cum[1:].view(H, k, N)
        flat[:, :memb.size(2)].copy_(memb.detach().permute(1, 2, 0))
        if explore:
            flat[:, -1].fill_(1.0)
        flat = flat.view(-1)
        minimum = flat.min() if flat.numel() else flat.new_zeros(())
        flat.cumsum_(0)
        # NaN fails the comparison; inf makes the total non-finite.
        self.check = (~(minimum >= 0) | ~torch.isfinite(self.cum[-1]),
                      invalid_values(name))
        # Start of segment (head, cluster, sequence) in the flat order.
        base = torch.arange(H * k, device=memb.device) * N
        start = base[None, :] + ptr[:-1, None]  # [G, H*k]
        self.lo = self.cum[start].view(-1, H, k)  # [G, H, k]
        # Masses are read off the same sum that the draws search, so a cell
        # with a positive rate always has a non-empty range of x.
        self.mass = self.cum[base[None, :] + ptr[1:, None]].view(-1, H, k) - self.lo
        # Shrunk by two ulps so that lo + u * width < hi after rounding.
        hi = self.lo + self.mass
        self.width = (torch.nextafter(torch.nextafter(hi, self.lo), self.lo)
                      - self.lo).clamp(min=0)
        self.base = base.view(H, k)

    def draw(self, cell: Tensor, dim: int, shape: torch.Size,
             generator: Optional[torch.Generator]) -> Tensor:
        r"""Flat CDF index of one row per draw, with probability proportional
        to its membership within the draw's segment. :obj:`cell` indexes the
        :obj:`[G, H, k, k]` cells; :obj:`dim` is the cluster axis of this side
        (2 for queries, 3 for keys)."""
        lo = per_cell(self.lo.unsqueeze(5 - dim), shape, cell)
        width = per_cell(self.width.unsqueeze(5 - dim), shape, cell)
        x = torch.rand(cell.numel(), dtype=torch.float64, device=cell.device,
                       generator=generator)
        x = torch.addcmul(lo, x, width)
        return torch.searchsorted(self.cum, x, right=True) - 1


def per_cell(table: Tensor, shape: torch.Size, cell: Tensor) -> Tensor:
    r"""Broadcasts a per-segment table to the :obj:`[G, H, k, k]` cells,
    then to the draws."""
    return table.expand(shape).reshape(-1)[cell]


def thin(key: Tensor, Y: Tensor, B: Tensor, Z: Tensor, c: Tensor,
         ptr_q: Tensor, H: int, Nq: int, Nk: int,
         generator: Optional[torch.Generator]) -> Tensor:
    r"""Poisson thinning: keeps a distinct edge drawn at rate :math:`c p` with
    probability :math:`\min(p, 1) / (1 - e^{-cp})`, so that
    :math:`P(\text{edge}) = \min(p, 1)` exactly."""
    i, j, head, rowptr = keys_to_csr(key, H, Nq, Nk)
    k = B.size(-1)  # named: reshape cannot infer it for empty sequences
    W = torch.bmm(Y.transpose(0, 1), B).reshape(H * Nq, k)  # [H*N_q, k]
    p = sddmm(rowptr, head * Nk + j, W, Z.transpose(0, 1).reshape(H * Nk, k))
    g = torch.searchsorted(ptr_q, i, right=True) - 1
    cp = c[g, head] * p
    keep = torch.where(p > 0, p.clamp(max=1.0) / -torch.expm1(-cp), 0.0)
    u = torch.rand(key.numel(), dtype=torch.float64, device=key.device,
                   generator=generator)
    return key[u < keep]


def with_forced_keys(key: Tensor, included: Optional[Sequence[Tensor]],
                     self_loops: bool, H: int, Nq: int, Nk: int) -> Tensor:
    r"""The sorted distinct edge keys :obj:`key` with every head's included
    :obj:`(i, j)` pairs and self-loops added."""
    forced = forced_keys(included, self_loops, H, Nq, Nk, key.device)
    return sorted_unique(torch.cat([key, *forced])) if forced else key


def forced_keys(included: Optional[Sequence[Tensor]], self_loops: bool,
                H: int, Nq: int, Nk: int, device: torch.device) -> List[Tensor]:
    r"""The keys of the edges every head has whatever is drawn: the
    included :obj:`(i, j)` pairs and the self-loops (unsorted, maybe
    repeated; an empty list for neither)."""
    forced = []
    if included is not None:
        i, j = included
        h = torch.arange(H, device=device)[:, None]
        forced.append(((h * Nq + i) * Nk + j).reshape(-1))
    if self_loops:
        forced.append(self_loop_keys(H, Nq, device))
    return forced


def self_loop_keys(H: int, N: int, device: torch.device) -> Tensor:
    r"""The keys of the edges :math:`i \to i` of every head."""
    i = torch.arange(N, device=device)
    h = torch.arange(H, device=device)[:, None]
    return ((h * N + i) * N + i).reshape(-1)
