import pytest
import torch

from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.warmup import dense_warmup
from tests.helpers import seeded


def _warm_conv(**kwargs):
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=1.0, **kwargs)
    conv.attend_all = True
    return conv.train()


@pytest.mark.parametrize("kwargs", [
    dict(), dict(dropout=0.3), dict(distill_edges=0.5, concat=False),
    dict(sbm_parametrization="mmsb", dropout=0.2),
    dict(sbm_parametrization="mmsb", sink=True),
    dict(sbm_parametrization="mmsb", distill_recall=2.0, sink=True)])
def test_dense_warmup_equals_the_graph_of_every_pair(kwargs):
    # The same layer, the same seed: the dense products (no one asks for
    # the graph) against sbm_attention on the graph of every pair (asked
    # for by return_attention_weights). Output, distillation, densities,
    # every parameter's gradient and the generator's state afterwards.
    conv = _warm_conv(**kwargs)
    if conv.sink is not None:  # the sink's column in the dense softmax
        with torch.no_grad():
            conv.sink.copy_(torch.tensor([0.5, -0.3]))
    x = torch.randn(13, 8, generator=seeded(3))
    batch = torch.tensor([0] * 4 + [1] + [2] * 8)  # ragged, one of length 1
    results = []
    for graph in (False, True):
        gen = seeded(5)
        out = conv(x, batch, generator=gen, return_attention_weights=graph)
        out = out[0] if graph else out
        assert conv.last_backends["attention"] != "warm-up" or not graph
        loss = out.square().sum() + conv.distillation.sum()
        grads = torch.autograd.grad(loss, list(conv.parameters()),
                                    allow_unused=True)
        results.append((out, conv.distillation, conv.expected_density,
                        conv.sampled_density, grads,
                        torch.randint(2**30, (1,), generator=gen)))
    assert conv.last_backends != {"sampler": "dense", "attention": "warm-up"}
    fast, ref = results
    for a, b in zip(fast[:4], ref[:4]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    scale = max(1.0, *(float(g.abs().max()) for g in ref[4] if g is not None))
    for (name, _), a, b in zip(conv.named_parameters(), fast[4], ref[4]):
        assert (a is None) == (b is None), name
        if a is not None:
            # float32 sums in two orders: an entry that cancels to ~0 (the
            # key bias's, where only the softmax sees it) keeps an error of
            # the size of the terms, which the largest gradient bounds.
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * scale)
    assert torch.equal(fast[5], ref[5])  # the same draws taken
    assert torch.equal(fast[3], torch.ones(2))


def test_dense_warmup_runs_only_in_a_training_warm_up():
    conv = _warm_conv()
    x = torch.randn(6, 8, generator=seeded(1))
    conv(x, generator=seeded(0))  # one sequence: no batch or ptr
    assert conv.last_backends == {"sampler": "dense", "attention": "warm-up"}
    conv.eval()
    conv(x, generator=seeded(0))
    assert conv.last_backends["attention"] != "warm-up"
    conv.train()
    conv.attend_all = False
    conv(x, generator=seeded(0))
    assert conv.last_backends["attention"] != "warm-up"


def test_dense_warmup_exact_values():
    # One head, D = 1, one sequence of two: scores q_i k_j, softmax rows;
    # k = 1 cluster (p_ij = q_i S k_j, a constant row share of 1/2).
    q = torch.tensor([[[1.0]], [[2.0]]])
    k = torch.tensor([[[0.0]], [[1.0]]])
    v = torch.tensor([[[1.0]], [[3.0]]])
    memb = torch.ones(2, 1, 1)
    block = torch.full((1, 1, 1), 0.5)
    ptr = torch.tensor([0, 2])
    out, distill, expected, sampled = dense_warmup(q, k, v, memb, block, memb,
                                                   ptr, ptr)
    a = torch.softmax(torch.tensor([[0.0, 1.0], [0.0, 2.0]]), -1)
    torch.testing.assert_close(out[:, 0, 0], a @ torch.tensor([1.0, 3.0]))
    # Each row's SBM distribution is uniform over its 2 keys: the
    # cross-entropy from any row of weights is log 2.
    assert distill.item() == pytest.approx(0.6931472, rel=1e-6)
    assert expected.item() == pytest.approx(0.5) and sampled.item() == 1.0


def test_dense_warmup_without_distillation_and_its_memory_guard(monkeypatch):
    q = torch.randn(6, 2, 4)
    memb = torch.rand(6, 2, 3)
    block = torch.rand(2, 3, 3)
    ptr = torch.tensor([0, 6])
    out, distill, _, _ = dense_warmup(q, q, q, memb, block, memb, ptr, ptr,
                                      distill=False)
    assert distill is None and out.shape == (6, 2, 4)
    # Refused before its [G, H, n, n] tensors are allocated.
    import sbm_pyg.validation as validation
    monkeypatch.setattr(validation, "available_memory", lambda device: 1000.0)
    with pytest.raises(ValueError, match="dense warm-up step over 1 sequence"):
        dense_warmup(q, q, q, memb, block, memb, ptr, ptr)
