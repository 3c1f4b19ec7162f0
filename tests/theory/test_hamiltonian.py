"""Hamiltonian paths and cycles: the exact search against brute force and
networkx, the heuristic never contradicting it, the certificate check."""
import itertools

import networkx as nx
import numpy as np
import pytest

from sbm_pyg.theory import (
    count_hamiltonian_cycles,
    hamiltonian_path,
    is_hamiltonian_path,
)


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
    with pytest.raises(ValueError, match="method"):
        hamiltonian_path(nx.DiGraph([(0, 1)]), method="magic")
    with pytest.raises(ValueError, match="exact"):
        hamiltonian_path(nx.tournament.random_tournament(30, seed=0), method="exact")
