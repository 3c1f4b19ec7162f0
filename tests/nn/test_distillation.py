"""Attention distillation: exact values on a tiny graph, its gradient, and
the same loss from every attention kernel."""
import math

import pytest
import torch

from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import (
    SBMConv,
    SBMMultiheadAttention,
    attention_distillation,
    distillation_loss,
    edge_fit,
    recall_fit,
    sbm_attention,
)
from sbm_pyg.nn.distillation import DISTILL_SMOOTHING
from sbm_pyg.ops import backend_info
from sbm_pyg.sampling import SampledGraph
from tests.helpers import seeded
from tests.markers import needs_triton_installed


def tiny():
    # One head, k = 1 (so S = 1 and p_ij = q_i k_j): sequence 0 has three
    # queries and keys, sequence 1 one of each.
    q = torch.tensor([1.0, 0.5, 0.3, 0.8], dtype=torch.float64).view(4, 1, 1)
    k = torch.tensor([0.5, 0.25, 0.25, 0.5], dtype=torch.float64).view(4, 1, 1)
    block = torch.ones(1, 1, 1, dtype=torch.float64)
    # (key, query) edges: query 0 <- keys 0, 1; query 1 <- key 2; query 2
    # none; query 3 <- key 3.
    edges = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 3]])
    graph = SampledGraph.from_edge_index(edges, 4, 4, ptr_q=[0, 3, 4],
                                         ptr_k=[0, 3, 4])
    alpha = torch.tensor([0.75, 0.25, 1.0, 1.0], dtype=torch.float64)
    return alpha, q, block, k, graph


def test_exact_value_on_a_tiny_graph():
    alpha, q, block, k, graph = tiny()
    got = attention_distillation(alpha, q, block, k, graph)
    # Row 0: p = (0.5, 0.25) on its edges, 1.0 over its sequence's keys;
    # row 1: p = 0.125 of 0.5; row 3: p = 0.4 of 0.4; row 2 has no edge.
    rows = [math.log(1.0) - (0.75 * math.log(0.5) + 0.25 * math.log(0.25)),
            math.log(0.5) - math.log(0.125),
            math.log(0.4) - math.log(0.4)]
    assert got.shape == (1,)
    assert got.item() == pytest.approx(sum(rows) / 3, rel=1e-12)


def test_exact_value_with_smoothing():
    alpha, q, block, k, graph = tiny()
    got = attention_distillation(alpha, q, block, k, graph, smoothing=0.1)
    # Each target is 0.9 x the SBM's share of its row + 0.1 / (keys of the
    # sequence): row 0 has shares 0.5, 0.25 of 3 keys, row 1 0.25 of 3,
    # row 3 all of its one key.
    third = 0.1 / 3
    rows = [-(0.75 * math.log(0.45 + third) + 0.25 * math.log(0.225 + third)),
            -math.log(0.225 + third),
            -math.log(0.9 + 0.1)]
    assert got.item() == pytest.approx(sum(rows) / 3, rel=1e-12)
    # The SBM's scale does not matter.
    scaled = attention_distillation(alpha, q, block * 0.01, k, graph,
                                    smoothing=0.1)
    assert scaled.item() == pytest.approx(got.item(), rel=1e-12)


def test_smallest_where_the_sbm_follows_the_attention():
    # Query 0 of the tiny graph with every key: where the SBM's row is the
    # weights, the loss is their entropy (KL 0); any other SBM row gives
    # more (Gibbs' inequality).
    alpha, q, block, k, graph = tiny()
    q, k = q[:3], k[:3]
    one = SampledGraph.from_edge_index(torch.tensor([[0, 1, 2], [0, 0, 0]]),
                                       3, 3)
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)  # = k / sum(k)
    at_w = attention_distillation(w, q, block, k, one)
    assert at_w.item() == pytest.approx(-(w * w.log()).sum().item(), rel=1e-12)
    for other in ([0.9, 0.05, 0.05], [0.2, 0.4, 0.4], [1 / 3] * 3):
        keys = torch.tensor(other, dtype=torch.float64).view(3, 1, 1)
        assert attention_distillation(w, q, block, keys, one).item() > at_w.item()


def test_per_head_and_the_weights_are_not_differentiated():
    g = seeded(0)
    N, H, k = 7, 3, 4
    memb = torch.rand(N, H, k, generator=g, dtype=torch.float64)
    block = torch.softmax(torch.randn(H, k * k, generator=g,
                                      dtype=torch.float64), -1).view(H, k, k)
    res = sbm_attention(*(torch.randn(N, H, 2, generator=g,
                                      dtype=torch.float64) for _ in "qkv"),
                        (memb, block, memb), return_attention_weights=True,
                        generator=g)
    alpha = res.alpha.clone().requires_grad_()
    loss = attention_distillation(alpha, memb, block, memb, res.graph)
    assert loss.shape == (H,)
    assert not loss.requires_grad  # memberships without grad, alpha detached
    # Each head's loss is that head's graph alone.
    for h in range(H):
        keys = res.graph.edge_index  # (key, query) of every head
        own = res.graph.head == h
        sub = SampledGraph.from_edge_index(keys[:, own], N, N)
        one = attention_distillation(res.alpha[own], memb[:, h:h + 1],
                                     block[h:h + 1], memb[:, h:h + 1], sub)
        torch.testing.assert_close(loss[h:h + 1], one)


def test_gradient_check():
    g = seeded(1)
    N, H, k = 6, 2, 3
    ptr = torch.tensor([0, 2, 6])
    q = torch.rand(N, H, k, generator=g, dtype=torch.float64)
    kk = torch.rand(N, H, k, generator=g, dtype=torch.float64)
    block = torch.softmax(torch.randn(H, k * k, generator=g,
                                      dtype=torch.float64), -1).view(H, k, k)
    res = sbm_attention(*(torch.randn(N, H, 2, generator=g,
                                      dtype=torch.float64) for _ in "qkv"),
                        (q, block * 2, kk), ptr_q=ptr, ptr_k=ptr,
                        return_attention_weights=True, generator=g)
    assert res.graph.num_edges > 4
    leaves = [t.clone().requires_grad_() for t in (q, block, kk)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: attention_distillation(res.alpha, a, b, c, res.graph,
                                               smoothing=0.05),
        leaves)


def test_bad_input_is_named():
    alpha, q, block, k, graph = tiny()
    with pytest.raises(ValueError, match="alpha"):
        attention_distillation(alpha[:2], q, block, k, graph)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="smoothing"):
            attention_distillation(alpha, q, block, k, graph, smoothing=bad)
    with pytest.raises(ValueError, match="distill"):
        SBMConv(4, 2, distill=-0.1)


def _layer_call(backend, distill, seed=3, sbm_init="paper", ste="paper"):
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=distill,
                   sbm_init=sbm_init, attention_backend=backend, ste=ste)
    x = torch.randn(19, 8, generator=seeded(2))
    batch = torch.tensor([0] * 7 + [1] * 12)
    out = conv(x, batch, generator=seeded(seed))
    loss = out.square().sum() + distillation_loss(conv)
    grads = torch.autograd.grad(loss, list(conv.sbm.parameters()))
    return out, conv.distillation, grads


@pytest.mark.parametrize("ste", ["paper", "published"])
@pytest.mark.parametrize("backend", [
    "cpp", "message_passing",
    pytest.param("triton", marks=needs_triton_installed)])
def test_every_kernel_gives_the_same_loss_and_gradient(backend, ste):
    if backend == "cpp" and not backend_info.backends()["attention"] == "cpp" \
            and torch.get_default_device().type == "cpu":
        pytest.skip("no compiled extension")
    if backend == "cpp" and torch.get_default_device().type != "cpu":
        pytest.skip("the C++ kernels take CPU tensors (Triton's case runs here)")
    # The estimator's gradient and the distillation's add up in the SBM.
    ref = _layer_call("torch", 0.5, ste=ste)
    got = _layer_call(backend, 0.5, ste=ste)
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1])
    for a, b in zip(got[2], ref[2]):
        torch.testing.assert_close(a, b)


def test_the_dense_regime_distils_too():
    # attend_all samples every pair in either regime, so the dense kernel's
    # graph (read off its mask, its weights from the sparse kernel) and the
    # sampler's agree.
    if not backend_info.dense_runs(torch.get_default_device()):
        pytest.skip("no dense-regime kernel on this device")
    torch.manual_seed(0)
    x = torch.randn(9, 8, generator=seeded(4))
    res = {}
    for backend in ("dense", "torch"):
        torch.manual_seed(0)
        conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=1.0,
                       attention_backend=backend)
        conv.attend_all = True
        conv(x, generator=seeded(5))
        assert conv.sampled_density.tolist() == [1.0, 1.0]
        grads = torch.autograd.grad(distillation_loss(conv),
                                    list(conv.sbm.parameters()))
        res[backend] = (conv.distillation, grads, conv.last_backends)
    assert res["dense"][2]["sampler"] == "dense"
    # A loss that moves the SBM: its gradient is not zero.
    assert all(bool((g != 0).any()) for g in res["torch"][1])
    torch.testing.assert_close(res["dense"][0], res["torch"][0])
    for a, b in zip(res["dense"][1], res["torch"][1]):
        torch.testing.assert_close(a, b)


def test_distill_leaves_the_forward_as_it_is():
    # The same draws with and without distillation: the loss is an extra,
    # computed from the weights the kernel returns.
    for backend in ("auto", "torch"):
        a = _layer_call(backend, 0.0)
        b = _layer_call(backend, 0.5)
        torch.testing.assert_close(a[0], b[0])
        assert a[1] is None and b[1] is not None


def test_computed_in_training_only_and_summed_over_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        SBMMultiheadAttention(8, heads=2, head_channels=4, num_clusters=3,
                              distill=0.5),
        SBMMultiheadAttention(8, heads=2, head_channels=4, num_clusters=3,
                              distill=2.0),
        SBMMultiheadAttention(8, heads=2, head_channels=4, num_clusters=3))
    x = torch.randn(2, 5, 8, generator=seeded(0))
    model(x)
    first, second = (m.distillation for m in model[:2])
    assert model[2].distillation is None
    torch.testing.assert_close(distillation_loss(model),
                               0.5 * first.mean() + 2.0 * second.mean())
    model.eval()
    model(x)
    assert all(m.distillation is None for m in model)
    assert distillation_loss(model).item() == 0.0
    assert "distill=0.5" in repr(model[0].conv)
    # It teaches the SBMs only: the queries and keys are its target.
    model.train()
    model(x)
    conv = model[0].conv
    grads = torch.autograd.grad(
        distillation_loss(model), [conv.lin_query.weight, conv.lin_key.weight,
                                   conv.sbm.clusters], allow_unused=True)
    assert grads[0] is None and grads[1] is None
    assert bool((grads[2] != 0).any())


def test_the_model_reports_it_per_layer_and_head():
    torch.manual_seed(0)
    model = SBMTransformer(10, 8, channels=8, num_layers=2, heads=2,
                           num_clusters=3, distill=0.25)
    out = model(torch.randint(1, 10, (3, 8), generator=seeded(1)))
    assert out.distillation.shape == (2, 2)
    torch.testing.assert_close(out.distill_loss,
                               0.25 * out.distillation.mean(1).sum())
    plain = SBMTransformer(10, 8, channels=8, num_clusters=3)
    result = plain(torch.randint(1, 10, (3, 8), generator=seeded(1)))
    assert result.distillation is None and result.distill_loss.item() == 0.0


def test_attend_all_samples_every_pair_and_passes_no_estimator_gradient():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=0.5)
    conv.attend_all = True
    x = torch.randn(10, 8, generator=seeded(2))
    batch = torch.tensor([0] * 4 + [1] * 6)
    out = conv(x, batch, generator=seeded(3))
    assert conv.sampled_density.tolist() == [1.0, 1.0]
    sbm = list(conv.sbm.parameters())
    # The task's loss reaches the SBM only through the estimator: none here.
    task = torch.autograd.grad(out.square().sum(), sbm, allow_unused=True)
    assert all(g is None or bool((g == 0).all()) for g in task)
    # The distillation and the density still teach it, and neither pulls
    # at the queries and keys.
    out = conv(x, batch, generator=seeded(3))
    side = distillation_loss(conv) + conv.expected_density.sum()
    taught = torch.autograd.grad(side, sbm, retain_graph=True)
    assert any(bool((g != 0).any()) for g in taught)
    pulled = torch.autograd.grad(side, [conv.lin_query.weight,
                                        conv.lin_key.weight], allow_unused=True)
    assert pulled == (None, None)
    # Without attend_all, the estimator's gradient is back.
    conv.attend_all = False
    out = conv(x, batch, generator=seeded(3))
    back = torch.autograd.grad(out.square().sum(), sbm, allow_unused=True)
    assert any(g is not None and bool((g != 0).any()) for g in back)


def test_the_layer_distils_its_own_weights_and_graph():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=0.5)
    x = torch.randn(11, 8, generator=seeded(6))
    batch = torch.tensor([0] * 5 + [1] * 6)
    _, (graph, alpha) = conv(x, batch, return_attention_weights=True,
                             generator=seeded(7))
    H, C = conv.heads, conv.out_channels
    query = conv.lin_query(x).view(-1, H, C)
    key = conv.lin_key(x).view(-1, H, C)
    expected = attention_distillation(alpha, *conv.sbm(query, key), graph,
                                      smoothing=DISTILL_SMOOTHING)
    torch.testing.assert_close(conv.distillation, expected)


def test_edge_fit_exact_value_on_a_tiny_graph():
    alpha, q, block, k, graph = tiny()
    got = edge_fit(alpha, q, block, k, graph)
    # Targets min(1, alpha * degree): row 0 (2 edges) 1.5 -> 1 and 0.5,
    # row 1 (1 edge) 1, row 3 (1 edge) 1; p = 0.5, 0.25, 0.125, 0.4.
    terms = [-math.log(0.5), -(0.5 * math.log(0.25) + 0.5 * math.log(0.75)),
             -math.log(0.125), -math.log(0.4)]
    assert got.shape == (1,)
    assert got.item() == pytest.approx(sum(terms) / 4, rel=1e-12)
    # Smallest where the SBM gives the used edges p = 1 and the unused 0.
    assert edge_fit(torch.tensor([1.0, 0.0]), torch.eye(2)[:, None],
                    torch.eye(2)[None], torch.eye(2)[:, None],
                    SampledGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]),
                                                 2, 2)).item() < 1e-5


def test_edge_fit_per_head_gradient_and_bad_input():
    torch.manual_seed(1)
    q = torch.rand(6, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.rand(6, 2, 3, dtype=torch.float64)
    block = torch.rand(2, 3, 3, dtype=torch.float64) * 0.2
    block[1] *= 4  # head 1 denser
    from sbm_pyg.sampling import fastrg
    graph = fastrg(q.detach(), block, k, mode="exact", exploration=0.3,
                   generator=seeded(2))
    E = graph.num_edges
    alpha = torch.rand(E, dtype=torch.float64, requires_grad=True)
    out = edge_fit(alpha, q, block, k, graph)
    assert out.shape == (2,) and bool((out > 0).all())
    # Each head's mean over its own edges, written out.
    rows = graph.csr.row().long()
    deg = graph.csr.rowptr.diff()[rows].double()
    target = (alpha.detach() * deg).clamp(max=1)
    from sbm_pyg.nn.functional import edge_probability
    eps = torch.finfo(torch.float64).eps  # p >= 1 on some edges: clamped
    p = edge_probability(q, block, k, graph).detach().clamp(eps, 1 - eps)
    assert float(p.max()) == 1 - eps
    bce = -(target * p.log() + (1 - target) * (1 - p).log())
    for h in range(2):
        mine = rows // 6 == h
        assert out[h].item() == pytest.approx(bce[mine].mean().item(), rel=1e-9)
    torch.autograd.gradcheck(lambda q_: edge_fit(alpha, q_, block, k, graph),
                             (q,))
    out.sum().backward()
    assert alpha.grad is None  # the weights are targets, not differentiated
    with pytest.raises(ValueError, match="alpha"):
        edge_fit(alpha[:3], q, block, k, graph)


def test_recall_fit_exact_value_on_a_tiny_graph():
    alpha, q, block, k, graph = tiny()
    got = recall_fit(alpha, q, block, k, graph)
    # p = 0.5, 0.25 on row 0's edges, 0.125 on row 1's, 0.4 on row 3's; row 2
    # has no edge and does not count.
    missed = [1 - (0.75 * 0.5 + 0.25 * 0.25), 1 - 0.125, 1 - 0.4]
    assert got.shape == (1,)
    assert got.item() == pytest.approx(sum(missed) / 3, rel=1e-12)
    # A probability above one counts as one, with no gradient through it.
    q2 = (q * 5).requires_grad_()  # row 0's p = 2.5 and 1.25 on its edges
    got = recall_fit(alpha, q2, block, k, graph)
    missed = [0.0, 1 - 0.625, 1 - 1.0]  # row 3: p = 2 -> 1
    assert got.item() == pytest.approx(sum(missed) / 3, rel=1e-12)
    got.sum().backward()
    assert q2.grad[[0, 3]].abs().max() == 0 and q2.grad[1].item() < 0


def test_recall_fit_per_head_gradient_and_bad_input():
    torch.manual_seed(1)
    q = torch.rand(6, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.rand(6, 2, 3, dtype=torch.float64)
    block = torch.rand(2, 3, 3, dtype=torch.float64) * 0.2
    from sbm_pyg.nn.functional import edge_probability
    from sbm_pyg.sampling import fastrg
    graph = fastrg(q.detach(), block, k, mode="exact", exploration=0.3,
                   generator=seeded(2))
    alpha = torch.rand(graph.num_edges, dtype=torch.float64, requires_grad=True)
    out = recall_fit(alpha, q, block, k, graph)
    rows = graph.csr.row().long()
    p = edge_probability(q, block, k, graph).detach()
    assert float(p.max()) < 1  # every edge inside the clip: a smooth loss
    for h in range(2):  # each head's mean over its rows with an edge
        mine = rows // 6 == h
        kept = torch.zeros(6, dtype=torch.float64).index_add_(
            0, rows[mine] % 6, alpha.detach()[mine] * p[mine])
        used = torch.zeros(6, dtype=torch.bool)
        used[rows[mine] % 6] = True
        assert out[h].item() == pytest.approx((1 - kept[used]).mean().item(),
                                              rel=1e-12)
    torch.autograd.gradcheck(lambda q_: recall_fit(alpha, q_, block, k, graph),
                             (q,))
    out.sum().backward()
    assert alpha.grad is None
    with pytest.raises(ValueError, match="alpha"):
        recall_fit(alpha[:3], q, block, k, graph)


@pytest.mark.parametrize("option,fit", [("distill_edges", edge_fit),
                                        ("distill_recall", recall_fit)])
def test_the_layer_adds_its_fits_to_its_distillation(option, fit):
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, distill=0.5,
                   sbm_parametrization="mmsb", **{option: 2.0})
    x = torch.randn(11, 8, generator=seeded(6))
    batch = torch.tensor([0] * 5 + [1] * 6)
    _, (graph, alpha) = conv(x, batch, return_attention_weights=True,
                             generator=seeded(7))
    H, C = conv.heads, conv.out_channels
    memb = conv.sbm(conv.lin_query(x).view(-1, H, C),
                    conv.lin_key(x).view(-1, H, C))
    expected = (attention_distillation(alpha, *memb, graph,
                                       smoothing=DISTILL_SMOOTHING)
                + 2.0 * fit(alpha, *memb, graph))
    torch.testing.assert_close(conv.distillation, expected)
    with pytest.raises(ValueError, match=option):
        SBMConv(8, 4, **{option: -1.0})
