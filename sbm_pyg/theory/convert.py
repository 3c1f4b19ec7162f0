r"""Attention patterns as masks, networkx graphs and sampled graphs."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from sbm_pyg.sampling import SampledGraph

Pattern = Union[Tensor, np.ndarray, nx.DiGraph]


# Conversions


def _sequence_rows(graph: SampledGraph, sequence: int) -> Tuple[int, int]:
    if not 0 <= sequence < graph.num_graphs:
        raise ValueError(f"sequence must be in [0, {graph.num_graphs}), got {sequence}")
    q0, q1 = graph.ptr_q[sequence:sequence + 2].tolist()
    k0, k1 = graph.ptr_k[sequence:sequence + 2].tolist()
    if q1 - q0 != k1 - k0:
        raise ValueError(f"sequence {sequence} has {q1 - q0} queries but "
                         f"{k1 - k0} keys: the conditions are about "
                         f"self-attention patterns")
    return q0, k0


def pattern_masks(graph: SampledGraph, sequence: int = 0) -> Tensor:
    r"""The attention patterns of one sequence, :obj:`[H, n, n]` bool with
    :obj:`A[h, i, j]` = query :math:`i` attends key :math:`j` in head
    :math:`h`."""
    q0, k0 = _sequence_rows(graph, sequence)
    n = int(graph.ptr_q[sequence + 1]) - q0
    j, i = graph.edge_index
    keep = (i >= q0) & (i < q0 + n)
    masks = torch.zeros(graph.num_heads, n, n, dtype=torch.bool)
    masks[graph.head[keep].cpu(), (i[keep] - q0).cpu(), (j[keep] - k0).cpu()] = True
    return masks


def to_networkx(graph: SampledGraph, head: int = 0, sequence: int = 0,
                weights: Optional[Tensor] = None) -> nx.DiGraph:
    r"""One head and sequence as a :class:`networkx.DiGraph` on nodes
    :math:`0..n-1` with an edge :math:`j \to i` when query :math:`i` attends
    key :math:`j`.

    Args:
        graph (SampledGraph): the batch's graph.
        head (int): the head.
        sequence (int): the sequence.
        weights (Tensor, optional): a value per edge of :obj:`graph`
            :obj:`[E]` (e.g. the attention weights a layer returns with
            :obj:`return_attention_weights=True`), set as each edge's
            :obj:`"weight"`.

    Example:
        >>> graph = from_networkx(nx.DiGraph([(0, 1), (1, 1)]))
        >>> G = to_networkx(graph, weights=torch.tensor([0.25, 0.75]))
        >>> sorted(G.edges(data="weight"))
        [(0, 1, 0.25), (1, 1, 0.75)]
    """
    if not 0 <= head < graph.num_heads:
        raise ValueError(f"head must be in [0, {graph.num_heads}), got {head}")
    G = as_digraph(pattern_masks(graph, sequence)[head])
    if weights is not None:
        if weights.shape != (graph.num_edges,):
            raise ValueError(f"weights must be [E] = [{graph.num_edges}], one "
                             f"per edge, got {tuple(weights.shape)}")
        q0, k0 = _sequence_rows(graph, sequence)
        edges = graph.sequence_edges(sequence)
        edges = edges[graph.head[edges] == head]
        j, i = graph.edge_index[:, edges].cpu()
        for key, query, w in zip((j - k0).tolist(), (i - q0).tolist(),
                                 weights[edges].detach().cpu().tolist()):
            G.edges[key, query]["weight"] = w
    return G


def from_networkx(G: nx.DiGraph) -> SampledGraph:
    r"""A :class:`networkx.DiGraph` on nodes :math:`0..n-1` as a one-head,
    one-sequence :class:`SampledGraph` (edge :math:`j \to i`: query :math:`i`
    attends key :math:`j`)."""
    n = G.number_of_nodes()
    if set(G.nodes) != set(range(n)):
        raise ValueError("G's nodes must be 0..n-1")
    edges = torch.tensor(list(G.edges), dtype=torch.long).view(-1, 2)
    key = torch.unique(edges[:, 1] * n + edges[:, 0])  # (query, key) order
    ptr = torch.tensor([0, n])
    return SampledGraph.from_keys(key, 1, n, n, ptr_q=ptr, ptr_k=ptr)


def as_mask(pattern: Pattern) -> np.ndarray:
    r"""A pattern (boolean tensor or array, or a :obj:`networkx.DiGraph`
    with an edge :math:`j \to i` when query :math:`i` attends key :math:`j`)
    as an :obj:`[n, n]` boolean numpy mask, :obj:`A[i, j]` = :math:`i`
    attends :math:`j`."""
    if isinstance(pattern, nx.DiGraph):
        n = pattern.number_of_nodes()
        if set(pattern.nodes) != set(range(n)):
            raise ValueError("graph nodes must be 0..n-1")
        A = np.zeros((n, n), dtype=bool)
        for j, i in pattern.edges:
            A[i, j] = True
        return A
    A = pattern.cpu().numpy() if isinstance(pattern, Tensor) else np.asarray(pattern)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"a pattern must be a square [n, n] mask, got shape {A.shape}")
    return A.astype(bool)


def as_digraph(pattern: Pattern) -> nx.DiGraph:
    r"""A pattern as the directed graph :math:`G` on nodes :obj:`0..n-1`
    with an edge :math:`j \to i` for each attended pair."""
    A = as_mask(pattern)
    G = nx.DiGraph()
    G.add_nodes_from(range(A.shape[0]))
    i, j = np.nonzero(A)
    G.add_edges_from(zip(j.tolist(), i.tolist()))
    return G
