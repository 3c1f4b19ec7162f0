import math

import pytest
import torch
from torch_geometric.utils import is_undirected, to_dense_adj

from sbm_pyg.datasets import RECIPES, SBMBenchmarkDataset, generate_sbm_graphs

# PyG's documented statistics of the published files (GNNBenchmarkDataset).
PYG_STATS = {"PATTERN": (118.9, 6098.9), "CLUSTER": (117.2, 4303.9)}


def _uniform_moments(low, high):
    # Mean and variance of randint(low, high) (high exclusive).
    n = high - low
    return (low + high - 1) / 2, (n * n - 1) / 12


def _expected_base(recipe):
    # Expected nodes and (within, all) unordered pairs of the base SBM.
    m, v = _uniform_moments(*recipe["size"])
    k = recipe["communities"]
    within = k * (v + m * m - m) / 2
    nodes = k * m
    pairs = (k * v + nodes * nodes - nodes) / 2
    return nodes, within, pairs


def _check_simple_undirected(graph):
    ei = graph.edge_index
    assert is_undirected(ei, num_nodes=graph.num_nodes)
    assert bool((ei[0] != ei[1]).all())
    key = ei[0] * graph.num_nodes + ei[1]
    assert bool((key[1:] > key[:-1]).all())  # sorted, no duplicates


def test_cluster_recipe_invariants():
    graphs = generate_sbm_graphs("CLUSTER", "val")
    assert len(graphs) == 1000
    for g in graphs[:200]:
        _check_simple_undirected(g)
        feat = g.x.argmax(1)
        assert g.x.shape[1] == 7 and bool((g.x.sum(1) == 1).all())
        # Exactly one seeded node per community r, with feature r + 1.
        for r in range(6):
            members = g.y == r
            assert 5 <= int(members.sum()) <= 34
            assert feat[members].tolist().count(r + 1) == 1
            assert int((feat == r + 1).sum()) == 1
        # Denser within communities than between.
        adj = to_dense_adj(g.edge_index, max_num_nodes=g.num_nodes)[0].bool()
        same = g.y[:, None] == g.y[None, :]
        assert adj[same].float().mean() > adj[~same].float().mean()


def _pattern_signature(g):
    # The planted pattern up to the node order: its size, its features and
    # each node's (feature, degree within the pattern), sorted.
    inside = g.y == 1
    adj = to_dense_adj(g.edge_index, max_num_nodes=g.num_nodes)[0]
    sub = adj[inside][:, inside]
    feat = g.x[inside].argmax(1)
    return sorted(zip(feat.tolist(), sub.sum(1).long().tolist())), int(sub.sum())


@pytest.mark.slow
def test_pattern_recipe_invariants():
    val = generate_sbm_graphs("PATTERN", "val")
    test = generate_sbm_graphs("PATTERN", "test")
    assert len(val) == len(test) == 2000
    per = RECIPES["PATTERN"]["graphs"]["val"]
    for g in val[:100]:
        _check_simple_undirected(g)
        assert g.x.shape[1] == 3 and bool((g.x.sum(1) == 1).all())
        assert set(g.y.unique().tolist()) == {0, 1}
    # The graphs of one pattern share its edges and features (as drawn
    # once), in both splits; different patterns differ.
    signatures = []
    for p in range(0, 100, 10):
        sig = _pattern_signature(val[p * per])
        for g in val[p * per:(p + 1) * per] + test[p * per:(p + 1) * per]:
            assert _pattern_signature(g) == sig
        signatures.append(sig)
    assert len({str(s) for s in signatures}) == len(signatures)
    # The pattern's nodes are not placed first or last: the nodes are shuffled.
    first = torch.stack([g.y[0] for g in val[:400]]).float().mean()
    assert 0.02 < float(first) < 0.5


def test_same_seed_same_graphs_other_seed_other_graphs():
    a = generate_sbm_graphs("CLUSTER", "test", seed=3)
    b = generate_sbm_graphs("CLUSTER", "test", seed=3)
    c = generate_sbm_graphs("CLUSTER", "test", seed=4)
    assert all(torch.equal(x.edge_index, y.edge_index) and torch.equal(x.x, y.x)
               for x, y in zip(a, b))
    assert not torch.equal(a[0].edge_index, c[0].edge_index)


@pytest.mark.slow
def test_graphs_are_host_data_whatever_the_default_device():
    # Drawn from CPU generators: a default device set by the caller (CUDA,
    # or here meta, which would make every tensor an empty shell) changes
    # nothing.
    ref = generate_sbm_graphs("PATTERN", "test", seed=1)[:3]
    with torch.device("meta"):
        got = generate_sbm_graphs("PATTERN", "test", seed=1)[:3]
    assert all(g.edge_index.device.type == "cpu" for g in got)
    assert all(torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
               and torch.equal(a.y, b.y) for a, b in zip(got, ref))


def _mean_and_se(values):
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std() / math.sqrt(len(t)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["CLUSTER", "PATTERN"])
def test_full_split_statistics(name):
    # The whole training split: its means lie within 4% (nodes) and 8%
    # (edges) of PyG's documented ones, and within 4 standard errors of
    # the recipe's expectation (PATTERN's given its 100 drawn patterns).
    graphs = generate_sbm_graphs(name, "train")
    assert len(graphs) == 10000
    nodes, nodes_se = _mean_and_se([g.num_nodes for g in graphs])
    edges, edges_se = _mean_and_se([g.edge_index.size(1) for g in graphs])
    pyg_nodes, pyg_edges = PYG_STATS[name]
    assert abs(nodes / pyg_nodes - 1) < 0.04
    assert abs(edges / pyg_edges - 1) < 0.08
    recipe = RECIPES[name]
    base, within, pairs = _expected_base(recipe)
    exp_nodes, exp_pairs = base, recipe["p"] * within + recipe["q"] * (pairs - within)
    if name == "PATTERN":
        per = recipe["graphs"]["train"]
        pat_nodes = torch.tensor([int((g.y == 1).sum()) for g in graphs[::per]],
                                 dtype=torch.float64)
        pat_edges = torch.tensor([_pattern_signature(g)[1] / 2 for g in graphs[::per]],
                                 dtype=torch.float64)
        exp_nodes = base + float(pat_nodes.mean())
        exp_pairs += float(pat_edges.mean()) + recipe["q_pattern"] * base * float(
            pat_nodes.mean())
    assert abs(nodes - exp_nodes) < 4 * nodes_se
    assert abs(edges - 2 * exp_pairs) < 4 * edges_se


def test_dataset_caches_and_follows_pyg_conventions(tmp_path):
    ds = SBMBenchmarkDataset(str(tmp_path), "CLUSTER", "test", seed=1)
    assert len(ds) == 1000 and ds.num_features == 7 and ds.num_classes == 6
    assert (tmp_path / "CLUSTER" / "processed" / "test_seed1.pt").exists()
    again = SBMBenchmarkDataset(str(tmp_path), "CLUSTER", "test", seed=1)
    assert torch.equal(ds[5].edge_index, again[5].edge_index)
    assert ds[5].x.dtype == torch.float32 and ds[5].y.dtype == torch.long
    assert repr(ds) == "CLUSTER(1000, split='test', seed=1)"


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="ZINC"), "name"), (dict(split="dev"), "split"),
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed")])
def test_bad_arguments_name_the_argument(tmp_path, kwargs, match):
    args = dict(name="CLUSTER", split="test", seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        SBMBenchmarkDataset(str(tmp_path), **args)
    with pytest.raises(ValueError, match=match):
        generate_sbm_graphs(**args)
