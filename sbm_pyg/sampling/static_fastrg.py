r"""fastRG into buffers of a size fixed before the call: the sampler of a
layer that a compiler traces as one graph (:func:`torch.compile` with
:obj:`fullgraph=True`) or a GPU replays as one captured graph. Every shape
is a function of the input shapes and a :obj:`capacity`; nothing is read
to the host; the randomness is a function of a seed tensor.

The same law as :func:`~sbm_pyg.sampling.fastrg`, drawn another way. The
draws of all cells :math:`(g, h, u, v)` of a call are the arrivals of one
unit-rate Poisson process on :math:`[0, \Lambda)`, :math:`\Lambda` the sum
of the cells' rates laid end to end: arrival :math:`s` is at :math:`T_s =
\sum_{t \leq s} -\log U_t` and falls in the cell whose stretch holds it, so
the number of draws is :math:`\mathrm{Poisson}(\Lambda)` and each cell's
:math:`\mathrm{Poisson}` of its own rate, independent. The buffer has
:obj:`capacity` arrivals; an arrival at or past :math:`\Lambda` is no draw.
When :math:`T_{\mathit{capacity}} < \Lambda` the draws did not fit: the
graph then lacks the draws past the capacity (of the cells at the end of
the order), and :attr:`StaticGraph.overflow` says so on the device. Each
draw's query and key are found as :mod:`~sbm_pyg.sampling.fastrg_torch`
finds them (one cumulative sum over heads, clusters and rows); duplicates
are merged by sorting (a merged or missing edge takes the sentinel key,
sorted past the valid ones), and :obj:`mode="exact"` thins the distinct
edges with a uniform of each edge's own key.

The uniforms are counter-based (:func:`counter_uniform`): a hash of the
seed, a stream and an index, in 64-bit integer operations that never
overflow, so the same seed gives the same graph eagerly, compiled, on the
CPU and on a GPU.

The graph's CSR arrays have the buffer's length, :obj:`capacity` plus the
forced edges (self-loops, included pairs): the edges past
:obj:`rowptr[-1]` are padding (column 0, never in a row or column
pointer's range), which the fused attention kernels, walking rows and
columns by their pointers, never read.
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from sbm_pyg.ops.backend_info import resolve_backend
from sbm_pyg.ops.csr import full_precision
from sbm_pyg.ops.graph import INDEX_DTYPE, CSRGraph, check_index_range
from sbm_pyg.sampling import static_fastrg_op
from sbm_pyg.sampling.checks import MODES
from sbm_pyg.sampling.fastrg_torch import Cdf, Cells, forced_keys, per_cell
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import Check, check_memory

__all__ = ["StaticGraph", "fastrg_static", "counter_uniform", "valid_graph",
           "round_capacity", "expected_draws"]

_M32 = 0xFFFFFFFF
# The row streams of one call: the arrivals' gaps, the draws' queries and
# keys, and (per distinct edge) exact mode's thinning.
_GAP, _QUERY, _KEY, _KEEP = range(4)
# Distinct edges whose p_ij exact mode computes at once: [chunk, k] floats.
_CHUNK = 1 << 16
#: Peak bytes a slot of the buffers takes while a graph is drawn, the
#: graph included: measured (ru_maxrss, 4 M slots, k = 16;
#: docs/runs/cpu/static-bytes) 91.8 in poisson mode and 166.0 in exact
#: mode, whose thinning's chunks add a fixed [chunk, k] on top.
BYTES_PER_SLOT = 192


def _mul32(x: Tensor, c: int) -> Tensor:
    # x * c mod 2^32 for x in [0, 2^32) and c < 2^32, in int64 without
    # overflow: the high half's product only matters mod 2^16.
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    # MurmurHash3's finalizer: a bijection of [0, 2^32).
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def counter_uniform(seed: Tensor, stream: int, index: Tensor) -> Tensor:
    r"""Uniforms in :math:`(0, 1)`, float64 on a grid of :math:`2^{-32}`
    (as fine as a float32 uniform's is coarse, :math:`2^{-24}`), one per
    entry of :obj:`index` (int64, :math:`\geq 0`): a hash of the 0-dim
    int64 :obj:`seed` (:math:`\geq 0`), the :obj:`stream` and the index,
    so that a value depends on nothing else (not the device, the order or
    the number of entries)."""
    # The seed's two words and the stream folded into one 32-bit key (on
    # the 0-dim seed: nothing per entry), then the index's two words.
    key = _mix32(_mix32((seed & _M32) ^ (0x9E3779B9 * (stream + 1) & _M32))
                 ^ ((seed >> 32) & _M32))
    bits = _mix32(_mix32((index & _M32) ^ key) ^ ((index >> 32) & _M32))
    return (bits.double() + 0.5) * 2.0 ** -32


class StaticGraph(NamedTuple):
    r"""What :func:`fastrg_static` returns: the :obj:`graph` (its CSR
    padded to the buffer's length; :func:`valid_graph` cuts it), the edges
    of each sequence and head :obj:`edges` :obj:`[G, H]`, the Poisson mean
    of the draws :obj:`expected_draws` (0-dim), :obj:`overflow` (0-dim
    bool: the draws did not fit the capacity, the graph lacks some),
    :obj:`above_one` (0-dim bool: in exact mode a drawn pair's
    :math:`p_{ij}`, exploration left out, exceeds 1 and was taken with
    probability 1; always :obj:`False` in poisson mode), and the deferred
    :obj:`checks` (flag, message) of the inputs, for the caller to raise
    (:func:`torch._assert_async`)."""

    graph: SampledGraph
    edges: Tensor
    expected_draws: Tensor
    overflow: Tensor
    above_one: Tensor
    checks: List[Check]


def fastrg_static(q_memb: Tensor, block: Tensor, k_memb: Tensor,  # noqa: PLR0913
                  ptr_q: Tensor, ptr_k: Tensor, *, capacity: int, seed: Tensor,
                  mode: str = "poisson", exploration: float = 0.0,
                  self_loops: bool = False,
                  included: Optional[Sequence[Tensor]] = None,
                  backend: str = "auto") -> StaticGraph:
    r"""Samples :func:`~sbm_pyg.sampling.fastrg`'s graph of every sequence
    and head into buffers of :obj:`capacity` draws (see the module). The
    arguments are :func:`~sbm_pyg.sampling.fastrg`'s, checked shapes and
    pointers (:func:`~sbm_pyg.sampling.checks.check_pointers`), with
    :obj:`included` the clamped :obj:`(i, j)` pairs of its
    :obj:`include_edges` (:func:`~sbm_pyg.sampling.checks.included_pairs`)
    and :obj:`seed` a 0-dim int64 tensor :math:`\geq 0` on the memberships'
    device.

    :obj:`backend` :obj:`"cpp"` (CPU) samples with the default route's row
    sampler (:mod:`~sbm_pyg.sampling.static_fastrg_op`: the graph of
    :func:`~sbm_pyg.sampling.fastrg` for the same stream seed while the
    draws fit, each row's draws, or a densely sampled row's keys, counted
    against the capacity), :obj:`"torch"` with the arrivals above, any
    device; :obj:`"auto"` takes :obj:`"cpp"` where the memberships are on
    the CPU and the extension is built, else :obj:`"torch"` (on a GPU the
    only one a captured graph replays; :func:`~sbm_pyg.ops.resolve_backend`
    with :obj:`static=True`).

    Example:
        >>> q = torch.rand(50, 2, 4)
        >>> b = torch.rand(2, 4, 4) * 0.1
        >>> ptr = torch.tensor([0, 20, 50])
        >>> res = fastrg_static(q, b, q, ptr, ptr, capacity=4096,
        ...                     seed=torch.tensor(0))
        >>> res.graph.csr.col.numel(), bool(res.overflow)
        (4096, False)
        >>> int(res.edges.sum()) == valid_graph(res.graph).num_edges
        True
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    backend = resolve_backend("sampler", backend, q_memb.device, static=True)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    if not (isinstance(seed, Tensor) and seed.dim() == 0
            and seed.dtype == torch.int64):
        raise TypeError("seed must be a 0-dim int64 tensor")
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    # The buffers' length, known before anything is allocated: guarded
    # against int32 CSR and the memory (eagerly: a traced call has no
    # memory to ask, and was guarded when run eagerly first).
    slots = (capacity + (0 if included is None else H * included[0].numel())
             + (H * Nq if self_loops else 0))
    check_index_range(slots, H * Nq, H * Nk)
    if not torch.compiler.is_compiling():
        need = slots * BYTES_PER_SLOT
        if backend == "cpp":
            need = (slots * static_fastrg_op.BYTES_PER_SLOT
                    + static_fastrg_op.table_bytes(H, q_memb.size(2), Nk))
        check_memory(need, q_memb.device,
                     f"fastrg_static's buffers of {slots} slots (capacity={capacity})")
    if backend == "cpp":
        csr, expected, overflow, above_one, checks = static_fastrg_op.capped_rows(
            q_memb, block, k_memb, ptr_q, ptr_k, capacity, seed, mode,
            exploration, self_loops, included)
        return _static_graph(csr, ptr_q, ptr_k, Nq, Nk, H, expected, overflow,
                             above_one, checks)
    with full_precision(q_memb.device):
        keys, expected, overflow, above_one, checks = _draw_keys(
            q_memb.detach(), block.detach(), k_memb.detach(), ptr_q, ptr_k,
            capacity, seed, mode, exploration)
    forced = forced_keys(included, self_loops, H, Nq, Nk, keys.device)
    if forced:
        keys = _distinct(torch.cat([keys, *forced]), H * Nq * Nk)
    return _static_graph(_csr(keys, H, Nq, Nk), ptr_q, ptr_k, Nq, Nk, H,
                         expected, overflow, above_one, checks)


def _static_graph(csr: CSRGraph, ptr_q: Tensor, ptr_k: Tensor, Nq: int, Nk: int,
                  H: int, expected: Tensor, overflow: Tensor, above_one: Tensor,
                  checks: List[Check]) -> StaticGraph:
    # Each sequence's rows of each head cut the row pointer.
    rows = (torch.arange(H, device=ptr_q.device)[None, :] * Nq
            + ptr_q[:, None])  # [G + 1, H]
    at = csr.rowptr.long()[rows]
    edges = at[1:] - at[:-1]
    graph = SampledGraph(csr, Nq, Nk, H, ptr_q, ptr_k, 0, 0.0)
    return StaticGraph(graph, edges, expected, overflow, above_one, checks)


def _draw_keys(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
               ptr_k: Tensor, capacity: int, seed: Tensor, mode: str,
               exploration: float):
    # The sorted distinct keys (h N_q + i) N_k + j of the drawn (and, in
    # exact mode, kept) edges, padded with the sentinel H N_q N_k to the
    # capacity; the expected draws, the overflow and above-one flags and
    # the checks.
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    cells = Cells(q_memb, block, k_memb, ptr_q, ptr_k, mode, exploration)
    cdf_q, cdf_k, inflation = cells.cdf_q, cells.cdf_k, cells.inflation
    rate = _rates(cells)
    shape = rate.shape
    sentinel = H * Nq * Nk
    no = torch.zeros((), dtype=torch.bool, device=rate.device)
    if not Nq or not Nk or not rate.numel():  # no pair: nothing to draw
        return (torch.full((capacity,), sentinel, device=rate.device), rate.sum().double(),
                no, no, cells.checks)
    ends = rate.reshape(-1).cumsum(0)  # each cell's stretch ends here
    total = ends[-1]
    slot = torch.arange(capacity, device=rate.device)
    arrival = (-torch.log(counter_uniform(seed, _GAP, slot))).cumsum(0)
    drawn = arrival < total
    overflow = drawn[-1]
    cell = torch.searchsorted(ends, arrival, right=True).clamp(max=ends.numel() - 1)
    heads = torch.arange(H, device=rate.device)[None, :, None, None]
    i = _search(cdf_q, cell, 2, shape, counter_uniform(seed, _QUERY, slot))
    i = i + per_cell(heads * Nq - cdf_q.base[None, :, :, None], shape, cell)
    j = _search(cdf_k, cell, 3, shape, counter_uniform(seed, _KEY, slot))
    j = j - per_cell(cdf_k.base[None, :, None, :], shape, cell)
    keys = _distinct(torch.where(drawn, i * Nk + j, sentinel), sentinel)
    above_one = no
    if inflation is not None:
        assert cells.Y is not None and cells.Z is not None
        keys, above_one = _thin(keys, cells.Y, cells.B, cells.Z, inflation,
                                ptr_q, seed, exploration,
                                torch.float64 if q_memb.dtype == torch.float64
                                else torch.float32)
    return keys, total, overflow, above_one, cells.checks


def _rates(cells: Cells) -> Tensor:
    # The cells' rates as the draws use them: a bad rate (flagged by the
    # cells' checks) draws nothing.
    return torch.nan_to_num(cells.rate, 0.0, 0.0, 0.0).clamp(min=0)


def expected_draws(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
                   ptr_k: Tensor, *, mode: str = "poisson",
                   exploration: float = 0.0, backend: str = "auto") -> Tensor:
    r"""The Poisson mean of :func:`fastrg_static`'s draws for these
    arguments (0-dim float64 on their device, nothing read) and
    :obj:`backend` (:func:`fastrg_static`'s; :obj:`"cpp"` counts a densely
    sampled row at its keys): what :func:`round_capacity` sizes a capacity
    from before a first call.

    Example:
        >>> q = torch.full((10, 1, 2), 0.5)
        >>> b = torch.full((1, 2, 2), 0.0625)
        >>> ptr = torch.tensor([0, 10])
        >>> float(expected_draws(q, b, q, ptr, ptr))  # 100 pairs of p_ij = 0.0625
        6.25
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if resolve_backend("sampler", backend, q_memb.device, static=True) == "cpp":
        return static_fastrg_op.capped_expected_draws(
            q_memb, block, k_memb, ptr_q, ptr_k, mode, exploration)
    with full_precision(q_memb.device):
        return _rates(Cells(q_memb.detach(), block.detach(), k_memb.detach(),
                            ptr_q, ptr_k, mode, exploration)).sum()


def _search(cdf: Cdf, cell: Tensor, dim: int, shape: torch.Size,
            u: Tensor) -> Tensor:
    # Cdf.draw with the given uniforms: the flat index of one row per draw.
    lo = per_cell(cdf.lo.unsqueeze(5 - dim), shape, cell)
    width = per_cell(cdf.width.unsqueeze(5 - dim), shape, cell)
    return torch.searchsorted(cdf.cum, torch.addcmul(lo, u, width),
                              right=True) - 1


def _distinct(keys: Tensor, sentinel: int) -> Tensor:
    # Sorted, each key once, the rest the sentinel (sorted last).
    keys = keys.sort().values
    first = torch.cat([keys.new_ones(1, dtype=torch.bool), keys[1:] != keys[:-1]])
    return _compact(keys, first, sentinel)


def _compact(keys: Tensor, keep: Tensor, sentinel: int) -> Tensor:
    # The sorted keys where keep is set, in order, then the sentinel: each
    # entry scattered to its place (kept ones by their rank, the others
    # after them in order: a permutation, so no slot is written twice), in
    # O(n) where a second sort took O(n log n).
    rank = torch.cumsum(keep, 0)  # kept up to and including each entry
    index = torch.arange(keys.numel(), device=keys.device)
    place = torch.where(keep, rank - 1, rank[-1:] + index - rank)
    return torch.empty_like(keys).scatter_(0, place, torch.where(keep, keys, sentinel))


def _thin(keys: Tensor, Y: Tensor, B: Tensor, Z: Tensor, c: Tensor,
          ptr_q: Tensor, seed: Tensor, exploration: float, dtype: torch.dtype):
    # fastrg_torch.thin on the padded keys, with each edge's uniform from its
    # key: P(edge) = min(p_ij, 1), p_ij in dtype (the memberships', as the
    # compiled samplers compute it). Also the flag of a drawn pair whose SBM
    # p_ij (the exploration taken off) exceeds 1.
    Nq, H, k = Y.shape
    Nk = Z.size(0)
    sentinel = H * Nq * Nk
    valid = keys < sentinel
    row = torch.where(valid, keys // Nk, 0)  # h N_q + i
    j = keys % Nk
    head = row // Nq
    W = torch.bmm(Y.transpose(0, 1), B).reshape(H * Nq, k).to(dtype)
    Zf = Z.transpose(0, 1).reshape(H * Nk, k).to(dtype)
    col = head * Nk + j
    # Chunks of a fixed size: no [E, k] buffer, and a count known from the
    # capacity; each chunk's dot products as one batched product.
    p = torch.cat([torch.bmm(W.index_select(0, row[s:s + _CHUNK])[:, None],
                             Zf.index_select(0, col[s:s + _CHUNK])[:, :, None]).view(-1)
                   for s in range(0, keys.numel(), _CHUNK)]).double()
    g = (torch.searchsorted(ptr_q, row % Nq, right=True) - 1).clamp(0, c.size(0) - 1)
    cp = c[g, head] * p
    keep = torch.where(p > 0, p.clamp(max=1.0) / -torch.expm1(-cp), 0.0)
    u = counter_uniform(seed, _KEEP, torch.where(valid, keys, 0))
    over = ((p - exploration > 1 + 1e-6) & valid).any()
    return _compact(keys, valid & (u < keep), sentinel), over


def _csr(keys: Tensor, H: int, Nq: int, Nk: int) -> CSRGraph:
    # The padded int32 CSR in both orders of the sorted keys (sentinels
    # last): pointers by binary search, the column order by a stable sort.
    R, C = H * Nq, H * Nk
    valid = keys < R * Nk
    starts = torch.arange(R + 1, device=keys.device) * Nk
    rowptr = torch.searchsorted(keys, starts)
    # An empty side has no valid key: the divisors only need to be nonzero.
    row = torch.where(valid, keys // max(Nk, 1), 0)
    col = torch.where(valid, row // max(Nq, 1) * Nk + keys % max(Nk, 1), 0)
    order, perm = torch.sort(torch.where(valid, col * R + row, C * R),
                             stable=True)
    colptr = torch.searchsorted(order, torch.arange(C + 1, device=keys.device) * R)
    csr = CSRGraph(rowptr.to(INDEX_DTYPE), col.to(INDEX_DTYPE),
                   colptr.to(INDEX_DTYPE), perm.to(INDEX_DTYPE))
    csr.set_row_t(row[perm].to(INDEX_DTYPE))
    csr.set_row(row.to(INDEX_DTYPE))
    return csr


def valid_graph(graph: SampledGraph) -> SampledGraph:
    r"""A padded graph of :func:`fastrg_static` cut to its edges (one host
    read: their count), as :func:`~sbm_pyg.sampling.fastrg` returns
    graphs."""
    csr = graph.csr
    E = int(csr.rowptr[-1])
    # The padding is last in both orders.
    cut = CSRGraph(csr.rowptr, csr.col[:E], csr.colptr, csr.perm[:E])
    cut.set_row_t(csr.row_t()[:E])
    return SampledGraph(cut, graph.num_queries, graph.num_keys, graph.num_heads,
                        graph.ptr_q, graph.ptr_k, graph.num_draws,
                        graph.expected_draws)


def round_capacity(expected_draws: float, deviations: float = 8.0) -> int:
    r"""A capacity for draws of Poisson mean :obj:`expected_draws` (e.g. a
    static call's :obj:`expected_draws`, read when convenient): the mean
    plus :obj:`deviations` standard deviations plus 64, rounded up to one
    of four steps per power of two (:math:`2^a \cdot \{1, 1.25, 1.5,
    1.75\}`), so that a slowly moving density changes it (and a compiled
    graph's shapes) rarely. An overflow at 8 deviations has probability
    below :math:`10^{-15}` while the mean holds.

    Example:
        >>> round_capacity(1000.0), round_capacity(0.0)
        (1536, 64)
    """
    if not (isinstance(expected_draws, (int, float)) and expected_draws >= 0
            and math.isfinite(expected_draws)):
        raise ValueError(f"expected_draws must be a finite number >= 0, got "
                         f"{expected_draws!r}")
    need = expected_draws + deviations * math.sqrt(expected_draws) + 64
    base = 2 ** max(math.floor(math.log2(need)), 0)
    return int(next(base * q for q in (1, 1.25, 1.5, 1.75, 2) if base * q >= need))
