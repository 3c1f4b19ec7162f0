"""Sampled graphs to networkx and back, and the graph recorder."""

import networkx as nx
import pytest
import torch

from sbm_pyg.sampling import SampledGraph
from sbm_pyg.theory import (
    GraphRecorder,
    from_networkx,
    to_networkx,
)
from tests.helpers import seeded


def test_networkx_roundtrip_and_recorder():
    G = nx.gnp_random_graph(7, 0.4, seed=3, directed=True)
    graph = from_networkx(G)
    assert set(to_networkx(graph).edges) == set(G.edges)
    # Weights follow their edges, per head and sequence of a batch graph.
    # keys (h N_q + i) N_k + j: head 0 (i 0, j 1), (i 2, j 3); head 1
    # (i 0, j 0), (i 3, j 2); sequences of 2 queries and 2 keys
    batch = SampledGraph.from_keys(torch.tensor([1, 11, 16, 30]), 2, 4, 4,
                                   ptr_q=torch.tensor([0, 2, 4]),
                                   ptr_k=torch.tensor([0, 2, 4]))
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    def weighted(head, sequence):
        return sorted(to_networkx(batch, head=head, sequence=sequence,
                                  weights=w).edges(data="weight"))
    assert weighted(0, 0) == [(1, 0, 0.1)] and weighted(0, 1) == [(1, 0, 0.2)]
    assert weighted(1, 0) == [(0, 0, 0.3)] and weighted(1, 1) == [(0, 1, 0.4)]
    with pytest.raises(ValueError, match="one per edge"):
        to_networkx(batch, weights=w[:3])
    from sbm_pyg.models import SBMTransformer
    torch.manual_seed(0)
    model = SBMTransformer(10, 12, channels=16, num_layers=2, heads=2, num_clusters=4,
                           self_loops=True)
    tokens = torch.randint(1, 10, (3, 12))
    with GraphRecorder(model) as rec:
        model(tokens)
    assert [layer for layer, _ in rec.graphs] == [0, 1]
    assert all(g.num_heads == 2 and g.num_graphs == 3 for _, g in rec.graphs)
    assert not model.blocks[0].attention.conv._graph_hooks  # removed on exit
    # With the weights: one [E] per graph, a softmax over each query's edges
    # (every query has its self-loop, so each sums to 1), the same weights
    # the layer returns when asked.
    model.eval()
    with GraphRecorder(model, weights=True) as rec:
        model(tokens, generator=seeded(4))
    assert [layer for layer, _ in rec.graphs] == [0, 1]
    for (_, graph), alpha in zip(rec.graphs, rec.weights):
        assert alpha.shape == (graph.num_edges,) and not alpha.requires_grad
        sums = alpha.new_zeros(graph.num_heads * graph.num_queries).index_add_(
            0, graph.csr.row().long(), alpha)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    conv = model.blocks[0].attention.conv
    assert not conv._weights_hooks
