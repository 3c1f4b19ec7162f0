import math

import pytest
import torch

from sbm_pyg.experiments.tasks import repeat_accuracy_bound
from sbm_pyg.nn import StochasticBlockModel
from sbm_pyg.theory import block_masses, within_block_cap


def _g(x: torch.Tensor) -> torch.Tensor:
    return (1 + torch.sqrt(1 + 4 * x)) / 2


@pytest.mark.parametrize("init", ["paper", "dense"])
def test_the_cap_holds_on_random_paper_heads(init):
    # The proposition, T <= (1 + sqrt(1 + 4 X)) / 2, on random parameters
    # and inputs of several scales (memberships from near 0 to near 1).
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(40):
        torch.manual_seed(trial)
        V, k = int(torch.randint(2, 30, (1,), generator=gen)), 16
        sbm = StochasticBlockModel(3, 8, k, init=init)
        with torch.no_grad():
            sbm.clusters.mul_(float(torch.rand((), generator=gen)) * 30)
        scale = float(torch.rand((), generator=gen)) * 6
        q = scale * torch.randn(V, 3, 8, generator=gen)
        kk = scale * torch.randn(V, 3, 8, generator=gen)
        q_memb, block, k_memb = sbm(q, kk)
        T, X = (t.detach().double() for t in block_masses(q_memb, block, k_memb))
        # float32 products: a relative rounding allowance at the equality.
        assert bool((T <= _g(X) * (1 + 1e-5)).all()), (trial, T, X)
        worst = max(worst, float((T / _g(X)).max()))
    assert worst > 0.5  # the draws come near the bound, not only far below


def test_the_cap_is_reached_at_both_ends():
    V, k = 5, 5
    block = torch.full((1, k, k), 1.0 / k ** 2)
    # Disjoint one-hot supports, the block's mass on their diagonal pairs:
    # T = 1, X = 0.
    one_hot = torch.eye(V)[:, None]
    diag = torch.diag(torch.full((k,), 1.0 / k))[None]
    T, X = block_masses(one_hot, diag, one_hot)
    assert T.item() == pytest.approx(1.0) and X.item() == 0.0
    # Memberships all 1: every p = 1, T = V, X = V (V - 1), the bound's equality.
    ones = torch.ones(V, 1, k)
    T, X = block_masses(ones, block, ones)
    assert T.item() == pytest.approx(V)
    assert X.item() == pytest.approx(V * (V - 1))
    assert _g(X).item() == pytest.approx(T.item())


def test_mmsb_goes_beyond_the_cap():
    # The same V one-hot pairs through the mixed-membership form (block
    # entries near 1 on the diagonal, near 0 off it): T near V, X near 0.
    V = 6
    one_hot = torch.eye(V)[:, None]
    block = torch.sigmoid(20 * torch.eye(V) - 10)[None]
    T, X = block_masses(one_hot, block, one_hot)
    assert T.item() > 0.99 * V and X.item() < 0.01
    assert T.item() > _g(X).item() + 4


def test_within_block_cap_values():
    assert within_block_cap(1) == 1.0
    assert within_block_cap(41) == pytest.approx(1 / 41)
    # V p (V p - 1) = V (V - 1) eps, solved for p.
    V, eps = 10, 0.2
    p = within_block_cap(V, eps)
    assert V * p * (V * p - 1) == pytest.approx(V * (V - 1) * eps)
    assert within_block_cap(10, 1.0) == 1.0
    # Dense blocks (p = 0.97) of the repeat task at N = 64 (about 41 values)
    # need nearly every cross pair: eps >= p (V p - 1) / (V - 1) = 0.94.
    V, p = 41, 0.97
    eps = p * (V * p - 1) / (V - 1)
    assert within_block_cap(V, eps) == pytest.approx(p)
    assert eps > 0.93
    # At the cap without cross pairs the task is at its majority class.
    assert repeat_accuracy_bound(64, within_block_cap(41)) == pytest.approx(
        repeat_accuracy_bound(64, 0.0))


def test_bad_input():
    with pytest.raises(ValueError, match="num_blocks"):
        within_block_cap(0)
    with pytest.raises(ValueError, match="cross_probability"):
        within_block_cap(3, math.nan)
    with pytest.raises(ValueError, match="q_memb"):
        block_masses(torch.ones(2, 3), torch.ones(1, 3, 3), torch.ones(2, 1, 3))
    with pytest.raises(ValueError, match="block"):
        block_masses(torch.ones(2, 1, 3), torch.ones(1, 2, 2), torch.ones(2, 1, 3))
