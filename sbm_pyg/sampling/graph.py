r"""The sampled multi-head attention graph and its constructors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch_geometric.typing
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import SparseTensor

from sbm_pyg.ops.graph import CSRGraph
from sbm_pyg.sampling.checks import PtrLike, check_pointers, included_pairs
from sbm_pyg.sampling.edges import edge_pairs, edges_from_keys, sorted_unique
from sbm_pyg.validation import require_tensor, sync

__all__ = ["SampledGraph"]


@dataclass
class SampledGraph:
    r"""A sampled multi-head bipartite attention graph over a ragged batch.

    Edges run from keys (sources) to queries (targets), PyG's
    :obj:`source_to_target` flow, and are sorted by :obj:`(head, query, key)`
    with no duplicate triple: the attention mask is binary.

    The edges are stored once, as the int32 CSR of the block-diagonal
    :obj:`[H * N_q, H * N_k]` matrix (:attr:`csr`, 8 bytes per edge, the
    form every attention kernel takes); :obj:`edge_index` and :obj:`head`
    are derived from it on each access.

    Attributes:
        csr (CSRGraph): the edges as int32 CSR over :obj:`(head, query)`
            rows :math:`h N_q + i` and :obj:`(head, key)` columns
            :math:`h N_k + j`, both orders (:class:`~sbm_pyg.ops.graph.CSRGraph`).
        num_queries (int): :math:`N_q`.
        num_keys (int): :math:`N_k`.
        num_heads (int): :math:`H`.
        ptr_q (LongTensor): :obj:`[G + 1]`, query rows of each sequence.
        ptr_k (LongTensor): :obj:`[G + 1]`, key rows of each sequence.
        num_draws (int): multi-edges drawn by fastRG before merging (for
            :func:`bernoulli`, the edge count).
        expected_draws (float): the Poisson mean of :obj:`num_draws`.

    Per-edge values (attention weights :obj:`alpha [E]`) follow the edge
    order: :meth:`head_edges` and :meth:`sequence_edges` select one head's
    or one sequence's; :func:`sbm_pyg.theory.to_networkx` gives one head and
    sequence as a networkx graph, weights included.

    Example:
        >>> graph = SampledGraph.from_edge_index(
        ...     torch.tensor([[0, 1, 1], [1, 0, 1]]), num_queries=2, num_keys=2)
        >>> graph.num_edges, graph.rowptr.tolist()
        (3, [0, 1, 3])
        >>> graph.to_sparse_csr().to_dense()  # rows are queries
        tensor([[0., 1.],
                [1., 1.]])
    """

    csr: CSRGraph
    num_queries: int
    num_keys: int
    num_heads: int
    ptr_q: Tensor
    ptr_k: Tensor
    num_draws: int = 0
    expected_draws: float = 0.0

    @property
    def num_edges(self) -> int:
        """The number of distinct sampled edges :math:`E` (all heads)."""
        return self.csr.num_edges

    @property
    def num_graphs(self) -> int:
        """The number of sequences :math:`G`."""
        return self.ptr_q.numel() - 1

    @property
    def device(self) -> torch.device:
        """The device of the edge tensors."""
        return self.csr.col.device

    @property
    def rowptr(self) -> Tensor:
        r"""CSR pointer :obj:`[H * N_q + 1]` (int32) over :obj:`(head,
        query)` rows: the edges of query :obj:`i` in head :obj:`h` are
        :obj:`rowptr[h * N_q + i]:rowptr[h * N_q + i + 1]`."""
        return self.csr.rowptr

    @property
    def perm(self) -> Tensor:
        r"""The edges in :obj:`(head, key, query)` order, :obj:`[E]` int32."""
        return self.csr.perm

    @property
    def colptr(self) -> Tensor:
        r"""CSR pointer :obj:`[H * N_k + 1]` (int32) over :obj:`(head, key)`
        columns in :obj:`perm` order."""
        return self.csr.colptr

    @property
    def head(self) -> Tensor:
        r"""The head of each edge, :obj:`[E]` int64 (derived)."""
        return torch.div(self.csr.col, max(self.num_keys, 1),
                         rounding_mode="floor").long()

    @property
    def edge_index(self) -> Tensor:
        r""":obj:`[2, E]` int64 (derived): row 0 the key index in
        :obj:`[0, N_k)`, row 1 the query index in :obj:`[0, N_q)`; edges are
        sorted by :obj:`(head, query, key)`."""
        col, row = self.csr.col.long(), self.csr.row().long()
        return torch.stack([col % max(self.num_keys, 1),
                            row % max(self.num_queries, 1)])

    def edge_counts(self) -> Tensor:
        r"""Edges of each sequence and head, :obj:`[G, H]` (exact integers,
        read off :obj:`rowptr`)."""
        H, Nq = self.num_heads, self.num_queries
        offsets = torch.arange(H, device=self.device)[None, :] * Nq
        start = self.rowptr[self.ptr_q[:-1, None] + offsets]
        end = self.rowptr[self.ptr_q[1:, None] + offsets]
        return (end - start).long()

    def density(self) -> Tensor:
        r"""Sampled density :math:`|E_{g,h}| / (n_{q,g} n_{k,g})` of each
        sequence and head, :obj:`[G, H]`; 0 for an empty sequence."""
        pairs = (self.ptr_q.diff() * self.ptr_k.diff()).double()[:, None]
        counts = self.edge_counts().double()
        return torch.where(pairs > 0, counts / pairs.clamp(min=1), 0.0)

    def edge_subgraph(self, mask: Tensor) -> SampledGraph:
        r"""The graph of the edges where :obj:`mask` :obj:`[E]` (bool, in
        edge order) is set, its CSR filtered in both orders: :math:`O(E)`,
        no sort.

        Example:
            >>> g = SampledGraph.from_keys(torch.tensor([0, 3, 5]), 1, 2, 3)
            >>> g.edge_subgraph(torch.tensor([True, False, True])).edge_index
            tensor([[0, 2],
                    [0, 1]])
        """
        require_tensor("mask", mask, 1)
        if mask.dtype != torch.bool or mask.numel() != self.num_edges:
            raise ValueError(f"mask must be a bool tensor of the graph's "
                             f"{self.num_edges} edges, got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        csr, dtype = self.csr, self.csr.col.dtype
        mask = mask.to(self.device)

        def before(m: Tensor) -> Tensor:  # kept entries before each place
            return torch.cat([m.new_zeros(1, dtype=torch.long), m.cumsum(0)])

        kept, perm = before(mask), csr.perm.long()
        mask_t = mask[perm]
        # One read of the kept count sizes both orders (a boolean index
        # would read it twice on CUDA).
        count = int(sync([], kept[-1])[0])
        col = csr.col[torch.nonzero_static(mask, size=count).flatten()]
        at_t = torch.nonzero_static(mask_t, size=count).flatten()
        graph = CSRGraph(kept[csr.rowptr.long()].to(dtype), col,
                         before(mask_t)[csr.colptr.long()].to(dtype),
                         kept[perm][at_t].to(dtype))
        return SampledGraph(graph, self.num_queries, self.num_keys, self.num_heads,
                            self.ptr_q, self.ptr_k, col.numel(), float(col.numel()))

    def sequence(self, index: int) -> SampledGraph:
        r"""The graph of one sequence of the batch, all heads, with its own
        query and key indices :obj:`0..n_q-1` and :obj:`0..n_k-1`.

        Args:
            index (int): the sequence, in :obj:`[0, num_graphs)`.

        Example:
            >>> graph = SampledGraph.from_edge_index(
            ...     torch.tensor([[0, 1, 3], [1, 0, 2]]), 4, 4,
            ...     ptr_q=torch.tensor([0, 2, 4]), ptr_k=torch.tensor([0, 2, 4]))
            >>> graph.sequence(1).edge_index  # key 3 -> query 2, locally 1 -> 0
            tensor([[1],
                    [0]])
        """
        keep = self.sequence_edges(index)
        q0, q1 = (int(x) for x in self.ptr_q[index:index + 2].tolist())
        k0, k1 = (int(x) for x in self.ptr_k[index:index + 2].tolist())
        nq, nk = q1 - q0, k1 - k0
        j, i = self.edge_index[:, keep]
        # Edges are sorted by (head, query, key): the local keys stay sorted.
        key = (self.head[keep] * nq + i - q0) * nk + j - k0
        return SampledGraph.from_keys(key, self.num_heads, nq, nk)

    def sequence_edges(self, index: int) -> Tensor:
        r"""The positions :obj:`[E_g]` of sequence :obj:`index`'s edges
        among all edges, in the order of :meth:`sequence`'s edges: per-edge
        values (e.g. the attention weights :obj:`alpha [E]`) of that graph
        are :obj:`alpha[graph.sequence_edges(index)]`.

        Example:
            >>> graph = SampledGraph.from_edge_index(
            ...     torch.tensor([[0, 1, 3], [1, 0, 2]]), 4, 4,
            ...     ptr_q=torch.tensor([0, 2, 4]), ptr_k=torch.tensor([0, 2, 4]))
            >>> graph.sequence_edges(1)
            tensor([2])
        """
        if not isinstance(index, int) or not 0 <= index < self.num_graphs:
            raise ValueError(f"index must be an int in [0, {self.num_graphs}), "
                             f"got {index!r}")
        q0, q1 = (int(x) for x in self.ptr_q[index:index + 2].tolist())
        i = self.edge_index[1]
        return ((i >= q0) & (i < q1)).nonzero().flatten()

    def head_edges(self, head: int) -> slice:
        r"""The edges of one head, a slice of the :obj:`(head, query, key)`
        order: :obj:`edge_index[:, graph.head_edges(h)]` and
        :obj:`alpha[graph.head_edges(h)]` are head :obj:`h`'s."""
        if not isinstance(head, int) or not 0 <= head < self.num_heads:
            raise ValueError(f"head must be an int in [0, {self.num_heads}), "
                             f"got {head!r}")
        Nq = self.num_queries
        start, end = (int(x) for x in self.rowptr[[head * Nq, (head + 1) * Nq]].tolist())
        return slice(start, end)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_edges={self.num_edges}, "
                f"num_heads={self.num_heads}, num_queries={self.num_queries}, "
                f"num_keys={self.num_keys}, num_graphs={self.num_graphs}, "
                f"device={self.device})")

    def _pattern(self, head: Optional[int]) -> Tuple[Tensor, Tensor, int, int]:
        # CSR (indptr over queries, keys, rows, columns) of one head, or of
        # the block-diagonal matrix of all heads.
        if head is None:
            return (self.csr.rowptr, self.csr.col,
                    self.num_heads * self.num_queries,
                    self.num_heads * self.num_keys)
        if not isinstance(head, int) or not 0 <= head < self.num_heads:
            raise ValueError(f"head must be an int in [0, {self.num_heads}) "
                             f"or None, got {head!r}")
        Nq = self.num_queries
        rowptr = self.rowptr[head * Nq:(head + 1) * Nq + 1]
        start, end = (int(x) for x in rowptr[[0, -1]].tolist())  # one sync
        return (rowptr - start, self.csr.col[start:end] - head * self.num_keys,
                Nq, self.num_keys)

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
        indptr, index = indptr.long(), index.long()  # PyG's index dtype
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
        return SparseTensor(rowptr=indptr.long(), col=index.long(), sparse_sizes=(rows, cols),
                            is_sorted=True, trust_data=True)

    @classmethod
    def from_edge_index(cls, edge_index: Union[Tensor, SparseTensor],
                        num_queries: int, num_keys: int, *,
                        ptr_q: PtrLike = None, ptr_k: PtrLike = None
                        ) -> SampledGraph:
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
        ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, num_queries,
                                              num_keys, pairs.device)
        i, j, check = included_pairs(pairs, ptr_q, ptr_k, num_queries,
                                     num_keys, "edge_index")
        sync(checks + [check])
        key = sorted_unique(i * num_keys + j)
        return cls(edges_from_keys(key, 1, num_queries, num_keys, 0, 0.0).csr,
                   num_queries, num_keys, 1, ptr_q, ptr_k, key.numel(),
                   float(key.numel()))

    @classmethod
    def from_keys(cls, key: Tensor, num_heads: int, num_queries: int,
                  num_keys: int, *, ptr_q: PtrLike = None,
                  ptr_k: PtrLike = None) -> SampledGraph:
        r"""A graph from its edges' keys :math:`(h N_q + i) N_k + j`
        (head :math:`h`, query :math:`i`, key :math:`j`), the compact form
        the samplers produce.

        Args:
            key (LongTensor): :obj:`[E]`, strictly increasing (sorted by
                head, query, key; no duplicates).
            num_heads (int): :math:`H`.
            num_queries (int): :math:`N_q`.
            num_keys (int): :math:`N_k`.
            ptr_q, ptr_k (LongTensor, optional): the sequences; an edge
                across them raises.

        Example:
            >>> g = SampledGraph.from_keys(torch.tensor([0, 3, 5]), 1, 2, 3)
            >>> g.edge_index  # (key, query) pairs
            tensor([[0, 0, 2],
                    [0, 1, 1]])
        """
        require_tensor("key", key, 1)
        if key.dtype != torch.long:
            raise TypeError(f"key must be a LongTensor, got {key.dtype}")
        for name, n in (("num_heads", num_heads), ("num_queries", num_queries),
                        ("num_keys", num_keys)):
            if not isinstance(n, int) or n < (1 if name == "num_heads" else 0):
                raise ValueError(f"{name} must be an int >= "
                                 f"{1 if name == 'num_heads' else 0}, got {n!r}")
        H, Nq, Nk = num_heads, num_queries, num_keys
        ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk, key.device)
        unsorted = (key[1:] <= key[:-1]).any()
        out = ((key < 0) | (key >= H * Nq * Nk)).any()
        checks += [(unsorted, "key must be strictly increasing (sorted, no "
                              "duplicates)"),
                   (out, f"key must lie in [0, H * N_q * N_k = {H * Nq * Nk})")]
        row = key.clamp(0, max(H * Nq * Nk - 1, 0)) // max(Nk, 1)
        pairs = torch.stack([key.clamp(min=0) - row * Nk, row % max(Nq, 1)])
        checks.append(included_pairs(pairs, ptr_q, ptr_k, Nq, Nk, "key")[2])
        sync(checks)
        return cls(edges_from_keys(key, H, Nq, Nk, 0, 0.0).csr, Nq, Nk, H,
                   ptr_q, ptr_k, key.numel(), float(key.numel()))

    def to(self, device: Union[str, torch.device]) -> SampledGraph:
        """A copy with every tensor on :obj:`device`."""
        return SampledGraph(self.csr.to(device), self.num_queries,
                            self.num_keys, self.num_heads,
                            self.ptr_q.to(device), self.ptr_k.to(device),
                            self.num_draws, self.expected_draws)
