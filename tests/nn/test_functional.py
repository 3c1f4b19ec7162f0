import math

import pytest
import torch

from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg.sampling import SampledGraph, fastrg
from tests.helpers import seeded
from tests.markers import needs_cpp

NQ, NK, H, K, D = 7, 6, 2, 3, 4
PTR_Q, PTR_K = [0, 3, 7], [0, 2, 6]


def sbm(seed=0):
    g = seeded(seed)
    q = torch.rand(NQ, H, K, generator=g, dtype=torch.float64)
    k = torch.rand(NK, H, K, generator=g, dtype=torch.float64)
    b = torch.rand(H, K, K, generator=g, dtype=torch.float64) * 0.15
    return q, b, k


@pytest.fixture
def graph() -> SampledGraph:
    # Built by a fixed rule, not drawn: it must exercise queries without
    # edges and with several whatever the generator's stream.
    keys = [(h * NQ + i) * NK + j
            for h in range(H) for g in range(2)
            for i in range(PTR_Q[g], PTR_Q[g + 1])
            for j in range(PTR_K[g], PTR_K[g + 1])
            if (h + 2 * i + 3 * j) % 4 != 0 and (h, i) != (0, 4)]
    graph = SampledGraph.from_keys(torch.tensor(keys), H, NQ, NK,
                                   ptr_q=PTR_Q, ptr_k=PTR_K)
    degree = graph.rowptr.diff()
    assert bool((degree == 0).any()) and bool((degree > 1).any())
    return graph


def qkv(seed=2, dtype=torch.float64):
    g = seeded(seed)
    return [torch.randn(n, H, D, generator=g, dtype=dtype).requires_grad_()
            for n in (NQ, NK, NK)]


def dense_mask(graph):
    mask = torch.zeros(H, NQ, NK, dtype=torch.bool)
    mask[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    return mask


def dense_attention(q, k, v, mask, mask_values=None):
    """Masked softmax attention with n x n scores (reference)."""
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    if mask_values is not None:  # a = s * m, the STE's continuous mask
        scores = scores * mask_values
    scores = scores.masked_fill(~mask, float("-inf"))
    alpha = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty rows -> 0
    return torch.einsum("hij,jhd->ihd", alpha, v)


def test_matches_dense_masked_attention(graph):
    q, k, v = qkv()
    out = sparse_attention(q, k, v, graph)
    ref = dense_attention(q, k, v, dense_mask(graph))
    assert torch.allclose(out, ref, atol=1e-10)
    empty = graph.rowptr.diff().view(H, NQ).t() == 0  # [NQ, H]
    assert torch.all(out[empty] == 0)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-10)


def test_gradcheck(graph):
    assert torch.autograd.gradcheck(
        lambda q, k, v: sparse_attention(q, k, v, graph), qkv())


def test_gradcheck_with_dropout(graph):
    # A re-seeded generator makes the dropout mask a fixed function.
    def fn(q, k, v):
        return sparse_attention(q, k, v, graph, dropout=0.4, training=True,
                                generator=seeded(3))
    assert torch.autograd.gradcheck(fn, qkv())
    q, k, v = qkv()
    plain = sparse_attention(q, k, v, graph)
    assert not torch.allclose(fn(q, k, v), plain)
    assert torch.equal(sparse_attention(q, k, v, graph, dropout=0.4), plain)


def test_straight_through_estimator(graph):
    q, k, v = qkv()
    weight = torch.randn(NQ, H, D, dtype=torch.float64)
    prob = torch.rand(graph.num_edges, dtype=torch.float64, requires_grad=True)
    out = sparse_attention(q, k, v, graph, edge_prob=prob)
    (out * weight).sum().backward()
    # Reference: dL/da_e by autograd through dense scores a = s * m at m = 1,
    # and the STE's dL/dp_e = dL/da_e * s_e.
    mask = dense_mask(graph)
    m = torch.ones(H, NQ, NK, dtype=torch.float64, requires_grad=True)
    ref = dense_attention(q, k, v, mask, mask_values=m)
    (ref * weight).sum().backward()
    h, i, j = graph.head, graph.edge_index[1], graph.edge_index[0]
    assert torch.allclose(prob.grad, m.grad[h, i, j], atol=1e-10)
    scores = (q[i, h] * k[j, h]).sum(-1) / math.sqrt(D)
    a = (torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)).detach().requires_grad_()
    alpha = torch.softmax(a.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    (torch.einsum("hij,jhd->ihd", alpha, v) * weight).sum().backward()
    assert torch.allclose(prob.grad, a.grad[h, i, j] * scores.detach(), atol=1e-10)
    # The forward value does not depend on the probabilities.
    assert torch.equal(out, sparse_attention(q, k, v, graph))


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_published_straight_through_estimator(graph, scale):
    # The published code's dense path: the full softmax times a mask M,
    # renormalized per row; M's gradient at the sampled edges, clipped to
    # [-1, 1], is what it hands the probabilities. scale=30 makes some
    # gradients exceed 1, so the clip is exercised.
    q, k, v = qkv()
    weight = torch.randn(NQ, H, D, dtype=torch.float64) * scale
    prob = torch.rand(graph.num_edges, dtype=torch.float64, requires_grad=True)
    out = sparse_attention(q, k, v, graph, edge_prob=prob, ste="published")
    (out * weight).sum().backward()
    m = dense_mask(graph).double().requires_grad_()
    full = torch.softmax(torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D), -1)
    masked = full * m
    alpha = (masked / masked.sum(-1, keepdim=True)).nan_to_num(0.0)
    ref = torch.einsum("hij,jhd->ihd", alpha, v)
    assert torch.allclose(out, ref, atol=1e-10)
    (ref * weight).sum().backward()
    h, i, j = graph.head, graph.edge_index[1], graph.edge_index[0]
    raw = m.grad[h, i, j]
    assert torch.allclose(prob.grad, raw.clamp(-1, 1), atol=1e-10)
    if scale > 1:  # the clip is exercised
        assert bool((raw.abs() > 1).any())
    # Per query, the unclipped gradients sum to zero; the paper's do not.
    rows = graph.csr.row().long()
    assert torch.allclose(torch.zeros(H * NQ, dtype=torch.float64).index_add(
        0, rows, raw), torch.zeros(H * NQ, dtype=torch.float64), atol=1e-10)


def test_edge_probability(graph):
    q, b, k = sbm()
    p = edge_probability(q, b, k, graph)
    dense = torch.einsum("ihu,huv,jhv->hij", q, b, k)
    assert torch.allclose(p, dense[graph.head, graph.edge_index[1], graph.edge_index[0]])
    assert torch.autograd.gradcheck(
        lambda a, c, e: edge_probability(a, c, e, graph),
        (q.requires_grad_(), b.requires_grad_(), k.requires_grad_()))


def teststraight_through_probability_has_the_gradients_of_edge_probability(graph):
    # SBMConv's straight-through path skips the forward product: its values
    # are placeholders, its gradients those of edge_probability.
    from sbm_pyg.nn.functional import straight_through_probability
    q, b, k = sbm()
    weight = torch.randn(graph.num_edges, dtype=torch.float64,
                         generator=seeded(0))
    grads = []
    for fn in (edge_probability, straight_through_probability):
        inputs = [t.detach().clone().requires_grad_() for t in (q, b, k)]
        (fn(*inputs, graph) * weight).sum().backward()
        grads.append([t.grad for t in inputs])
    assert graph.num_edges > 0
    for ref, out in zip(*grads):
        assert torch.allclose(out, ref, atol=1e-12) and bool(ref.abs().sum() > 0)


def test_zero_edges_give_zeros_not_nan():
    q, b, k = sbm()
    graph = fastrg(q, torch.zeros_like(b), k, ptr_q=PTR_Q, ptr_k=PTR_K)
    assert graph.num_edges == 0
    qq, kk, vv = qkv()
    out = sparse_attention(qq, kk, vv, graph, edge_prob=torch.zeros(0, dtype=torch.float64))
    assert torch.equal(out, torch.zeros(NQ, H, D, dtype=torch.float64))
    out.sum().backward()
    assert torch.equal(qq.grad, torch.zeros_like(qq))


def test_reduced_precision_inputs(graph):
    q, k, v = (t.detach() for t in qkv())
    ref = sparse_attention(q.float(), k.float(), v.float(), graph)
    for dtype in (torch.bfloat16, torch.float16):
        out = sparse_attention(q.to(dtype), k.to(dtype), v.to(dtype), graph)
        assert out.dtype == dtype
        assert torch.allclose(out.float(), ref, atol=3e-2)


def test_bad_input(graph):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="key"):
        sparse_attention(q, k[:, :1], v, graph)
    with pytest.raises(ValueError, match="value"):
        sparse_attention(q, k, v[:3], graph)
    with pytest.raises(ValueError, match="graph has N_q=7"):
        sparse_attention(q[:5], k, v, graph)
    with pytest.raises(TypeError, match="graph"):
        sparse_attention(q, k, v, graph.edge_index)
    with pytest.raises(ValueError, match="edge_prob"):
        sparse_attention(q, k, v, graph, edge_prob=torch.ones(graph.num_edges + 1))
    with pytest.raises(ValueError, match="dropout"):
        sparse_attention(q, k, v, graph, dropout=1.0)
    with pytest.raises(TypeError, match="query"):
        sparse_attention(q.long(), k, v, graph)


def dense_attention_with_sink(q, k, v, mask, sink, mask_values=None):
    """The reference with a sink: one more logit per row, b_h, whose key has
    value zero; returns the output and the weights of the real keys."""
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    if mask_values is not None:
        scores = scores * mask_values
    scores = scores.masked_fill(~mask, float("-inf"))
    column = sink.to(scores.dtype)[:, None, None].expand(H, NQ, 1)
    alpha = torch.softmax(torch.cat([scores, column], -1), dim=-1)[..., :NK]
    return torch.einsum("hij,jhd->ihd", alpha, v), alpha


SINK_BACKENDS = [pytest.param("torch"), pytest.param("cpp", marks=needs_cpp)]


@pytest.mark.parametrize("backend", SINK_BACKENDS)
def test_sink_is_a_zero_value_key_in_every_row(graph, backend):
    # Output, weights and every gradient (the sink's and the estimator's
    # included) against the dense softmax with the sink's column appended.
    q, k, v = qkv()
    sink = torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True)
    prob = torch.rand(graph.num_edges, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(NQ, H, D, dtype=torch.float64, generator=seeded(4))
    out, alpha = sparse_attention(q, k, v, graph, edge_prob=prob, sink=sink,
                                  backend=backend, return_attention_weights=True)
    (out * weight).sum().backward()
    got = [q.grad, k.grad, v.grad, sink.grad, prob.grad]
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref_sink = sink.detach().clone().requires_grad_()
    m = torch.ones(H, NQ, NK, dtype=torch.float64, requires_grad=True)
    mask = dense_mask(graph)
    ref, ref_alpha = dense_attention_with_sink(q, k, v, mask, ref_sink, m)
    (ref * weight).sum().backward()
    h, i, j = graph.head, graph.edge_index[1], graph.edge_index[0]
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.allclose(alpha, ref_alpha[h, i, j], atol=1e-12)
    expected = [q.grad, k.grad, v.grad, ref_sink.grad, m.grad[h, i, j]]
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-12)
    # It took part: rows hold less than all their weight, and the sink's
    # gradient is not zero.
    rows = torch.zeros(H * NQ, dtype=torch.float64).index_add_(
        0, graph.csr.row().long(), alpha)
    assert bool((rows[graph.rowptr.diff() > 0] < 1 - 1e-3).all())
    assert bool(sink.grad.abs().min() > 1e-6)


@pytest.mark.parametrize("backend", SINK_BACKENDS)
def test_sink_exact_values(backend):
    # All scores 0 and b = log 2: query 0 sees key 0, weight e^0 / (e^0 +
    # e^b) = 1/3; query 1 sees keys 0 and 1, 1/4 each; query 2 sees
    # nothing: zeros.
    graph = SampledGraph.from_edge_index(torch.tensor([[0, 0, 1], [0, 1, 1]]),
                                         num_queries=3, num_keys=2)
    q = torch.zeros(3, 1, 2, dtype=torch.float64)
    v = torch.tensor([[[2.0, 4.0]], [[6.0, 8.0]]], dtype=torch.float64)
    sink = torch.tensor([math.log(2.0)], dtype=torch.float64)
    out, alpha = sparse_attention(q, q[:2], v, graph, sink=sink, backend=backend,
                                  return_attention_weights=True)
    assert torch.allclose(out[:, 0], torch.tensor(
        [[2 / 3, 4 / 3], [2.0, 3.0], [0.0, 0.0]], dtype=torch.float64), atol=1e-15)
    assert torch.allclose(alpha, torch.tensor([1 / 3, 1 / 4, 1 / 4],
                                              dtype=torch.float64), atol=1e-15)


@pytest.mark.parametrize("backend", SINK_BACKENDS)
def test_sink_gradcheck(graph, backend):
    sink = torch.tensor([0.5, -0.25], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: sparse_attention(q, k, v, graph, sink=s, backend=backend),
        (*qkv(), sink))


def test_sink_bad_input(graph):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="sink must have one logit per head"):
        sparse_attention(q, k, v, graph, sink=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="sink"):
        sparse_attention(q, k, v, graph, sink=torch.zeros(1, 2))
    with pytest.raises(TypeError, match="sink"):
        sparse_attention(q, k, v, graph, sink=torch.zeros(2, dtype=torch.long))


def test_query_block_in_row_chunks_is_the_same_product(monkeypatch):
    # Q̂ Ŝ in chunks of 4 rows (the last padded) against one einsum over
    # all rows: the same values and gradients (Ŝ's summed over the chunks),
    # float64; also with no rows.
    from sbm_pyg.nn import block_model
    from sbm_pyg.nn.functional import sbm_factors
    monkeypatch.setattr(block_model, "ROW_CHUNK", 4)
    gen = torch.Generator().manual_seed(7)
    for N in (10, 8, 3, 0):
        q_memb = torch.rand(N, 2, 3, generator=gen, dtype=torch.float64,
                            requires_grad=True)
        block = torch.rand(2, 3, 3, generator=gen, dtype=torch.float64,
                           requires_grad=True)
        k_memb = torch.rand(5, 2, 3, generator=gen, dtype=torch.float64)
        weight = torch.randn(2 * N, 3, generator=gen, dtype=torch.float64)
        chunked = sbm_factors((q_memb, block, k_memb), torch.float64)[0]
        whole = torch.einsum("nhu,huv->hnv", q_memb, block).reshape(-1, 3)
        torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)
        for a, b in zip(torch.autograd.grad((chunked * weight).sum(), [q_memb, block]),
                        torch.autograd.grad((whole * weight).sum(), [q_memb, block])):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
