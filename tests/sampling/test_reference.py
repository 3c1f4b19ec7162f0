"""The dense references: expected_adjacency and bernoulli."""

import pytest
import torch

from sbm_pyg.sampling import (
    bernoulli,
    expected_adjacency,
)
from tests.sampling.cases import (
    check_marginals,
    small_sbm,
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_bernoulli_marginals(mode):
    check_marginals(bernoulli, mode)


def test_expected_adjacency_dense_reference():
    q, b, k = small_sbm()
    P = expected_adjacency(q, b, k, ptr_q=[0, 2, 6], ptr_k=[0, 4, 5],
                           mode="exact")
    p = torch.einsum("ihu,huv,jhv->hij", q, b, k).clamp(max=1)
    assert torch.allclose(P[:, :2, :4], p[:, :2, :4])
    assert torch.allclose(P[:, 2:, 4:], p[:, 2:, 4:])
    assert torch.all(P[:, :2, 4:] == 0) and torch.all(P[:, 2:, :4] == 0)
