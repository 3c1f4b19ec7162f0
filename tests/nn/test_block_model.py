import math

import pytest
import torch

from sbm_pyg.nn import StochasticBlockModel
from tests.helpers import z_bound


def test_shapes_and_ranges():
    torch.manual_seed(0)
    sbm = StochasticBlockModel(heads=3, channels=8, num_clusters=5)
    q, k = torch.randn(7, 3, 8), torch.randn(4, 3, 8)
    q_memb, block, k_memb = sbm(q, k)
    assert q_memb.shape == (7, 3, 5) and k_memb.shape == (4, 3, 5)
    assert block.shape == (3, 5, 5)
    assert torch.allclose(block.sum((1, 2)), torch.ones(3))  # softmax over k^2
    assert bool(((q_memb > 0) & (q_memb < 1)).all())
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb)
    assert bool((p < 1).all())  # so mode="exact" needs no capping


def test_matches_the_paper_equations_per_head():
    torch.manual_seed(1)
    sbm = StochasticBlockModel(heads=2, channels=4, num_clusters=3)
    q, k = torch.randn(5, 2, 4), torch.randn(6, 2, 4)
    q_memb, block, k_memb = sbm(q, k)
    for h in range(2):  # per-head reference, written out
        C = sbm.clusters[h]

        def mlp(x, h=h):
            return torch.relu(x @ sbm.weight1[h] + sbm.bias1[h]) @ sbm.weight2[h] + sbm.bias2[h]
        assert torch.allclose(block[h], torch.softmax((C @ C.T).flatten(), 0).view(3, 3))
        assert torch.allclose(q_memb[:, h], torch.sigmoid(mlp(q[:, h]) @ C.T))
        assert torch.allclose(k_memb[:, h], torch.sigmoid(mlp(k[:, h]) @ C.T))


def test_heads_have_their_own_parameters():
    torch.manual_seed(2)
    sbm = StochasticBlockModel(heads=2, channels=4, num_clusters=3)
    q = torch.randn(5, 2, 4)
    before = sbm(q, q)
    with torch.no_grad():
        sbm.clusters[0].add_(1.0)
        sbm.weight1[0].mul_(2.0)
    after = sbm(q, q)
    assert torch.equal(before[0][:, 1], after[0][:, 1])
    assert not torch.allclose(before[0][:, 0], after[0][:, 0])


def test_kaiming_normal_cluster_init():
    # As the published code: kaiming_normal_ on the one [H, k, d] tensor,
    # whose fan-in is k * d, so N(0, 2 / (k d)), not a per-head fan-in of d.
    torch.manual_seed(3)
    heads, k, d = 4, 128, 32
    sbm = StochasticBlockModel(heads, d, k)
    sigma2 = 2.0 / (k * d)
    n = sbm.clusters.numel()
    c = sbm.clusters.detach().double()
    s2 = float(c.pow(2).mean())  # known mean 0
    assert abs(s2 / sigma2 - 1) < z_bound(1) * math.sqrt(2 / n)
    assert abs(float(c.mean())) < z_bound(1) * math.sqrt(sigma2 / n)


@pytest.mark.parametrize("init,low,high", [("paper", 0.2, 0.3), ("dense", 0.98, 1.0)])
def test_initial_edge_probability(init, low, high):
    # Queries of unit scale per coordinate, as after a LayerNorm.
    torch.manual_seed(5)
    sbm = StochasticBlockModel(4, 32, 128, init=init)
    x = torch.randn(200, 4, 32)
    q_memb, block, k_memb = sbm(x, x)
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    assert low < float(p.mean()) < high
    assert float(p.min()) > (0.9 if init == "dense" else 0.1)


def test_dense_init_gathers_the_clusters():
    torch.manual_seed(6)
    sbm = StochasticBlockModel(2, 16, 32, init="dense")
    c = sbm.clusters.detach()
    u = c.mean(1, keepdim=True)  # each head's common direction
    assert torch.allclose(u.norm(dim=-1), torch.ones(2, 1), atol=0.05)
    assert torch.allclose(sbm.bias2.detach(), 6 * u / u.norm(dim=-1, keepdim=True),
                          atol=0.3)
    assert float((c - u).std()) == pytest.approx(0.1, rel=0.1)


def test_reset_parameters():
    sbm = StochasticBlockModel(2, 4, 3)
    torch.manual_seed(4)
    sbm.reset_parameters()
    first = [p.clone() for p in sbm.parameters()]
    torch.manual_seed(4)
    sbm.reset_parameters()
    assert all(torch.equal(a, b) for a, b in zip(first, sbm.parameters()))
    sbm.reset_parameters()
    assert not torch.equal(first[-1], sbm.clusters)


def test_repr_and_bad_input():
    sbm = StochasticBlockModel(2, 4, 3)
    assert repr(sbm) == "StochasticBlockModel(heads=2, channels=4, num_clusters=3)"
    with pytest.raises(ValueError, match="query"):
        sbm(torch.randn(5, 3, 4), torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match="num_clusters"):
        StochasticBlockModel(2, 4, 0)
    with pytest.raises(ValueError, match="init"):
        StochasticBlockModel(2, 4, 3, init="zeros")
    assert repr(StochasticBlockModel(2, 4, 3, init="dense")) == \
        "StochasticBlockModel(heads=2, channels=4, num_clusters=3, init='dense')"


def test_one_near_certain_pair_per_node_forces_every_pair_up():
    # Ŝ sums to 1 and memberships lie in (0, 1), so for queries i, i' and
    # keys j, j':  1 - p(i, j') <= (1 - p(i, j)) + (1 - p(i', j')).
    # A head that gives every query's duplicate probability 1 - eps thus
    # gives every pair at least 1 - 2 eps: it is (nearly) full attention.
    torch.manual_seed(7)
    for init in ("paper", "dense"):
        sbm = StochasticBlockModel(2, 8, 6, init=init)
        x = 3 * torch.randn(9, 2, 8)
        q_memb, block, k_memb = sbm(x, x)
        miss = 1 - torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
        # [H, i, j, i', j']: miss[i, j'] vs miss[i, j] + miss[i', j']
        lhs = miss[:, :, None, None, :]
        rhs = miss[:, :, :, None, None] + miss[:, None, None, :, :]
        assert bool((lhs <= rhs + 1e-6).all())


def test_cluster_masses_and_expected_densities_exact():
    from sbm_pyg.nn.block_model import cluster_masses, expected_densities
    # Sequences of 2, 0 and 1 rows; H = 1, k = 2.
    memb = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]],
                        requires_grad=True)
    ptr = torch.tensor([0, 2, 2, 3])
    mass = cluster_masses(ptr, memb)
    assert mass.tolist() == [[[4.0, 6.0]], [[0.0, 0.0]], [[5.0, 6.0]]]
    # The gradient of a weighted sum reaches each row through its sequence.
    (mass * torch.tensor([1.0, 10.0, 100.0])[:, None, None]).sum().backward()
    assert memb.grad[:, 0, 0].tolist() == [1.0, 1.0, 100.0]
    # p_ij = q_i S k_j with S = [[0, 1], [0, 0]]: sum_ij q_i0 k_j1 / n^2.
    block = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]])
    dens = expected_densities(ptr, ptr, memb.detach(), block, memb.detach())
    assert dens[:, 0].tolist() == [4.0 * 6.0 / 4, 0.0, 5.0 * 6.0 / 1]
