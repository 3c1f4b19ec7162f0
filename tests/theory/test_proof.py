"""The proof's patterns and SBMs: every condition holds, and fastRG's exact
mode samples the patterns."""

import networkx as nx
import numpy as np
import pytest
import torch

from sbm_pyg.sampling import fastrg
from sbm_pyg.theory import (
    check_conditions,
    check_reachability,
    from_networkx,
    is_hamiltonian_path,
    pattern_masks,
    proof_hamiltonian_path,
    proof_patterns,
    proof_sbm,
    to_networkx,
)
from tests.helpers import seeded


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


def test_bad_arguments():
    with pytest.raises(ValueError, match="k < n"):
        proof_patterns(4, 4)
