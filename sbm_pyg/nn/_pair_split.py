r"""The index work of a batch whose (sequence, head) pairs run on different
regimes (:func:`~sbm_pyg.nn.sbm_attention`): the dense pairs become
sequences of one head of their own, gathered from the heads-first rows, and
their edges are dropped from the sampler's graph of the rest."""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.sampling.graph import SampledGraph

__all__ = ["PairSplit", "SplitSizes", "split_sizes", "split_pairs",
           "split_included", "graph_keys", "merged_graph", "without_dense_pairs",
           "dense_keys"]


class PairSplit(NamedTuple):
    r"""The dense (sequence, head) pairs as a batch of one head: the
    heads-first rows :math:`h N_q + i` of their queries :obj:`rows_q` and
    keys :obj:`rows_k`, in (head, sequence) order, the pointers of that
    batch, and each pair's index in it :obj:`pair` :obj:`[G, H]` (-1 for sparse
    pairs)."""

    rows_q: Tensor
    rows_k: Tensor
    ptr_q: Tensor
    ptr_k: Tensor
    pair: Tensor


class SplitSizes(NamedTuple):
    r"""What a :class:`PairSplit` allocates, where the caller read it with
    its own sync: the dense pairs (empty sequences' too) and the rows of
    their queries and keys."""

    pairs: int
    rows_q: int
    rows_k: int


def split_sizes(ptr_q: Tensor, ptr_k: Tensor, dense: Tensor) -> List[Tensor]:
    r"""The :class:`SplitSizes` of :obj:`dense` :obj:`[G, H]` as 0-dim tensors
    on the device, to be read with a caller's sync."""
    d = dense.long()
    return [d.sum(), (d * ptr_q.diff()[:, None]).sum(),
            (d * ptr_k.diff()[:, None]).sum()]


def _rows(ptr: Tensor, num_rows: int, g: Tensor, h: Tensor,
          total: Optional[int]) -> Tuple[Tensor, Tensor]:
    # The heads-first rows of pairs (g, h), in order, and their pointer.
    sizes = ptr.diff()[g]
    new_ptr = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    total = int(new_ptr[-1]) if total is None else total
    start = h * num_rows + ptr[g] - new_ptr[:-1]
    rows = torch.repeat_interleave(start, sizes, output_size=total)
    return rows + torch.arange(total, device=ptr.device), new_ptr


def split_pairs(ptr_q: Tensor, ptr_k: Tensor, dense: Tensor, Nq: int,
                Nk: int, sizes: Optional[SplitSizes] = None) -> PairSplit:
    r"""The :class:`PairSplit` of the pairs where :obj:`dense` :obj:`[G, H]`
    is set; with their :obj:`sizes` (:func:`split_sizes`, read) it reads
    nothing, else three times."""
    if sizes is None:
        h, g = dense.t().nonzero(as_tuple=True)  # (head, sequence) order
    else:
        h, g = torch.nonzero_static(dense.t(), size=sizes.pairs).unbind(1)
    rows_q, new_ptr_q = _rows(ptr_q, Nq, g, h, None if sizes is None else sizes.rows_q)
    rows_k, new_ptr_k = _rows(ptr_k, Nk, g, h, None if sizes is None else sizes.rows_k)
    index = torch.full(dense.shape, -1, dtype=torch.long, device=dense.device)
    index[g, h] = torch.arange(g.numel(), device=dense.device)
    return PairSplit(rows_q, rows_k, new_ptr_q, new_ptr_k, index)


def split_included(split: PairSplit, ptr_q: Tensor, ptr_k: Tensor, i: Tensor,
                   j: Tensor) -> Tensor:
    r"""The included pairs (query :obj:`i`, key :obj:`j`) of the dense
    pairs' batch, as :obj:`[2, E']` (key, query) in its numbering."""
    g = torch.searchsorted(ptr_q, i, right=True) - 1
    pair = split.pair[g]  # [E, H]
    e, h = (pair >= 0).nonzero(as_tuple=True)
    p = pair[e, h]
    qi = split.ptr_q[p] + i[e] - ptr_q[g[e]]
    kj = split.ptr_k[p] + j[e] - ptr_k[g[e]]
    return torch.stack([kj, qi])


def graph_keys(graph: SampledGraph) -> Tensor:
    r"""The edge keys :math:`(h N_q + i) N_k + j` of :obj:`graph`."""
    row = graph.csr.row().long()
    Nk = graph.num_keys
    h = row // max(graph.num_queries, 1)
    return row * Nk + graph.csr.col.long() - h * Nk


def merged_graph(keys: List[Tensor], alphas: List[Optional[Tensor]],
                 H: int, Nq: int, Nk: int, ptr_q: Tensor, ptr_k: Tensor
                 ) -> Tuple[SampledGraph, Optional[Tensor]]:
    r"""One graph of the whole batch from its parts' keys, and the parts'
    weights in its edge order."""
    key, order = torch.sort(torch.cat(keys))
    graph = SampledGraph.from_keys(key, H, Nq, Nk, ptr_q=ptr_q, ptr_k=ptr_k)
    if any(a is None for a in alphas):
        return graph, None
    return graph, torch.cat(alphas)[order]  # type: ignore[arg-type]


def without_dense_pairs(graph: SampledGraph, dense: Tensor, seq: Tensor
                        ) -> SampledGraph:
    r"""The sampler's :obj:`graph` without the edges of the dense
    (sequence, head) pairs (:obj:`dense` :obj:`[G, H]`; :obj:`seq`
    :obj:`[N_q]`, each query's sequence): one read, the kept count
    (:meth:`~sbm_pyg.sampling.SampledGraph.edge_subgraph`)."""
    row = graph.csr.row().long()
    Nq = max(graph.num_queries, 1)
    return graph.edge_subgraph(~dense[seq[row % Nq], row // Nq])


def dense_keys(split: PairSplit, graph: SampledGraph, Nq: int, Nk: int) -> Tensor:
    r"""The keys of the dense pairs' :obj:`graph` (their batch of one head)
    as keys of the whole batch, :math:`(h N_q + i) N_k + j`."""
    keys = graph_keys(graph)
    r = split.rows_q[keys // max(graph.num_keys, 1)]
    c = split.rows_k[keys % max(graph.num_keys, 1)]
    return r * Nk + c - r // max(Nq, 1) * Nk
