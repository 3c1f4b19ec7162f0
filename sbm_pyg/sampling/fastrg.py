r"""fastRG (the paper's Algorithm 1) over a ragged batch, all heads at once."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg._validation import (
    check_draws,
    check_generator,
    invalid_values,
    nonnegative_finite,
    require_tensor,
    sync,
)
from sbm_pyg.ops.csr import full_precision, sddmm
from sbm_pyg.sampling import _compiled
from sbm_pyg.sampling.graph import (
    PtrLike,
    SampledGraph,
    _graph_from_keys,
    _included_pairs,
    _keys_to_csr,
    _pointers,
    _sorted_unique,
)

__all__ = ["fastrg", "MODES", "BACKENDS"]

MODES = ("poisson", "exact")
BACKENDS = ("compiled", "torch")
# Largest rate inflation used by mode="exact": exp(-40) = 4e-18 is below the
# float64 resolution near 1, so an edge with p >= 1 is kept with probability
# 1 - exp(-40 p), which is 1 in float64.
MAX_INFLATION = 40.0
# Peak bytes per drawn (multi-)edge inside fastrg, output graph included
# (cell ids, endpoint ranges, uniforms, search results, the sort in unique()).
# Measured with ru_maxrss at ~10M draws: 82 (poisson) and 97 (exact).
BYTES_PER_DRAW = 104


def _check_sbm(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: PtrLike,
               ptr_k: PtrLike, mode: str, exploration: float,
               self_loops: bool,
               check_memberships: bool = True) -> Tuple[Tensor, Tensor, list]:
    require_tensor("q_memb", q_memb, 3, floating=True)
    require_tensor("block", block, 3, floating=True)
    require_tensor("k_memb", k_memb, 3, floating=True)
    Nq, H, k = q_memb.shape
    if block.shape != (H, k, k):
        raise ValueError(f"block must have shape [H, k, k] = [{H}, {k}, {k}] "
                         f"to match q_memb {tuple(q_memb.shape)}, got "
                         f"{tuple(block.shape)}")
    if k_memb.shape[1:] != (H, k):
        raise ValueError(f"k_memb must have shape [N_k, {H}, {k}] to match "
                         f"q_memb {tuple(q_memb.shape)}, got "
                         f"{tuple(k_memb.shape)}")
    if not (q_memb.device == block.device == k_memb.device):
        raise ValueError("q_memb, block and k_memb must be on the same device")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(exploration, (int, float)) or not (
            math.isfinite(exploration) and exploration >= 0):
        raise ValueError(f"exploration must be a finite number >= 0, got "
                         f"{exploration!r}")
    Nk, device = k_memb.size(0), q_memb.device
    if H * max(Nq, 1) * max(Nk, 1) >= 2**62:
        raise ValueError(f"H * N_q * N_k = {H} * {Nq} * {Nk} overflows the "
                         f"int64 edge keys")
    ptr_q, ptr_k, checks = _pointers(ptr_q, ptr_k, Nq, Nk, device)
    checks.append(nonnegative_finite("block", block))
    if check_memberships:  # fastrg reads these checks off its CDFs instead
        checks += [nonnegative_finite("q_memb", q_memb),
                   nonnegative_finite("k_memb", k_memb)]
    if self_loops:
        if Nq != Nk:
            raise ValueError(f"self_loops=True needs queries and keys to be "
                             f"the same sequences, got N_q={Nq}, N_k={Nk}")
        checks.append(((ptr_q != ptr_k).any(),
                       "self_loops=True needs queries and keys to be the "
                       "same sequences: ptr_q must equal ptr_k"))
    return ptr_q, ptr_k, checks



def _explored_block(block: Tensor, exploration: float) -> Tensor:
    r"""float64 block matrices; exploration :math:`\delta` becomes one more
    cluster (membership 1 for every node, see :class:`_Cdf`) with block entry
    :math:`\delta`, so every pair's rate is :math:`p_{ij} + \delta` without
    any :math:`n \times n` matrix."""
    B = block.detach().double()
    if exploration > 0:
        B = torch.nn.functional.pad(B, (0, 1, 0, 1))
        B[:, -1, -1] = exploration
    return B


def _explored_memberships(memb: Tensor, exploration: float) -> Tensor:
    # float64 memberships with the exploration cluster (exact mode only).
    memb = memb.detach().double()
    if exploration > 0:
        memb = torch.cat([memb, memb.new_ones(memb.shape[:2] + (1,))], dim=-1)
    return memb


def _segment_max(x: Tensor, ptr: Tensor) -> Tensor:
    # [N, H, k] -> [G, H, k]; empty sequences give 0.
    out = torch.segment_reduce(x, "max", offsets=ptr, axis=0, unsafe=True)
    return out.clamp(min=0)


def _inflation(bound: Tensor) -> Tensor:
    r"""Smallest :math:`c \geq 1` with :math:`p \leq 1 - e^{-cp}` for all
    :math:`p \leq` :obj:`bound`: :math:`c = -\log(1 - P) / P`."""
    P = bound.clamp(0.0, 1.0)
    c = torch.where(P > 0, -torch.log1p(-P) / P.clamp(min=1e-300), 1.0)
    return c.clamp(1.0, MAX_INFLATION)


class _Cdf:
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
        lo = _per_cell(self.lo.unsqueeze(5 - dim), shape, cell)
        width = _per_cell(self.width.unsqueeze(5 - dim), shape, cell)
        x = torch.rand(cell.numel(), dtype=torch.float64, device=cell.device,
                       generator=generator)
        x = torch.addcmul(lo, x, width)
        return torch.searchsorted(self.cum, x, right=True) - 1


def _per_cell(table: Tensor, shape: torch.Size, cell: Tensor) -> Tensor:
    # Broadcasts a per-segment table to the [G, H, k, k] cells, then to draws.
    return table.expand(shape).reshape(-1)[cell]




def _thin(key: Tensor, Y: Tensor, B: Tensor, Z: Tensor, c: Tensor,
          ptr_q: Tensor, H: int, Nq: int, Nk: int,
          generator: Optional[torch.Generator]) -> Tensor:
    r"""Poisson thinning: keeps a distinct edge drawn at rate :math:`c p` with
    probability :math:`\min(p, 1) / (1 - e^{-cp})`, so that
    :math:`P(\text{edge}) = \min(p, 1)` exactly."""
    row, j, head, rowptr = _keys_to_csr(key, H, Nq, Nk)
    i = row - head * Nq
    k = B.size(-1)  # named: reshape cannot infer it for empty sequences
    W = torch.bmm(Y.transpose(0, 1), B).reshape(H * Nq, k)  # [H*N_q, k]
    p = sddmm(rowptr, head * Nk + j, W, Z.transpose(0, 1).reshape(H * Nk, k))
    g = torch.searchsorted(ptr_q, i, right=True) - 1
    cp = c[g, head] * p
    keep = torch.where(p > 0, p.clamp(max=1.0) / -torch.expm1(-cp), 0.0)
    u = torch.rand(key.numel(), dtype=torch.float64, device=key.device,
                   generator=generator)
    return key[u < keep]




def _self_loop_keys(H: int, N: int, device: torch.device) -> Tensor:
    i = torch.arange(N, device=device)
    h = torch.arange(H, device=device)[:, None]
    return ((h * N + i) * N + i).reshape(-1)




@torch.compiler.disable  # data-dependent edge count: runs eagerly
def fastrg(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
    include_edges: Optional[Tensor] = None,
    max_edges: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
) -> SampledGraph:
    r"""Samples a query→key graph per sequence and head with fastRG
    (Rohe et al., 2018; Algorithm 1 of the SBM-Transformer paper).

    For sequence :math:`g` and head :math:`h`, with cluster masses
    :math:`s^Y_u = \sum_{i \in g} Y_{iu}` and :math:`s^Z_v = \sum_{j \in g}
    Z_{jv}`, the number of draws from cluster pair :math:`(u, v)` is
    :math:`\mathrm{Poisson}(s^Y_u B_{uv} s^Z_v)`; each draw picks query
    :math:`i` with probability :math:`Y_{iu}/s^Y_u` and key :math:`j` with
    :math:`Z_{jv}/s^Z_v`. The multiplicity of pair :math:`(i, j)` is then
    :math:`\mathrm{Poisson}(p_{ij})`. Duplicates are merged:

    * :obj:`mode="poisson"`: :math:`P(i \to j) = 1 - e^{-p_{ij}}`.
    * :obj:`mode="exact"`: :math:`P(i \to j) = \min(p_{ij}, 1)`, edges
      independent. The multigraph is drawn at rate :math:`c\,p_{ij}` and
      each distinct edge kept with probability :math:`\min(p_{ij}, 1) /
      (1 - e^{-c p_{ij}})`, with :math:`c = -\log(1 - P)/P` from the bound
      :math:`P = \max_i \mathbf{Y}_i \, \mathbf{B} \, \max_j \mathbf{Z}_j
      \geq p_{ij}` of each sequence and head (capped at 40 when
      :math:`P \geq 1`). Extra cost: :math:`c` times as many draws (1.39 at
      :math:`P = 0.5`, 2.56 at 0.9, 4.65 at 0.99), one
      :math:`O(N \cdot k^2)` product :math:`\mathbf{Y}\mathbf{B}`, an
      :math:`O(E k)` sampled dot product for the thinning, and one more host
      sync.

    Everything is vectorized over sequences, heads and clusters. Time and
    memory are :math:`O(m + (N_q + N_k) H k + G H k^2)` for :math:`m`
    draws, plus :math:`O(m \log m)` for sorting the edges.

    Args:
        q_memb (Tensor): query memberships :obj:`[N_q, H, k]`, :math:`\geq 0`.
        block (Tensor): block matrices :obj:`[H, k, k]`, :math:`\geq 0`.
        k_memb (Tensor): key memberships :obj:`[N_k, H, k]`, :math:`\geq 0`.
        ptr_q (LongTensor, optional): :obj:`[G + 1]` CSR pointer cutting the
            query rows into :math:`G` sequences (:obj:`None`: one sequence).
        ptr_k (LongTensor, optional): the same for key rows.
        mode (str): :obj:`"poisson"` or :obj:`"exact"`, see above.
        exploration (float): :math:`\delta \geq 0`, added to every pair's
            rate within a sequence (the paper's random edge exploration) as
            one extra cluster, never an :math:`n \times n` matrix.
        self_loops (bool): if set, query :math:`i` always gets key
            :math:`i` (the paper's "+I" variant); queries and keys must be
            the same sequences.
        include_edges (LongTensor, optional): :obj:`[2, E]` pairs
            (key :math:`j`, query :math:`i`) added to every head's graph
            without duplicates, e.g. the input graph's :obj:`edge_index`
            for structure-aware attention; a pair must not cross sequences.
        max_edges (int, optional): raise a :class:`ValueError` if more
            draws than this are made, before anything of that size is
            allocated. Independently, a draw that would not fit into the
            available memory raises too.
        generator (torch.Generator, optional): source of randomness; the
            same state gives the same graph (for a backend).
        backend (str, optional): :obj:`"compiled"` (the C++ kernels of
            :obj:`sbm_pyg._C`, CPU), :obj:`"torch"` (pure PyTorch, any
            device) or :obj:`None`: compiled where it is built and the
            memberships are on the CPU, else torch. Both sample the same
            distribution; their random streams differ.

    Returns:
        :class:`SampledGraph`.

    Notes:
        The torch backend draws all cells :math:`(g, h, u, v)` at once and
        finds endpoints in one float64 cumulative sum over all heads,
        clusters and rows (exact up to float64 rounding of that sum).

        The compiled backend samples query-major: each :math:`(h, i)` row
        draws its Poisson degree :math:`\mathrm{Poisson}(c \lambda_i)`,
        :math:`\lambda_i = \mathbf{Y}_i \mathbf{B} \mathbf{s}^Z`, picks
        each draw's key cluster from the :math:`k` weights
        :math:`(\mathbf{Y}_i \mathbf{B})_v s^Z_v` (a guide table) and its
        key from an alias table of :math:`(g, h, v)` (float32
        probabilities), and merges duplicates within the row. Exact mode
        bounds each row separately, :math:`P_i = \mathbf{Y}_i \mathbf{B}
        \max_j \mathbf{Z}_j`, and thins with a squeeze (a uniform below
        :math:`1/c` keeps an edge without computing :math:`p_{ij}`). A row
        whose drawing would cost more than testing its keys (expected
        draws :math:`\geq` half its keys) is sampled with one Bernoulli per
        key instead, so a dense head costs :math:`O(n_k)` per query in
        either mode; :obj:`num_draws` then counts those tested pairs.
        Each row has its own counter-based random stream, seeded from
        :obj:`generator`, so the graph does not depend on the number of
        threads.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q_memb = torch.rand(100, 2, 8)  # [N_q, H, k]
        >>> k_memb = torch.rand(100, 2, 8)  # [N_k, H, k]
        >>> block = torch.softmax(torch.randn(2, 64, generator=g), -1).view(2, 8, 8)
        >>> graph = fastrg(q_memb, block, k_memb, ptr_q=[0, 40, 100],
        ...                ptr_k=[0, 40, 100], mode="exact", generator=g)
        >>> graph.edge_index.size(0), graph.density().shape  # [G, H]
        (2, torch.Size([2, 2]))
    """
    if backend not in (None,) + BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got "
                         f"{backend!r}")
    device = q_memb.device if isinstance(q_memb, Tensor) else None
    if backend is None:
        backend = ("compiled" if _compiled.available() and device is not None
                   and device.type == "cpu" else "torch")
    elif backend == "compiled" and not _compiled.available():
        raise ValueError("backend='compiled' needs the compiled kernels "
                         "(sbm_pyg._C), which are not built; reinstall with "
                         "pip install --no-build-isolation . and a C++ "
                         "compiler")
    elif backend == "compiled" and device is not None and device.type != "cpu":
        raise ValueError(f"backend='compiled' runs on the CPU, the "
                         f"memberships are on {device}")
    compiled = backend == "compiled"
    # Both backends check the memberships in their own first pass.
    ptr_q, ptr_k, checks = _check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                      mode, exploration, self_loops,
                                      check_memberships=False)
    check_generator(generator, q_memb.device)
    if max_edges is not None and (not isinstance(max_edges, int)
                                  or max_edges < 0):
        raise ValueError(f"max_edges must be a non-negative int or None, got "
                         f"{max_edges!r}")
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    included = None
    if include_edges is not None:
        *included, check = _included_pairs(include_edges, ptr_q, ptr_k, Nq, Nk)
        checks.append(check)
    # The sampler computes in the memberships' precision (float64 or
    # float32) whatever autocast is on around it.
    with full_precision(q_memb.device):
        if compiled:
            fields = _compiled.sample(q_memb, block, k_memb, ptr_q, ptr_k,
                                      checks, mode, exploration, self_loops,
                                      included, max_edges, generator)
            return SampledGraph(num_queries=Nq, num_keys=Nk, num_heads=H,
                                ptr_q=ptr_q, ptr_k=ptr_k, **fields)
        return _fastrg_torch(q_memb, block, k_memb, ptr_q, ptr_k, checks,
                             mode, exploration, self_loops, included,
                             max_edges, generator)


def _fastrg_torch(q_memb: Tensor, block: Tensor, k_memb: Tensor,
                  ptr_q: Tensor, ptr_k: Tensor, checks: list, mode: str,
                  exploration: float, self_loops: bool, included,
                  max_edges: Optional[int],
                  generator: Optional[torch.Generator]) -> SampledGraph:
    r"""The pure-PyTorch backend of :func:`fastrg` (any device): cell-major
    fastRG with one float64 CDF over all heads, clusters and rows."""
    Nq, H, _ = q_memb.shape
    Nk, device = k_memb.size(0), q_memb.device
    explore = exploration > 0
    cdf_q = _Cdf(q_memb, ptr_q, explore, "q_memb")
    cdf_k = _Cdf(k_memb, ptr_k, explore, "k_memb")
    checks += [cdf_q.check, cdf_k.check]
    B = _explored_block(block, exploration)
    rate = (cdf_q.mass[:, :, :, None] * B[None]
            * cdf_k.mass[:, :, None, :])  # [G, H, k, k]
    inflation = None
    if mode == "exact":
        Y = _explored_memberships(q_memb, exploration)
        Z = _explored_memberships(k_memb, exploration)
        bound = torch.einsum("ghu,huv,ghv->gh", _segment_max(Y, ptr_q), B,
                             _segment_max(Z, ptr_k))
        inflation = _inflation(bound)  # [G, H]
        rate = rate * inflation[:, :, None, None]
    checks.append((~torch.isfinite(rate).all(),
                   "the SBM's edge rates overflow (q_memb, block or k_memb "
                   "too large)"))
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
    i += _per_cell(heads * Nq - cdf_q.base[None, :, :, None], shape, cell)
    j = cdf_k.draw(cell, 3, shape, generator)
    j -= _per_cell(cdf_k.base[None, :, None, :], shape, cell)
    del cell, cdf_q, cdf_k
    key = _sorted_unique(i * Nk + j)  # (head, query, key) order
    del i, j
    if inflation is not None:
        key = _thin(key, Y, B, Z, inflation, ptr_q, H, Nq, Nk, generator)
    forced = []
    if included is not None:
        i, j = included
        h = torch.arange(H, device=device)[:, None]
        forced.append(((h * Nq + i) * Nk + j).reshape(-1))
    if self_loops:
        forced.append(_self_loop_keys(H, Nq, device))
    if forced:
        key = _sorted_unique(torch.cat([key, *forced]))
    return _graph_from_keys(key, H, Nq, Nk, ptr_q, ptr_k, num_draws, expected)


