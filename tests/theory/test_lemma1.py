"""Lemma 1: the expected number of Hamiltonian cycles and the probability
of one."""
import math

from sbm_pyg.theory import (
    expected_hamiltonian_cycles,
    hamiltonian_cycle_probability,
    lemma1_probability,
)


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
