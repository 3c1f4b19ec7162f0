"""Statistical helpers: every bound holds with probability >= 1 - ALPHA for
a correct sampler, and every test runs with a fixed seed."""
import os
from statistics import NormalDist

import torch

ALPHA = 1e-3

# The device of the device-relevant tests (see tests/conftest.py).
TEST_DEVICE = torch.device(os.environ.get("SBM_PYG_TEST_DEVICE", "cpu"))


# Added to every seed of seeded(): CI runs the device-relevant tests once more
# with another offset, so that no test holds only for one generator's draws
# (CUDA's stream differs from the CPU's).
SEED_OFFSET = int(os.environ.get("SBM_PYG_TEST_SEED_OFFSET", "0"))


def seeded(seed: int) -> torch.Generator:
    """A generator on the test's default device, seeded with
    ``seed + SEED_OFFSET``."""
    return torch.Generator(torch.get_default_device()).manual_seed(
        seed + SEED_OFFSET)


def z_bound(num_tests: int, alpha: float = ALPHA) -> float:
    """Two-sided Bonferroni bound for the max of ``num_tests`` |z| scores."""
    return NormalDist().inv_cdf(1 - alpha / (2 * num_tests))


def max_binomial_z(counts: torch.Tensor, trials: int, prob: torch.Tensor) -> float:
    """Max |z| of binomial counts against probabilities ``prob``.

    Pairs with probability 0 or 1 must match exactly (else inf).
    """
    counts, prob = counts.double().flatten(), prob.double().flatten()
    degenerate = (prob <= 0) | (prob >= 1)
    if not torch.equal(counts[degenerate], trials * prob[degenerate].clamp(0, 1)):
        return float("inf")
    p = prob[~degenerate]
    z = (counts[~degenerate] - trials * p) / (trials * p * (1 - p)).sqrt()
    return float(z.abs().max()) if z.numel() else 0.0


def pin_crossover(monkeypatch, value: float) -> None:
    """Sets the density from which "auto" takes the dense regime, on every
    device (the CPU's value and no GPU's own)."""
    from sbm_pyg.ops import backend_info
    monkeypatch.setattr(backend_info, "DENSE_CROSSOVER", value)
    monkeypatch.setattr(backend_info, "DEVICE_CROSSOVERS", {})


def pin_tiles_min_edges(monkeypatch, value: float) -> None:
    """Sets the least expected edges in the tiles from which "auto" takes
    the tiled regime, on every device (the CPU's value and no GPU's own)."""
    from sbm_pyg.ops import backend_info
    monkeypatch.setattr(backend_info, "TILES_MIN_EDGES", value)
    monkeypatch.setattr(backend_info, "DEVICE_TILES_MIN_EDGES", {})


def kernels_ran(backends: dict) -> dict:
    """A layer's last_backends without the crossover it reports on a GPU
    (which value "auto" compared with): the kernels that ran."""
    return {k: v for k, v in backends.items() if k != "crossover"}
