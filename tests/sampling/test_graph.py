"""SampledGraph: its conversions to PyG and torch.sparse types and its
constructors."""

import pytest
import torch

from sbm_pyg import sampling
from sbm_pyg.sampling import SampledGraph
from tests.helpers import seeded
from tests.sampling.cases import (
    NK,
    NQ,
    H,
    small_sbm,
)


def conversion_graph():
    q, b, k = small_sbm(scale=2.0)
    ptr_q, ptr_k = [0, 2, 6], [0, 3, 5]
    graph = sampling.fastrg(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, generator=seeded(0))
    masks = torch.zeros(H, NQ, NK, dtype=torch.bool)
    masks[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    assert masks.any(-1).any(-1).all() and (~masks[:, 2:, :3]).all()
    return graph, masks


@pytest.mark.parametrize("head", [0, 1, None])
def test_to_sparse_csr_and_edge_index(head):
    graph, masks = conversion_graph()
    expected = masks[head] if head is not None else torch.block_diag(
        *masks.int()).bool()  # [H N_q, H N_k]
    csr = graph.to_sparse_csr(head)
    assert csr.layout == torch.sparse_csr
    assert torch.equal(csr.to_dense().bool(), expected)
    ei = graph.to_edge_index(head)
    assert ei.sparse_size() == expected.t().shape
    assert ei.is_sorted_by_col and ei._indptr is not None
    assert torch.equal(ei.get_csc()[0][0], csr.crow_indices())
    assert torch.equal(ei.to_dense().bool(), expected.t())  # key -> query
    back = SampledGraph.from_edge_index(ei, *expected.shape)
    assert torch.equal(back.to_sparse_csr().to_dense().bool(), expected)
    back = SampledGraph.from_edge_index(csr, *expected.shape)
    assert torch.equal(back.to_sparse_csr().to_dense().bool(), expected)


def test_to_sparse_tensor():
    pytest.importorskip("torch_sparse", reason="torch_sparse not installed")
    graph, masks = conversion_graph()
    adj_t = graph.to_sparse_tensor(1)
    assert torch.equal(adj_t.to_dense().bool(), masks[1])
    assert torch.equal(graph.to_sparse_tensor().to_dense().bool(),
                       torch.block_diag(*masks.int()).bool())
    back = SampledGraph.from_edge_index(adj_t, NQ, NK)
    assert torch.equal(back.edge_index, graph.to_edge_index(1).as_tensor())


def test_from_edge_index_merges_and_checks():
    pairs = torch.tensor([[0, 2, 2, 1], [1, 0, 0, 1]])  # (key, query)
    graph = SampledGraph.from_edge_index(pairs, 2, 3)
    assert graph.num_edges == 3 and graph.num_heads == 1
    assert graph.edge_index.tolist() == [[2, 0, 1], [0, 1, 1]]
    assert torch.equal(graph.rowptr, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="edge_index must hold pairs"):
        SampledGraph.from_edge_index(pairs, 2, 2)
    with pytest.raises(ValueError, match="edge_index must hold.*sequence"):
        SampledGraph.from_edge_index(pairs, 2, 3, ptr_q=[0, 1, 2],
                                     ptr_k=[0, 1, 3])
    with pytest.raises(ValueError, match="head must be an int"):
        graph.to_sparse_csr(head=1)
    with pytest.raises(ValueError, match="num_keys"):
        SampledGraph.from_edge_index(pairs, 2, -1)


def test_from_keys_builds_the_graph_and_rejects_bad_keys():
    # Keys (h N_q + i) N_k + j with H=2, N_q=2, N_k=3.
    key = torch.tensor([0, 3, 5, 6, 11])
    g = SampledGraph.from_keys(key, 2, 2, 3)
    assert g.edge_index.tolist() == [[0, 0, 2, 0, 2], [0, 1, 1, 0, 1]]
    assert g.head.tolist() == [0, 0, 0, 1, 1]
    assert g.rowptr.tolist() == [0, 1, 3, 4, 5]
    assert g.num_edges == g.num_draws == 5
    # The key order: the transposed CSR visits (head, key, query).
    colptr, row_t = g.colptr, g.csr.row_t()
    assert colptr.tolist() == [0, 2, 2, 3, 4, 4, 5]
    assert row_t.tolist() == [0, 1, 1, 2, 3]
    for bad, match in [(torch.tensor([3, 0]), "strictly increasing"),
                       (torch.tensor([0, 0]), "strictly increasing"),
                       (torch.tensor([12]), r"\[0, H \* N_q \* N_k"),
                       (torch.tensor([-1]), r"\[0, H \* N_q \* N_k"),
                       (torch.tensor([0.0]), "key")]:
        with pytest.raises((ValueError, TypeError), match=match):
            SampledGraph.from_keys(bad, 2, 2, 3)
    # An edge across two sequences of one query and one key each.
    with pytest.raises(ValueError, match="within one sequence"):
        SampledGraph.from_keys(torch.tensor([1]), 1, 2, 2, ptr_q=[0, 1, 2],
                               ptr_k=[0, 1, 2])
    with pytest.raises(ValueError, match="num_heads"):
        SampledGraph.from_keys(key, 0, 2, 3)


def test_sequence_is_the_batch_restricted_to_one_input():
    g = seeded(0)
    ptr_q, ptr_k = [0, 4, 4, 11], [0, 3, 5, 12]
    q_memb = torch.rand(11, 2, 3, generator=g)
    k_memb = torch.rand(12, 2, 3, generator=g)
    block = torch.full((2, 3, 3), 0.3)
    graph = sampling.fastrg(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k,
                            generator=g)
    dense = torch.zeros(2, 11, 12, dtype=torch.bool)
    dense[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    for s in range(3):
        part = graph.sequence(s)
        nq, nk = ptr_q[s + 1] - ptr_q[s], ptr_k[s + 1] - ptr_k[s]
        assert (part.num_queries, part.num_keys, part.num_heads) == (nq, nk, 2)
        local = torch.zeros(2, nq, nk, dtype=torch.bool)
        local[part.head, part.edge_index[1], part.edge_index[0]] = True
        assert torch.equal(local, dense[:, ptr_q[s]:ptr_q[s + 1],
                                        ptr_k[s]:ptr_k[s + 1]])
        assert torch.allclose(part.density()[0], graph.density()[s])
    with pytest.raises(ValueError, match="index must be an int in"):
        graph.sequence(3)
    # Per-edge values follow: a value that encodes each edge's global
    # (head, query, key) reads back as the local edges' own.
    values = (graph.head * 11 + graph.edge_index[1]) * 12 + graph.edge_index[0]
    for s in range(3):
        part, picked = graph.sequence(s), values[graph.sequence_edges(s)]
        h, (j, i) = part.head, part.edge_index
        assert torch.equal(picked, (h * 11 + i + ptr_q[s]) * 12 + j + ptr_k[s])
    # and per head: the edges of head h are a slice
    for h in range(2):
        assert torch.equal(graph.head[graph.head_edges(h)],
                           torch.full((int((graph.head == h).sum()),), h))
    with pytest.raises(ValueError, match="head must be an int"):
        graph.head_edges(2)
    assert repr(graph) == (f"SampledGraph(num_edges={graph.num_edges}, num_heads=2, "
                           f"num_queries=11, num_keys=12, num_graphs=3, "
                           f"device={graph.device})")


def test_edge_subgraph_filters_both_orders():
    # Every other edge and a hand-picked pattern: the CSR in both orders
    # that from_keys builds from the kept edges' keys.
    graph, _ = conversion_graph()
    key, query = graph.edge_index
    keys = (graph.head * NQ + query) * NK + key
    E = graph.num_edges
    for mask in (torch.arange(E) % 2 == 0, torch.zeros(E, dtype=torch.bool),
                 torch.ones(E, dtype=torch.bool), keys % 3 == 1):
        mask = mask.to(keys.device)
        sub = graph.edge_subgraph(mask)
        want = SampledGraph.from_keys(keys[mask], H, NQ, NK, ptr_q=graph.ptr_q,
                                      ptr_k=graph.ptr_k)
        for name in ("rowptr", "col", "colptr", "perm"):
            assert torch.equal(getattr(sub.csr, name), getattr(want.csr, name)), name
        assert sub.num_edges == int(mask.sum()) and sub.num_draws == sub.num_edges
        assert torch.equal(sub.ptr_q, graph.ptr_q)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        graph.edge_subgraph(torch.ones(E + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        graph.edge_subgraph(torch.ones(E))
