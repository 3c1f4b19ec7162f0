"""The approximation conditions on attention patterns and trained models:
reachability against an independent BFS, broken variants with their
witnesses, frequencies over inputs."""

import networkx as nx
import numpy as np
import pytest
import torch

from sbm_pyg.theory import (
    check_conditions,
    check_reachability,
    check_self_loops,
    condition_frequencies,
    is_hamiltonian_path,
    model_conditions,
    proof_patterns,
)
from tests.helpers import seeded


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


def test_bad_arguments():
    with pytest.raises(ValueError, match="square"):
        check_conditions([torch.zeros(3, 4, dtype=torch.bool)])
