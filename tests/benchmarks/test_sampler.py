import pytest

from tests.helpers import seeded

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_published_baseline_samples_the_same_sbm():
    # The baseline must sample the SBM it is compared on: its mean edge
    # count matches fastrg's (poisson mode) within 4 standard errors.
    import torch

    from benchmarks.cases import kaiming_sbm
    from benchmarks.sampler import published_fastrg
    from sbm_pyg.sampling import expected_adjacency
    q, b, k, ptr = kaiming_sbm(2, 64, torch.device("cpu"))
    gen = seeded(0)
    runs = 20
    counts = torch.tensor([float(published_fastrg(q, b, k, 2, 64, gen))
                           for _ in range(runs)], dtype=torch.float64)
    P = expected_adjacency(q, b, k, ptr_q=ptr, ptr_k=ptr)
    mean, var = float(P.sum()), float((P * (1 - P)).sum())
    assert abs(float(counts.mean()) - mean) < 4 * (var / runs) ** 0.5
