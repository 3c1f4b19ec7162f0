import itertools
import math

import networkx as nx
import numpy as np
import pytest
import torch

from sbm_pyg.sampling import SampledGraph, fastrg
from sbm_pyg.theory import (
    GraphRecorder,
    check_conditions,
    check_reachability,
    check_self_loops,
    condition_frequencies,
    count_hamiltonian_cycles,
    expected_hamiltonian_cycles,
    from_networkx,
    hamiltonian_cycle_probability,
    hamiltonian_path,
    is_hamiltonian_path,
    lemma1_probability,
    model_conditions,
    pattern_masks,
    proof_hamiltonian_path,
    proof_patterns,
    proof_sbm,
    to_networkx,
)
from tests.helpers import seeded


def random_digraph(n, p, seed):
    return nx.gnp_random_graph(n, p, seed=seed, directed=True)


def brute_force_path(G):
    return any(all(G.has_edge(u, v) for u, v in zip(perm, perm[1:]))
               for perm in itertools.permutations(G.nodes))


def test_exact_dp_against_brute_force():
    for seed in range(150):
        n = 2 + seed % 7  # 2..8 nodes
        G = random_digraph(n, 0.15 + 0.5 * (seed % 5) / 5, seed)
        path = hamiltonian_path(G, method="exact")
        assert (path is not None) == brute_force_path(G), seed
        if path is not None:
            assert is_hamiltonian_path(G, path)


def test_exact_dp_on_random_tournaments():
    # Every tournament has a Hamiltonian path (Redei); networkx builds one.
    for n in range(2, 14):
        T = nx.tournament.random_tournament(n, seed=n)
        assert is_hamiltonian_path(T, nx.tournament.hamiltonian_path(T))
        assert is_hamiltonian_path(T, hamiltonian_path(T, method="exact"))
        assert is_hamiltonian_path(T, hamiltonian_path(T, method="heuristic"))


def test_heuristic_never_contradicts_the_dp():
    for seed in range(60):
        n = 8 + seed % 7
        G = random_digraph(n, 0.2 + 0.1 * (seed % 4), 1000 + seed)
        exact = hamiltonian_path(G, method="exact")
        heuristic = hamiltonian_path(G, method="heuristic", time_budget=0.2)
        if heuristic is None:
            assert exact is None  # "no" only with a proof
        elif heuristic != "unknown":
            assert is_hamiltonian_path(G, heuristic) and exact is not None


def test_certificate_checker():
    G = nx.DiGraph([(0, 1), (1, 2)])
    assert is_hamiltonian_path(G, [0, 1, 2])
    assert not is_hamiltonian_path(G, [2, 1, 0])
    assert not is_hamiltonian_path(G, [0, 1])
    assert hamiltonian_path(nx.DiGraph([(0, 1), (2, 1)])) is None


def bfs_reachability(masks, s_max):
    """Independent: sets of Python ints, iterated as defined."""
    n, p = masks[0].shape[0], len(masks)
    attend = [[set(np.nonzero(m[i])[0].tolist()) for i in range(n)] for m in masks]
    S = [set(attend[0][i]) for i in range(n)]
    for s in range(1, s_max + 1):
        if s > 1:
            layer = attend[(s - 1) % p]
            S = [set().union(*(S[j] for j in layer[i])) for i in range(n)]
        if all(len(x) == n for x in S):
            return s
    return None


def test_reachability_against_bfs():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n, p = 6 + trial % 5, 1 + trial % 3
        masks = [rng.random((n, n)) < 0.25 for _ in range(p)]
        for m in masks:
            np.fill_diagonal(m, trial % 2 == 0)
        s, unreached = check_reachability(masks, s_max=12)
        assert s == bfs_reachability(masks, 12)
        assert (s is None) == bool(unreached)


@pytest.mark.parametrize("n,k", [(8, 2), (16, 4), (30, 3), (64, 8), (100, 7)])
def test_proof_patterns_satisfy_all_conditions(n, k):
    patterns = proof_patterns(n, k)
    A1, A2, A3 = patterns
    report = check_conditions(patterns)
    assert report.self_loops and report.strongly_connected
    # Condition 3 as defined (cyclic order): in the paper's order the relays
    # gather everything at t=3 (A3) but broadcast only at t=5 (A2 again);
    # gathering first gives the paper's s=3.
    assert report.reachability_s == (4 if k == 2 else 5)
    assert check_reachability([A1, A3, A2])[0] == 3
    path = proof_hamiltonian_path(n, k)
    union = nx.compose_all([to_networkx(from_networkx(nx.DiGraph(
        [(int(j), int(i)) for i, j in zip(*np.nonzero(m.cpu().numpy()))]))) for m in patterns])
    assert is_hamiltonian_path(union, path)
    if n <= 20:
        assert report.all_hold and is_hamiltonian_path(union, report.hamiltonian_path)


@pytest.mark.parametrize("n,k", [(16, 4), (30, 3)])
def test_fastrg_exact_samples_the_proof_patterns(n, k):
    for (q, b, kk), expected in zip(proof_sbm(n, k), proof_patterns(n, k)):
        for seed in range(3):
            graph = fastrg(q, b, kk, mode="exact", self_loops=True,
                           generator=seeded(seed))
            assert torch.equal(pattern_masks(graph)[0], expected)


def test_broken_variants_are_caught_with_witnesses():
    A1, A2, A3 = (m.clone() for m in proof_patterns(16, 4))
    A2[5, 5] = False
    report = check_conditions([A1, A2, A3])
    assert report.missing_self_loops == [(1, 5)] and not report.all_hold
    # Cut block 0 (tokens 0-3) off: no relay attends it. Block 0 still sees
    # everything through the relays, but no other token ever sees block 0;
    # a Hamiltonian path still exists (ending in block 0): conditions 2 and 3
    # are independent.
    A1, A2, A3 = proof_patterns(16, 4)
    A3 = A3.clone()
    A3[12:, :4] = False
    report = check_conditions([A1, A2, A3])
    assert report.reachability_s is None
    assert report.unreached == list(range(4, 16))
    assert not report.strongly_connected
    union = nx.DiGraph([(int(j), int(i)) for i, j in
                        zip(*np.nonzero((A1 | A2 | A3).cpu().numpy()))])
    assert is_hamiltonian_path(union, report.hamiltonian_path)
    assert check_self_loops([A1, A2, A3]) == []
    # Isolate token 5 (self-loops only): no Hamiltonian path, and a proof.
    A1, A2, A3 = (m.clone() for m in proof_patterns(16, 4))
    for m in (A1, A2, A3):
        m[5, :] = False
        m[:, 5] = False
        m[5, 5] = True
    report = check_conditions([A1, A2, A3])
    assert report.hamiltonian_path is None and report.self_loops
    assert 5 in report.unreached or report.reachability_s is None


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


def test_model_conditions_on_a_trained_model():
    # A tiny model trained briefly with self-loops ("+I"): condition 1 holds
    # by construction; report how often 2 and 3 hold across inputs.
    from sbm_pyg.experiments.tasks import repeat_batch
    from sbm_pyg.models import SBMTransformer
    torch.manual_seed(0)
    gen = seeded(0)
    model = SBMTransformer(9, 8, channels=16, num_layers=2, heads=2, num_clusters=8,
                           self_loops=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        x, y = repeat_batch(16, 8, gen)
        out = model(x, generator=gen, output="token")
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.token_logits.squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x, _ = repeat_batch(10, 8, gen)
    reports = model_conditions(model, lambda: model(x, generator=gen), num_sequences=10)
    assert len(reports) == 10 and all(r.num_patterns == 4 for r in reports)
    assert all(r.self_loops for r in reports)
    for r in reports:  # verdicts agree with their witnesses
        if r.has_hamiltonian_path:
            assert len(r.hamiltonian_path) == 8
        assert (r.reachability_s is None) == bool(r.unreached)
    freq = condition_frequencies(reports)
    assert freq["inputs"] == 10 and freq["self_loops"] == 1.0
    assert freq["all_hold"] == sum(r.all_hold for r in reports) / 10


def test_lemma1_expectation_and_probability():
    assert lemma1_probability(2) > 1 and lemma1_probability(3) > 1  # not a probability
    for n in range(4, 40):
        p = lemma1_probability(n)
        assert math.isclose(p, math.e / n * n ** (1 / n)) and p < 1
        assert expected_hamiltonian_cycles(n, p) >= 1  # the lemma's claim
    # The expectation, checked by Monte Carlo with exact cycle counts.
    result = hamiltonian_cycle_probability(8, trials=400, seed=1)
    assert math.isclose(result["expected_cycles"], result["p"] ** 8 * math.factorial(7))
    # Exact variance is not closed-form here; a loose bound from the sample.
    counts_mean = result["mean_cycles"]
    assert abs(counts_mean - result["expected_cycles"]) < 0.5 * result["expected_cycles"]
    # What the lemma does not give: a cycle with high probability.
    lo, hi = result["ci"]
    assert hi < 0.8 and 0 <= lo <= result["probability"] <= hi
    assert 0.0 < result["zero_indegree"] < 0.2


def test_count_hamiltonian_cycles_against_brute_force():
    rng = np.random.default_rng(2)
    for trial in range(30):
        n = 3 + trial % 4
        adj = rng.random((n, n)) < 0.5
        np.fill_diagonal(adj, False)
        brute = sum(all(adj[u, v] for u, v in zip((0,) + perm, perm + (0,)))
                    for perm in itertools.permutations(range(1, n)))
        assert count_hamiltonian_cycles(adj) == brute


def test_bad_arguments():
    with pytest.raises(ValueError, match="k < n"):
        proof_patterns(4, 4)
    with pytest.raises(ValueError, match="method"):
        hamiltonian_path(nx.DiGraph([(0, 1)]), method="magic")
    with pytest.raises(ValueError, match="square"):
        check_conditions([torch.zeros(3, 4, dtype=torch.bool)])
    with pytest.raises(ValueError, match="exact"):
        hamiltonian_path(nx.tournament.random_tournament(30, seed=0), method="exact")


def test_condition_frequencies_on_patterns_with_known_conditions():
    eye = torch.eye(4, dtype=torch.bool)
    ring = eye | eye.roll(1, 1)          # self-loops, a cycle: everything holds
    reports = [check_conditions([ring]),
               check_conditions([eye]),      # self-loops only: no path, no reach
               check_conditions([eye.roll(1, 1)]),  # a cycle without self-loops
               check_conditions([ring, eye])]
    assert [r.self_loops for r in reports] == [True, True, False, True]
    assert [r.has_hamiltonian_path for r in reports] == [True, False, True, True]
    assert [r.all_hold for r in reports] == [True, False, False, True]
    freq = condition_frequencies(reports)
    assert freq == dict(inputs=4, self_loops=0.75, hamiltonian_path=0.75,
                        hamiltonian_unknown=0.0,
                        reachability=sum(r.reachability_s is not None for r in reports) / 4,
                        strongly_connected=0.75, all_hold=0.5)
    assert reports[1].reachability_s is None
    with pytest.raises(ValueError, match="at least one"):
        condition_frequencies([])
