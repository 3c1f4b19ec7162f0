r"""Sampling bipartite query→key graphs from mixed-membership SBMs.

Each head :math:`h` of each sequence :math:`g` is an SBM with query
memberships :math:`\mathbf{Y} \in \mathbb{R}_+^{n_q \times k}`, block matrix
:math:`\mathbf{B} \in \mathbb{R}_+^{k \times k}` and key memberships
:math:`\mathbf{Z} \in \mathbb{R}_+^{n_k \times k}`, with edge rate

.. math::
    p_{ij} = \mathbf{Y}_i \mathbf{B} \mathbf{Z}_j^{\top}.

:func:`fastrg` samples all sequences and heads of a ragged batch at once, in
time and memory linear in the number of edges; :func:`bernoulli` and
:func:`expected_adjacency` are dense :math:`O(N_q N_k)` references for tests
and small inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch_geometric.typing
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import SparseTensor

from sbm_pyg._validation import (
    Check,
    as_ptr,
    check_draws,
    check_generator,
    check_memory,
    invalid_values,
    nonnegative_finite,
    require_tensor,
    sync,
)
from sbm_pyg import _fastrg_compiled as _compiled
from sbm_pyg.sparse import full_precision, row_index, sddmm

__all__ = ["SampledGraph", "fastrg", "bernoulli", "expected_adjacency"]

PtrLike = Union[None, Tensor, Sequence[int]]

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


@dataclass
class SampledGraph:
    r"""A sampled multi-head bipartite attention graph over a ragged batch.

    Edges run from keys (sources) to queries (targets), PyG's
    :obj:`source_to_target` flow, and are sorted by :obj:`(head, query, key)`
    with no duplicate triple: the attention mask is binary.

    Attributes:
        edge_index (LongTensor): :obj:`[2, E]`, row 0 the key index in
            :obj:`[0, num_keys)`, row 1 the query index in
            :obj:`[0, num_queries)`.
        head (LongTensor): :obj:`[E]`, the head of each edge.
        num_queries (int): :math:`N_q`.
        num_keys (int): :math:`N_k`.
        num_heads (int): :math:`H`.
        ptr_q (LongTensor): :obj:`[G + 1]`, query rows of each sequence.
        ptr_k (LongTensor): :obj:`[G + 1]`, key rows of each sequence.
        rowptr (LongTensor): :obj:`[H * N_q + 1]`, CSR pointer over
            :obj:`(head, query)` rows: the edges of query :obj:`i` in head
            :obj:`h` are :obj:`rowptr[h * N_q + i]:rowptr[h * N_q + i + 1]`.
        perm (LongTensor): :obj:`[E]`, permutation to :obj:`(head, key,
            query)` order, used by backward passes.
        colptr (LongTensor): :obj:`[H * N_k + 1]`, CSR pointer over
            :obj:`(head, key)` in :obj:`perm` order.
        num_draws (int): multi-edges drawn by fastRG before merging (for
            :func:`bernoulli`, the edge count).
        expected_draws (float): the Poisson mean of :obj:`num_draws`.
    """

    edge_index: Tensor
    head: Tensor
    num_queries: int
    num_keys: int
    num_heads: int
    ptr_q: Tensor
    ptr_k: Tensor
    rowptr: Tensor
    perm: Tensor
    colptr: Tensor
    num_draws: int = 0
    expected_draws: float = 0.0
    _cache: Dict[str, Tensor] = field(default_factory=dict, repr=False,
                                      compare=False)

    @property
    def num_edges(self) -> int:
        """The number of distinct sampled edges :math:`E` (all heads)."""
        return self.edge_index.size(1)

    @property
    def num_graphs(self) -> int:
        """The number of sequences :math:`G`."""
        return self.ptr_q.numel() - 1

    @property
    def device(self) -> torch.device:
        """The device of the edge tensors."""
        return self.edge_index.device

    def csr(self) -> Tuple[Tensor, Tensor]:
        r"""CSR :obj:`(rowptr, col)` of the block-diagonal
        :obj:`[H * N_q, H * N_k]` matrix, :obj:`col = head * N_k + key`."""
        if "col" not in self._cache:
            self._cache["col"] = self.head * self.num_keys + self.edge_index[0]
        return self.rowptr, self._cache["col"]

    def csr_t(self) -> Tuple[Tensor, Tensor]:
        r"""CSR :obj:`(colptr, row)` of the transposed
        :obj:`[H * N_k, H * N_q]` matrix, :obj:`row = head * N_q + query`
        in :obj:`perm` order. Values in edge order are transposed with
        :obj:`values[perm]`."""
        if "row_t" not in self._cache:
            row = self.head * self.num_queries + self.edge_index[1]
            self._cache["row_t"] = row[self.perm]
        return self.colptr, self._cache["row_t"]

    def row(self) -> Tensor:
        r"""The CSR row :obj:`head * N_q + query` of each edge, :obj:`[E]`
        int32 (cached: every layer attending over this graph shares it)."""
        if "row" not in self._cache:
            self._cache["row"] = row_index(self.rowptr, self.num_edges)
        return self._cache["row"]

    def edge_counts(self) -> Tensor:
        r"""Edges of each sequence and head, :obj:`[G, H]` (exact integers,
        read off :obj:`rowptr`)."""
        H, Nq = self.num_heads, self.num_queries
        offsets = torch.arange(H, device=self.device)[None, :] * Nq
        start = self.rowptr[self.ptr_q[:-1, None] + offsets]
        end = self.rowptr[self.ptr_q[1:, None] + offsets]
        return end - start

    def density(self) -> Tensor:
        r"""Sampled density :math:`|E_{g,h}| / (n_{q,g} n_{k,g})` of each
        sequence and head, :obj:`[G, H]`; 0 for an empty sequence."""
        pairs = (self.ptr_q.diff() * self.ptr_k.diff()).double()[:, None]
        counts = self.edge_counts().double()
        return torch.where(pairs > 0, counts / pairs.clamp(min=1), 0.0)

    def _pattern(self, head: Optional[int]) -> Tuple[Tensor, Tensor, int, int]:
        # CSR (indptr over queries, keys, rows, columns) of one head, or of
        # the block-diagonal matrix of all heads.
        if head is None:
            rowptr, col = self.csr()
            return (rowptr, col, self.num_heads * self.num_queries,
                    self.num_heads * self.num_keys)
        if not isinstance(head, int) or not 0 <= head < self.num_heads:
            raise ValueError(f"head must be an int in [0, {self.num_heads}) "
                             f"or None, got {head!r}")
        Nq = self.num_queries
        rowptr = self.rowptr[head * Nq:(head + 1) * Nq + 1]
        start, end = (int(x) for x in rowptr[[0, -1]].tolist())  # one sync
        return (rowptr - start, self.edge_index[0, start:end], Nq,
                self.num_keys)

    def to_sparse_csr(self, head: Optional[int] = None) -> Tensor:
        r"""The attention pattern as a :obj:`torch.sparse_csr` tensor with
        ones for values: :obj:`[N_q, N_k]` for one :obj:`head`, else the
        block-diagonal :obj:`[H N_q, H N_k]` of all heads. Rows are queries
        (PyG's :obj:`adj_t`); the CSR arrays are the graph's own."""
        indptr, index, rows, cols = self._pattern(head)
        ones = torch.ones(index.numel(), device=index.device)
        return torch.sparse_csr_tensor(indptr, index, ones, (rows, cols),
                                       device=index.device,
                                       check_invariants=False)

    def to_edge_index(self, head: Optional[int] = None) -> EdgeIndex:
        r"""The graph as PyG's :class:`~torch_geometric.EdgeIndex` (key →
        query, :obj:`sparse_size = (N_k, N_q)` for one :obj:`head`, else
        the block-diagonal graph of all heads over :obj:`H N_k` keys and
        :obj:`H N_q` queries), sorted by query with its CSC pointer set, so
        that PyG's sparse aggregations reuse it without sorting."""
        indptr, index, rows, cols = self._pattern(head)
        csc = torch.sparse_csc_tensor(
            indptr, index, torch.ones(index.numel(), device=index.device),
            (cols, rows), device=index.device, check_invariants=False)
        return EdgeIndex(csc)

    def to_sparse_tensor(self, head: Optional[int] = None) -> SparseTensor:
        r"""The attention pattern as :class:`torch_sparse.SparseTensor`
        :obj:`adj_t` (rows are queries), shaped as in :meth:`to_sparse_csr`;
        needs torch-sparse."""
        if not torch_geometric.typing.WITH_TORCH_SPARSE:
            raise ImportError("to_sparse_tensor needs torch-sparse "
                              "(pip install .[ext])")
        indptr, index, rows, cols = self._pattern(head)
        return SparseTensor(rowptr=indptr, col=index, sparse_sizes=(rows, cols),
                            is_sorted=True, trust_data=True)

    @classmethod
    def from_edge_index(cls, edge_index: Union[Tensor, SparseTensor],
                        num_queries: int, num_keys: int, *,
                        ptr_q: PtrLike = None, ptr_k: PtrLike = None
                        ) -> "SampledGraph":
        r"""A one-head graph from given edges, e.g. a fixed attention
        pattern for :func:`~sbm_pyg.nn.functional.sparse_attention`.

        Args:
            edge_index (LongTensor, EdgeIndex, SparseTensor or torch.sparse
                tensor): :obj:`[2, E]` (key, query) pairs, or an
                :obj:`adj_t` of shape :obj:`[N_q, N_k]`; duplicates merge.
            num_queries (int): :math:`N_q`.
            num_keys (int): :math:`N_k`.
            ptr_q, ptr_k (LongTensor, optional): the sequences; an edge
                across them raises.
        """
        for name, n in (("num_queries", num_queries), ("num_keys", num_keys)):
            if not isinstance(n, int) or n < 0:
                raise ValueError(f"{name} must be an int >= 0, got {n!r}")
        pairs = edge_pairs("edge_index", edge_index)
        ptr_q, ptr_k, checks = _pointers(ptr_q, ptr_k, num_queries, num_keys,
                                         pairs.device)
        i, j, check = _included_pairs(pairs, ptr_q, ptr_k, num_queries,
                                      num_keys, "edge_index")
        sync(checks + [check])
        key = _sorted_unique(i * num_keys + j)
        return _from_keys(key, 1, num_queries, num_keys, ptr_q, ptr_k,
                          key.numel(), float(key.numel()))

    def to(self, device: Union[str, torch.device]) -> "SampledGraph":
        """A copy with every tensor on :obj:`device`."""
        moved = {name: getattr(self, name).to(device) for name in
                 ("edge_index", "head", "ptr_q", "ptr_k", "rowptr", "perm",
                  "colptr")}
        return SampledGraph(num_queries=self.num_queries,
                            num_keys=self.num_keys, num_heads=self.num_heads,
                            num_draws=self.num_draws,
                            expected_draws=self.expected_draws, **moved)


def _pointers(ptr_q: PtrLike, ptr_k: PtrLike, Nq: int, Nk: int,
              device: torch.device) -> Tuple[Tensor, Tensor, List[Check]]:
    # Query and key pointers of the same sequences, and their checks.
    ptr_q, check_q = as_ptr("ptr_q", ptr_q, Nq, device)
    ptr_k, check_k = as_ptr("ptr_k", ptr_k, Nk, device)
    if ptr_q.numel() != ptr_k.numel():
        raise ValueError(f"ptr_q and ptr_k must describe the same number of "
                         f"sequences, got {ptr_q.numel() - 1} and "
                         f"{ptr_k.numel() - 1}")
    return ptr_q, ptr_k, [check_q, check_k]


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


def _keys_to_csr(key: Tensor, H: int, Nq: int, Nk: int):
    row = key // Nk  # h * N_q + i, sorted
    key_idx = key - row * Nk
    head = row // Nq
    rowptr = torch.searchsorted(row, torch.arange(H * Nq + 1,
                                                  device=key.device))
    return row, key_idx, head, rowptr


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


def _from_keys(key: Tensor, H: int, Nq: int, Nk: int, ptr_q: Tensor,
               ptr_k: Tensor, num_draws: int,
               expected_draws: float) -> SampledGraph:
    r"""Builds a graph from sorted unique keys :math:`(h N_q + i) N_k + j`."""
    row, j, head, rowptr = _keys_to_csr(key, H, Nq, Nk)
    i = row - head * Nq
    col = head * Nk + j
    perm = torch.argsort(col * max(Nq, 1) + i)
    colptr = torch.searchsorted(col[perm],
                                torch.arange(H * Nk + 1, device=key.device))
    graph = SampledGraph(edge_index=torch.stack([j, i]), head=head,
                         num_queries=Nq, num_keys=Nk, num_heads=H, ptr_q=ptr_q,
                         ptr_k=ptr_k, rowptr=rowptr, perm=perm, colptr=colptr,
                         num_draws=num_draws, expected_draws=expected_draws)
    graph._cache.update(col=col, row_t=row[perm])
    return graph


def _sorted_unique(key: Tensor) -> Tensor:
    # Measured on CPU (2 threads): sort + adjacent difference took 26 ms vs
    # 58 ms for torch.unique at 1.7M keys, but 240 vs 207 ms at 5.4M.
    if key.numel() > 2**22:
        return torch.unique(key)
    key = torch.sort(key).values
    first = torch.ones_like(key, dtype=torch.bool)
    first[1:] = key[1:] != key[:-1]
    return key[first]


def _self_loop_keys(H: int, N: int, device: torch.device) -> Tensor:
    i = torch.arange(N, device=device)
    h = torch.arange(H, device=device)[:, None]
    return ((h * N + i) * N + i).reshape(-1)


def edge_pairs(name: str, edges: object) -> Tensor:
    r"""The (key, query) pairs :obj:`[2, E]` of a structure input given as
    PyG layers take it: an :obj:`edge_index` LongTensor or
    :class:`~torch_geometric.EdgeIndex` (row 0 the source/key), or an
    :obj:`adj_t` (:class:`torch_sparse.SparseTensor` or a :obj:`torch.sparse`
    tensor, rows are the targets/queries)."""
    if isinstance(edges, SparseTensor) and not isinstance(edges, Tensor):
        row, col, _ = edges.coo()
        return torch.stack([col, row])
    if isinstance(edges, Tensor) and edges.layout != torch.strided:
        coo = edges.to_sparse_coo().coalesce()
        return coo.indices().flip(0)
    require_tensor(name, edges, 2)
    if edges.dtype != torch.long or edges.size(0) != 2:
        raise TypeError(f"{name} must be a LongTensor of shape [2, E], an "
                        f"EdgeIndex, a SparseTensor or a torch.sparse adj_t, "
                        f"got {edges.dtype} {tuple(edges.shape)}")
    # An EdgeIndex's metadata does not apply to the pairs taken apart; rows
    # of a transposed [E, 2] tensor would be strided (slow searchsorted).
    edges = edges.as_tensor() if isinstance(edges, EdgeIndex) else edges
    return edges.contiguous()


def _included_pairs(edges, ptr_q: Tensor, ptr_k: Tensor, Nq: int, Nk: int,
                    name: str = "include_edges"
                    ) -> Tuple[Tensor, Tensor, Check]:
    r"""Queries :math:`i` and keys :math:`j` of :obj:`include_edges` (key
    :math:`j` → query :math:`i`), and the deferred check that they are in
    range and stay within their sequence."""
    edges = edge_pairs(name, edges)
    if edges.device != ptr_q.device:
        raise ValueError(f"{name} is on {edges.device}, the sequence "
                         f"pointers on {ptr_q.device}")
    j, i = edges
    in_range = (j >= 0) & (j < Nk) & (i >= 0) & (i < Nq)
    same = (torch.searchsorted(ptr_k, j, right=True)
            == torch.searchsorted(ptr_q, i, right=True))
    bad = ~(in_range & same).all()
    # Until the check raises (at fastrg's one sync), out-of-range pairs are
    # clamped so that nothing indexes out of bounds; a mask would sync.
    i, j = i.clamp(0, max(Nq - 1, 0)), j.clamp(0, max(Nk - 1, 0))
    return i, j, (bad, f"{name} must hold pairs (key j, query i) with "
                       f"0 <= j < N_k={Nk}, 0 <= i < N_q={Nq}, within one "
                       f"sequence")


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
    return _from_keys(key, H, Nq, Nk, ptr_q, ptr_k, num_draws, expected)


def _batch(ptr: Tensor, num_rows: int) -> Tensor:
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1,
                                                device=ptr.device),
                                   ptr.diff(), output_size=num_rows)


def expected_adjacency(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
) -> Tensor:
    r"""The dense expected mask :math:`\mathbb{E}[\mathbf{M}]` of
    :func:`fastrg` with the same arguments (reference path,
    :math:`O(H N_q N_k)`).

    .. math::
        \mathbb{E}[M_{hij}] = \begin{cases}
        1 - e^{-(p_{hij} + \delta)} & \text{poisson} \\
        \min(p_{hij} + \delta, 1) & \text{exact}
        \end{cases}

    for :math:`i, j` in the same sequence, 0 across sequences, and 1 on the
    diagonal with :obj:`self_loops`.

    Returns:
        Tensor :obj:`[H, N_q, N_k]` in the dtype of :obj:`q_memb`.
    """
    ptr_q, ptr_k, checks = _check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                      mode, exploration, self_loops)
    sync(checks)
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    check_memory(3 * H * Nq * Nk * q_memb.element_size(), q_memb.device,
                 f"a dense [{H}, {Nq}, {Nk}] expected adjacency")
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb) + exploration
    same = _batch(ptr_q, Nq)[:, None] == _batch(ptr_k, Nk)[None, :]
    p = p * same
    P = -torch.expm1(-p) if mode == "poisson" else p.clamp(max=1.0)
    if self_loops:
        P.diagonal(dim1=1, dim2=2).fill_(1.0)
    return P


def bernoulli(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
    generator: Optional[torch.Generator] = None,
) -> SampledGraph:
    r"""Dense reference sampler: one independent Bernoulli per pair with the
    probabilities of :func:`expected_adjacency`, :math:`O(H N_q N_k)`.

    It has the same distribution as :func:`fastrg` with the same arguments
    and is meant for tests and small inputs.
    """
    P = expected_adjacency(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k,
                           mode=mode, exploration=exploration,
                           self_loops=self_loops)
    check_generator(generator, P.device)
    H, Nq, Nk = P.shape
    mask = torch.bernoulli(P.double(), generator=generator).bool()
    key = mask.reshape(-1).nonzero().view(-1)  # (h * N_q + i) * N_k + j
    ptr_q, _ = as_ptr("ptr_q", ptr_q, Nq, P.device)
    ptr_k, _ = as_ptr("ptr_k", ptr_k, Nk, P.device)
    return _from_keys(key, H, Nq, Nk, ptr_q, ptr_k, key.numel(),
                      float(P.sum()))
