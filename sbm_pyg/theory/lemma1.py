r"""Lemma 1 (Hamiltonian cycles of a directed Erdős–Rényi graph), computed
and measured."""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Optional, Tuple

import numpy as np
import torch

from sbm_pyg.theory.hamiltonian import count_hamiltonian_cycles, has_hamiltonian_cycle

# Lemma 1


def lemma1_probability(n: int) -> float:
    r""":math:`p^*(n) = (e / n)\, n^{1/n}`, the edge probability of Lemma 1.

    It exceeds 1 for :math:`n \leq 3` (:math:`p^*(2) = 1.92`), where it is no
    probability; from :math:`n = 4` on it is below 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.e / n * n ** (1.0 / n)


def expected_hamiltonian_cycles(n: int, p: float) -> float:
    r""":math:`\mathbb{E}[\#\text{Hamiltonian cycles of } G(n, p)] = p^n
    (n-1)!` (directed, no self-loops)."""
    if n < 2 or not 0 <= p <= 1:
        raise ValueError(f"need n >= 2 and p in [0, 1], got n={n}, p={p}")
    if p == 0:
        return 0.0
    return math.exp(n * math.log(p) + math.lgamma(n))


def _wilson(successes: int, trials: int, confidence: float = 0.95) -> Tuple[float, float]:
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials ** 2)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def hamiltonian_cycle_probability(n: int, p: Optional[float] = None,
                                  trials: int = 200, seed: int = 0) -> dict:
    r"""Monte Carlo over directed :math:`G(n, p)` (default :math:`p^*(n)`),
    with the exact dynamic program for each sample (:math:`n \leq 16`).

    Returns a dict with ``p``, ``expected_cycles`` (:math:`p^n (n-1)!`),
    ``mean_cycles`` (sample mean of the cycle count, for :math:`n \leq 12`),
    ``probability`` (fraction with a Hamiltonian cycle) and its 95% Wilson
    interval ``ci``, and ``zero_indegree`` (mean fraction of nodes without an
    incoming edge).
    """
    if not 2 <= n <= 16:
        raise ValueError(f"n must be in [2, 16], got {n}")
    p = lemma1_probability(n) if p is None else p
    gen = torch.Generator().manual_seed(seed)
    hits, zero_in, counts = 0, 0.0, []
    for _ in range(trials):
        adj = (torch.rand(n, n, generator=gen, device="cpu") < p).numpy()
        np.fill_diagonal(adj, False)
        zero_in += float((~adj.any(0)).mean())
        if n <= 12:
            c = count_hamiltonian_cycles(adj)
            counts.append(c)
            hits += c > 0
        else:
            hits += has_hamiltonian_cycle(adj)
    return dict(n=n, p=p, trials=trials,
                expected_cycles=expected_hamiltonian_cycles(n, p),
                mean_cycles=float(np.mean(counts)) if counts else None,
                probability=hits / trials, ci=_wilson(hits, trials),
                zero_indegree=zero_in / trials)
