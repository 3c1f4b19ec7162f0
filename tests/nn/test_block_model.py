import math

import pytest
import torch

from sbm_pyg.nn import StochasticBlockModel
from tests.helpers import seeded, z_bound


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


@pytest.mark.parametrize("parametrization,init,low,high,floor", [
    ("paper", "paper", 0.2, 0.3, 0.1), ("paper", "dense", 0.98, 1.0, 0.9),
    ("mmsb", "paper", 0.2, 0.3, 0.2), ("mmsb", "dense", 0.99, 1.0, 0.99),
    # The sharp form's wide clusters spread the block's entries around its
    # offset (C C'^T of std 0.3^2 sqrt(32) = 0.51), and a token's top query
    # and key clusters lean together: 30-33% at the start over seeds 0-7.
    ("sharp", "paper", 0.2, 0.4, 0.05), ("sharp", "dense", 0.99, 1.0, 0.98)])
def test_initial_edge_probability(parametrization, init, low, high, floor):
    # Queries of unit scale per coordinate, as after a LayerNorm.
    torch.manual_seed(5)
    sbm = StochasticBlockModel(4, 32, 128, init=init,
                               parametrization=parametrization)
    x = torch.randn(200, 4, 32)
    q_memb, block, k_memb = sbm(x, x)
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    assert low < float(p.mean()) < high
    assert float(p.min()) > floor


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


def test_mmsb_matches_its_equations_per_head():
    torch.manual_seed(11)
    sbm = StochasticBlockModel(heads=2, channels=4, num_clusters=3,
                               parametrization="mmsb")
    with torch.no_grad():
        sbm.block_bias.copy_(torch.tensor([-1.0, 2.0]).view(2, 1, 1))
    q, k = torch.randn(5, 2, 4), torch.randn(6, 2, 4)
    q_memb, block, k_memb = sbm(q, k)
    for h in range(2):
        C, b = sbm.clusters[h], float(sbm.block_bias[h])

        def mlp(x, h=h):
            return torch.relu(x @ sbm.weight1[h] + sbm.bias1[h]) @ sbm.weight2[h] + sbm.bias2[h]
        assert torch.allclose(block[h], torch.sigmoid(C @ C.T + b))
        assert torch.allclose(q_memb[:, h], torch.softmax(mlp(q[:, h]) @ C.T, -1))
        assert torch.allclose(k_memb[:, h], torch.softmax(mlp(k[:, h]) @ C.T, -1))
    # On the simplex; every block entry a probability of its own.
    assert torch.allclose(q_memb.sum(-1), torch.ones(5, 2))
    assert bool(((block > 0) & (block < 1)).all())
    assert not torch.allclose(block.sum((1, 2)), torch.ones(2))


def test_mmsb_exact_values_on_a_tiny_head():
    # k = 2, d = 2: clusters e_1 and e_2 scaled by 2, offset -2, so the
    # block is sigmoid([[2, -2], [-2, 2]]); the MLP passes its input
    # through (identity weights, zero biases, inputs >= 0).
    sbm = StochasticBlockModel(1, 2, 2, parametrization="mmsb")
    with torch.no_grad():
        sbm.weight1.copy_(torch.eye(2)[None])
        sbm.weight2.copy_(torch.eye(2)[None])
        sbm.bias1.zero_()
        sbm.bias2.zero_()
        sbm.clusters.copy_(math.sqrt(2) * torch.eye(2)[None])
        sbm.block_bias.fill_(-2.0)
    x = torch.tensor([[[math.log(3) / math.sqrt(2), 0.0]]])  # logits log 3, 0
    q_memb, block, k_memb = sbm(x, x)
    assert torch.allclose(q_memb, torch.tensor([[[0.75, 0.25]]]))
    s_in, s_out = 0.5, 1 / (1 + math.exp(2.0))  # sigmoid(2 - 2), sigmoid(0 - 2)
    assert torch.allclose(block, torch.tensor([[[s_in, s_out], [s_out, s_in]]]))
    p = float(torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb))
    assert p == pytest.approx(0.75 ** 2 * s_in + 2 * 0.75 * 0.25 * s_out
                              + 0.25 ** 2 * s_in, rel=1e-6)


def test_mmsb_holds_many_dense_blocks_the_paper_cannot():
    # V = 8 blocks, each on its own cluster: one-hot memberships, a block
    # matrix near the identity. The mixed-membership SBM gives every
    # within-block pair p > 0.99 and every cross pair p < 0.01; the paper's
    # form, with the same weights, stays under its cap (within_block_cap:
    # the mean within-block probability for the mean cross probability).
    V, d = 8, 8
    from sbm_pyg.theory import within_block_cap
    for parametrization, within in (("mmsb", 0.99), ("paper", 1 / V)):
        sbm = StochasticBlockModel(1, d, V, parametrization=parametrization)
        with torch.no_grad():
            sbm.weight1.copy_(torch.eye(d)[None])
            sbm.weight2.copy_(torch.eye(d)[None])
            sbm.bias1.zero_()
            sbm.bias2.zero_()
            sbm.clusters.copy_(4 * torch.eye(V)[None])
            if sbm.block_bias is not None:
                sbm.block_bias.fill_(-8.0)
        x = torch.eye(V)[:, None] * 4  # token t points at cluster t
        q_memb, block, k_memb = sbm(x, x)
        p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb)[0].detach()
        if parametrization == "mmsb":
            assert float(p.diagonal().min()) > within
            assert float((p - torch.diag(p.diagonal())).max()) < 0.01
        else:
            cross = float((p.sum() - p.diagonal().sum()) / (V * (V - 1)))
            assert float(p.diagonal().mean()) <= within_block_cap(V, cross)
            assert float(p.diagonal().mean()) > 1.5 * within  # sigmoid overlap


def test_mmsb_state_dict_and_paper_checkpoints():
    # The paper's state dict keeps its keys (checkpoints saved before the
    # parametrization existed load as "paper"); "mmsb" adds the offset.
    paper = StochasticBlockModel(2, 4, 3)
    assert "block_bias" not in paper.state_dict()
    StochasticBlockModel(2, 4, 3).load_state_dict(paper.state_dict())
    mmsb = StochasticBlockModel(2, 4, 3, parametrization="mmsb")
    assert mmsb.state_dict()["block_bias"].shape == (2, 1, 1)
    with pytest.raises(RuntimeError, match="block_bias"):
        mmsb.load_state_dict(paper.state_dict())
    assert repr(mmsb) == ("StochasticBlockModel(heads=2, channels=4, "
                          "num_clusters=3, parametrization='mmsb')")
    with pytest.raises(ValueError, match="parametrization"):
        StochasticBlockModel(2, 4, 3, parametrization="rate")


def test_mmsb_paper_init_draws_as_the_paper_does():
    # The same seed gives the same MLP and clusters under both forms.
    torch.manual_seed(12)
    paper = StochasticBlockModel(2, 8, 16)
    torch.manual_seed(12)
    mmsb = StochasticBlockModel(2, 8, 16, parametrization="mmsb")
    for name in ("weight1", "bias1", "weight2", "bias2", "clusters"):
        assert torch.equal(getattr(paper, name), getattr(mmsb, name)), name


@pytest.mark.parametrize("parametrization", ["paper", "mmsb", "sharp"])
def test_row_chunks_are_the_same_products(monkeypatch, parametrization):
    # The memberships in chunks of 4 rows (the last padded) against one
    # product per head: the same values and gradients (the weights' summed
    # over the chunks), float64.
    from sbm_pyg.nn import block_model
    torch.manual_seed(3)
    sbm = StochasticBlockModel(heads=2, channels=4, num_clusters=3,
                               parametrization=parametrization).double()
    x = torch.randn(10, 2, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(10, 2, 3, dtype=torch.float64)
    results = []
    for chunk in (4, 10):
        monkeypatch.setattr(block_model, "ROW_CHUNK", chunk)
        memb = sbm.membership(x)
        results.append((memb, *torch.autograd.grad(
            (memb * weight).sum(), [x, sbm.weight1, sbm.bias1, sbm.weight2,
                                    sbm.bias2, sbm.clusters])))
    for chunked, whole in zip(*results):
        torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)


def test_sharp_exact_values_on_a_tiny_head():
    # k = 3, d = 3, the MLP passing its input through: query logits
    # (log 4, log 2, 0) at temperature 1 give the softmax (4, 2, 1) / 7, kept
    # on its top two and renormalized: (2/3, 1/3, 0); at temperature
    # e^{log 2} = 2 the logits double: (16, 4, 1) / 21 -> (0.8, 0.2, 0). The
    # key clusters are the query clusters' reversal, and the block is
    # sigmoid(C C'^T + b).
    sbm = StochasticBlockModel(1, 3, 3, parametrization="sharp")
    with torch.no_grad():
        for w in (sbm.weight1, sbm.weight2):
            w.copy_(torch.eye(3)[None])
        sbm.bias1.zero_()
        sbm.bias2.zero_()
        sbm.clusters.copy_(torch.eye(3)[None])
        sbm.key_clusters.copy_(torch.eye(3).flip(0)[None])
        sbm.block_bias.fill_(-1.0)
    x = torch.tensor([[[math.log(4), math.log(2), 0.0]]])
    q_memb, block, k_memb = sbm(x, x)
    torch.testing.assert_close(q_memb, torch.tensor([[[2 / 3, 1 / 3, 0.0]]]))
    # The key clusters reverse the logits: (0, log 2, log 4) -> (0, 1/3, 2/3).
    torch.testing.assert_close(k_memb, torch.tensor([[[0.0, 1 / 3, 2 / 3]]]))
    torch.testing.assert_close(block[0], torch.sigmoid(torch.eye(3).flip(0) - 1.0))
    with torch.no_grad():
        sbm.log_temperature.fill_(math.log(2))
    torch.testing.assert_close(sbm(x, x)[0], torch.tensor([[[0.8, 0.2, 0.0]]]))


def test_sharp_memberships_keep_two_clusters_and_learn_their_temperature():
    torch.manual_seed(2)
    sbm = StochasticBlockModel(2, 8, 16, parametrization="sharp")
    q_memb, block, k_memb = sbm(torch.randn(30, 2, 8), torch.randn(20, 2, 8))
    for memb in (q_memb, k_memb):
        assert ((memb > 0).sum(-1) == 2).all()
        torch.testing.assert_close(memb.sum(-1), torch.ones(memb.shape[:2]))
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb)
    p.mean().backward()
    for name in ("clusters", "key_clusters", "log_temperature", "block_bias",
                 "weight1"):
        assert getattr(sbm, name).grad.abs().sum() > 0, name
    # Its parameters beside the MLP's: the key clusters and the temperature.
    assert set(sbm.state_dict()) - set(StochasticBlockModel(
        2, 8, 16, parametrization="mmsb").state_dict()) == {
        "key_clusters", "log_temperature"}
    assert repr(sbm).endswith("parametrization='sharp')")


def test_sharp_memberships_are_the_renormalized_top_of_the_softmax():
    # Values and gradients: the kept logits' softmax is the full softmax
    # kept on the top two and renormalized.
    from sbm_pyg.nn.block_model import _top
    logits = torch.randn(40, 3, 16, dtype=torch.float64, generator=seeded(0))
    weight = torch.randn(40, 3, 16, dtype=torch.float64, generator=seeded(1))

    def reference(x):
        memb = x.softmax(-1)
        top = memb.topk(2, dim=-1)
        kept = torch.zeros_like(memb).scatter(-1, top.indices, top.values)
        return kept / kept.sum(-1, keepdim=True)

    grads = []
    for fn in (_top, reference):
        x = logits.clone().requires_grad_()
        out = fn(x)
        (out * weight).sum().backward()
        grads.append((out.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-15)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-14)


def test_sharp_init_draws_its_clusters_wide():
    # N(0, 0.3^2) for the query and the key clusters (the library's other
    # forms start at the kaiming std, about 0.02 here).
    torch.manual_seed(0)
    sbm = StochasticBlockModel(4, 32, 128, parametrization="sharp")
    for c in (sbm.clusters, sbm.key_clusters):
        n = c.numel()
        std = float(c.detach().pow(2).mean().sqrt())
        assert abs(std / 0.3 - 1) < z_bound(1) * math.sqrt(1 / (2 * n))
    assert float(sbm.log_temperature.abs().max()) == 0.0


@pytest.mark.parametrize("parametrization", ["paper", "mmsb", "sharp"])
@pytest.mark.parametrize("density", [0.25, 0.01, 6.4e-4])
def test_density_start(parametrization, density):
    # The expected density of a fresh SBM started at `density`, on queries
    # and keys of std 0.5 and 1.5 (a layer's projections of unit features
    # have about 0.6), every head. Measured over 6 seeds and these
    # densities: "paper" 0.984-1.069 of it, "mmsb" 1 to 1e-5, "sharp"
    # 1.07-1.54 (its top clusters favour the block's larger entries).
    from sbm_pyg.nn.block_model import expected_densities
    bounds = dict(paper=(0.975, 1.1), mmsb=(1 - 1e-4, 1 + 1e-4), sharp=(1.0, 1.8))
    torch.manual_seed(0)
    sbm = StochasticBlockModel(heads=2, channels=32, num_clusters=128,
                               parametrization=parametrization, density=density)
    ptr = torch.tensor([0, 2048])
    for scale in (0.5, 1.5):
        q, k = (scale * torch.randn(2048, 2, 32, generator=seeded(s)) for s in (1, 2))
        ratio = expected_densities(ptr, ptr, *sbm(q, k))[0] / density
        low, high = bounds[parametrization]
        assert bool(((ratio > low) & (ratio < high)).all()), ratio
    assert f"density={density:g}" in repr(sbm)


def test_density_start_refuses_bad_values():
    for bad in (0, 1, 1.5, -0.1, True, "0.1", float("nan")):
        with pytest.raises(ValueError, match="density must be a number in"):
            StochasticBlockModel(2, 8, 4, density=bad)
    with pytest.raises(ValueError, match="or a density, not both"):
        StochasticBlockModel(2, 8, 4, init="dense", density=0.1)
