"""fastrg on the mixed-membership SBM's factors (memberships on the simplex,
block entries in (0, 1) on their own, a block that does not sum to 1): the
marginals on every backend, and the Triton graph equal to the C++ one."""
import pytest
import torch

from sbm_pyg import sampling
from sbm_pyg.nn import StochasticBlockModel
from sbm_pyg.sampling import fastrg_op
from tests.helpers import max_binomial_z, seeded, z_bound
from tests.markers import needs_cpp, needs_triton
from tests.sampling.cases import pair_counts, repeated


def mmsb_factors(dtype=torch.float64):
    """A fixed mixed-membership head (drawn on the CPU, whatever the seed
    offset): 6 queries, 5 keys, 2 heads, 4 clusters; head 1's block has an
    offset of 1, head 0's of -5: rates from 0.14 to 0.91."""
    torch.manual_seed(0)
    sbm = StochasticBlockModel(2, 4, 4, parametrization="mmsb")
    with torch.no_grad():
        sbm.clusters.mul_(4)  # spread the memberships and the block
        sbm.block_bias.copy_(torch.tensor([-5.0, 1.0]).view(2, 1, 1))
        x = torch.randn(11, 2, 4, generator=torch.Generator().manual_seed(1),
                        device="cpu").to(sbm.clusters.device)
        q_memb, block, k_memb = sbm(x[:6], x[6:])
    device = torch.get_default_device()
    return tuple(t.to(dtype).to(device) for t in (q_memb, block, k_memb))


def test_the_factors_are_mixed_membership_ones():
    q, b, k = mmsb_factors()
    assert torch.allclose(q.sum(-1), torch.ones_like(q[..., 0]))
    assert float(b.sum((1, 2)).min()) > 3  # no unit mass
    p = sampling.expected_adjacency(q, b, k, mode="exact")
    assert 0.05 < float(p[0].mean()) < 0.5 < float(p[1].mean()) < 1


@pytest.mark.many_draws
@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_marginals_on_every_backend(sample, mode):
    trials = 2000
    q, b, k = mmsb_factors()
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=trials)
    graph = sample(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, mode=mode,
                   exploration=0.01, generator=seeded(3))
    counts = pair_counts(graph, q.size(0), k.size(0))
    prob = sampling.expected_adjacency(q, b, k, mode=mode, exploration=0.01)
    assert max_binomial_z(counts, trials, prob) < z_bound(prob.numel())
    # Power: the same test rejects the rates a tenth lower.
    assert max_binomial_z(counts, trials, prob * 0.9) > z_bound(prob.numel())


@needs_cpp
@needs_triton
@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_triton_gives_the_cpp_graph(mode, monkeypatch):
    monkeypatch.setattr(fastrg_op, "stream_seed", lambda *_: 2**61 + 777)
    q, b, k = (t.cpu() for t in mmsb_factors())
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=12)
    kwargs = dict(ptr_q=ptr_q, ptr_k=ptr_k, mode=mode, exploration=0.01)
    ref = sampling.fastrg(qq, b, kk, backend="cpp", **kwargs)
    out = sampling.fastrg(qq, b, kk, backend="triton", **kwargs)
    assert ref.num_edges > 100
    for name in ("edge_index", "head", "rowptr", "perm", "colptr"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), name
