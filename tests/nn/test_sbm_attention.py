"""sbm_attention: one function for the whole SBM attention, its regime
chosen per sequence."""
import pytest
import torch

from sbm_pyg.nn import SBMConv, sbm_attention
from sbm_pyg.ops import backend_info
from tests.helpers import seeded

H, D, K = 2, 4, 3
# Sequence 0 dense (memberships 1: p = 1 everywhere), 1 empty, 2 sparse.
SIZES = (12, 0, 20)

pytestmark = pytest.mark.skipif(
    not backend_info.dense_runs(torch.get_default_device()),
    reason="no dense-regime kernel on this device")


def inputs(requires_grad=True):
    g = seeded(0)
    ptr = torch.tensor([0, *SIZES]).cumsum(0)
    N = int(ptr[-1])
    memb = torch.full((N, H, K), 0.01)
    memb[:SIZES[0]] = 1.0
    block = torch.softmax(torch.randn(H, K * K, generator=g), -1).view(H, K, K)
    x = [torch.randn(N, H, D, generator=g) for _ in "qkv"]
    leaves = [t.requires_grad_(requires_grad) for t in (*x, memb, block)]
    return ptr, leaves


def call(leaves, ptr, seed, **kwargs):
    q, k, v, memb, block = leaves
    return sbm_attention(q, k, v, memb, block, memb, ptr_q=ptr, ptr_k=ptr,
                         generator=seeded(seed), **kwargs)


def test_each_sequence_runs_its_regime():
    ptr, leaves = inputs()
    res = call(leaves, ptr, 5, exploration=0.01)
    sparse = backend_info.resolve_backend("attention", "auto",
                                          torch.get_default_device())
    assert res.backends == {"sampler": backend_info.resolve_backend(
        "sampler", "auto", torch.get_default_device()), "attention": sparse,
        "dense_sequences": "1/2"}
    # The same output as the dense kernel on sequence 0 alone and then the
    # sparse path on sequence 2 alone, from one generator in that order.
    g = seeded(5)
    n0 = SIZES[0]
    dense = sbm_attention(*[t[:n0] for t in leaves[:4]], leaves[4],
                          leaves[3][:n0], exploration=0.01, generator=g,
                          attention_backend="dense")
    rest = sbm_attention(*[t[n0:] for t in leaves[:4]], leaves[4],
                         leaves[3][n0:], exploration=0.01, generator=g,
                         attention_backend=sparse)
    assert dense.backends["attention"] == "dense"
    torch.testing.assert_close(res.out, torch.cat([dense.out, rest.out]))
    # Sequence 0 is all edges; the densities average the non-empty ones.
    assert float(res.sampled_density.min()) > 0.5
    torch.testing.assert_close(
        res.sampled_density, (dense.sampled_density + rest.sampled_density) / 2)
    # Gradients reach every input through both regimes.
    grads = torch.autograd.grad(res.out.square().sum()
                                + res.expected_density.sum(), leaves)
    for grad in grads:
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_weights_and_graph_of_a_mixed_batch():
    ptr, leaves = inputs(requires_grad=False)
    ref = call(leaves, ptr, 7)
    res = call(leaves, ptr, 7, return_attention_weights=True)
    graph, alpha = res.graph, res.alpha
    torch.testing.assert_close(res.out, ref.out)
    # Sequence 0's graph is complete (p = 1), the graph's sequences are the
    # call's, and each row's weights sum to one.
    counts = graph.edge_counts()
    assert counts[0].tolist() == [SIZES[0] ** 2] * H
    assert torch.equal(counts.sum(0), res.sampled_density.new_tensor(
        counts.sum(0).tolist()).long())
    row = graph.csr.row().long()
    sums = torch.zeros(H * int(ptr[-1])).index_add_(0, row, alpha)
    has = graph.rowptr.diff() > 0
    torch.testing.assert_close(sums[has], torch.ones(int(has.sum())))


def test_one_regime_needs_no_split():
    # An empty sequence joins the other regime; a dense-only batch runs the
    # dense kernel alone.
    ptr, leaves = inputs()
    n0 = SIZES[0]
    q, k, v, memb, block = (t[:n0] if t.dim() == 3 else t for t in leaves)
    res = sbm_attention(q, k, v, memb, block, memb,
                        ptr_q=torch.tensor([0, n0, n0]),
                        ptr_k=torch.tensor([0, n0, n0]), generator=seeded(1))
    assert res.backends == {"sampler": "dense", "attention": "dense"}


def test_max_edges_counts_both_regimes():
    ptr, leaves = inputs(requires_grad=False)
    pairs = H * SIZES[0] ** 2  # the dense sequence's pairs
    with pytest.raises(ValueError, match="max_edges"):
        call(leaves, ptr, 0, max_edges=pairs - 1)
    with pytest.raises(ValueError, match="max_edges"):
        call(leaves, ptr, 0, max_edges=pairs, exploration=1.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(ste="clip"), "ste must be"),
    (dict(attention_backend="flash"), "attention_backend must be"),
    (dict(max_edges=-1), "max_edges must be"),
])
def test_bad_options_raise(kwargs, match):
    ptr, leaves = inputs(requires_grad=False)
    with pytest.raises(ValueError, match=match):
        call(leaves, ptr, 0, **kwargs)


def test_layer_runs_the_dense_regime_where_dense():
    torch.manual_seed(0)
    conv = SBMConv(8, D, heads=H, num_clusters=K, sbm_init="dense")
    conv(torch.randn(20, 8), ptr=torch.tensor([0, 10, 20]))
    assert conv.last_backends == {"sampler": "dense", "attention": "dense"}
