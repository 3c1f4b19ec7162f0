"""Tests for sbm_pyg.nn.support: the SBM over the clusters its memberships
use, and sbm_attention's sparse_memberships on every regime."""
import pytest
import torch

from sbm_pyg.nn import SBMAttentionOptions, SBMConv, sbm_attention
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.nn.support import compact_clusters, used_clusters
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend
from tests.helpers import seeded

PTR = [0, 9, 9, 20]  # three sequences, one empty
# The clusters compact_clusters keeps of top2_sbm's, per head: the used
# ones, head 0 padded with the first unused ones.
KEPT = [[1, 4, 0, 2], [0, 2, 5, 6]]


def kept_mask(k=7):
    mask = torch.zeros(2, k, dtype=torch.bool)
    for h, clusters in enumerate(KEPT):
        mask[h, clusters] = True
    return mask.to(torch.get_default_device())


def top2_sbm(N=20, H=2, k=7, seed=0):
    """Memberships on two clusters each (0.8 / 0.2) of a few per head:
    head 0 uses clusters {1, 4}, head 1 {0, 2, 5}; keys also 6 in head 1.
    A block with every entry in (0, 0.9)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(N, H, k, dtype=torch.float64, device="cpu")
    k_memb = torch.zeros_like(q)
    for memb, used in ((q, ([1, 4], [0, 2, 5])), (k_memb, ([1, 4], [0, 2, 5, 6]))):
        for h, clusters in enumerate(used):
            pick = torch.tensor(clusters, device="cpu")[torch.randint(len(clusters), (N, 2),
                                                        generator=g, device="cpu")]
            memb[:, h].scatter_add_(1, pick, torch.tensor([[0.8, 0.2]], device="cpu").double()
                                    .expand(N, 2).contiguous())
    block = torch.rand(H, k, k, generator=g, dtype=torch.float64, device="cpu") * 0.9
    device = torch.get_default_device()
    return q.to(device), block.to(device), k_memb.to(device)


def test_compact_clusters_keeps_the_used_ones_in_order():
    q, block, k = top2_sbm()
    used = used_clusters(q, k)
    assert used.tolist() == [[False, True, False, False, True, False, False],
                             [True, False, True, False, False, True, True]]
    cq, cb, ck = compact_clusters((q, block, k))
    # Head 0 keeps 1, 4 and pads with the first unused ones (0, 2); head 1
    # keeps 0, 2, 5, 6.
    assert cq.shape == (20, 2, 4) and cb.shape == (2, 4, 4)
    order = torch.tensor(KEPT)
    for h in range(2):
        assert torch.equal(cq[:, h], q[:, h, order[h]])
        assert torch.equal(ck[:, h], k[:, h, order[h]])
        assert torch.equal(cb[h], block[h][order[h]][:, order[h]])
    # The same probabilities for every pair.
    p = torch.einsum("ihu,huv,jhv->hij", q, block, k)
    assert torch.allclose(torch.einsum("ihu,huv,jhv->hij", cq, cb, ck), p,
                          atol=1e-15)


def test_compact_clusters_gradients():
    # Through the probabilities: the block's gradient the full SBM's, the
    # memberships' the full one's on the kept clusters and zero elsewhere.
    q, block, k = top2_sbm()
    w = torch.randn(2, 20, 20, dtype=torch.float64, generator=seeded(1),
                    device=seeded(1).device)

    def grads(compact):
        leaves = [x.clone().requires_grad_() for x in (q, block, k)]
        sbm = compact_clusters(tuple(leaves)) if compact else leaves
        (torch.einsum("ihu,huv,jhv->hij", *sbm) * w).sum().backward()
        return [x.grad for x in leaves]

    full, compact = grads(False), grads(True)
    kept = kept_mask()
    assert torch.allclose(compact[1], full[1], atol=1e-13)
    for got, want in ((compact[0], full[0]), (compact[2], full[2])):
        assert torch.allclose(got, torch.where(kept, want, 0.0), atol=1e-13)
        assert (want[:, ~kept].abs() > 0).any()  # what is dropped


def test_compact_clusters_width_and_refusals():
    q, block, k = top2_sbm()
    cq, cb, ck = compact_clusters((q, block, k), width=5)  # one more pad
    assert cq.shape[-1] == 5 and cb.shape == (2, 5, 5)
    kept = compact_clusters((q, block, k), width=7)
    assert all(a is b for a, b in zip(kept, (q, block, k)))  # nothing to drop
    for width in (0, 8, 2.0):
        with pytest.raises(ValueError, match="width must be"):
            compact_clusters((q, block, k), width=width)
    # All memberships zero: one cluster kept, every probability 0.
    zero = torch.zeros_like(q)
    cq, cb, _ = compact_clusters((zero, block, zero))
    assert cq.shape[-1] == 1 and cb.shape == (2, 1, 1)
    with pytest.raises(TypeError, match="sparse_memberships must be a bool"):
        SBMAttentionOptions(sparse_memberships=1)


# The edge path (the device's sparse kernel), the dense and tiled regimes.
REGIMES = ["edges", "dense", "tiles"]


@pytest.mark.parametrize("regime", REGIMES)
def test_sparse_memberships_in_sbm_attention(regime):
    # On each regime: the output and the gradients those of the edge path
    # on the graph returned with the full SBM, the memberships' on the
    # kept clusters; the expected densities the full SBM's.
    device = torch.get_default_device()
    if regime != "edges" and not dense_runs(device):
        pytest.skip("no dense-regime kernel on this device")
    if regime == "edges":
        regime = resolve_backend("attention", "auto", device)
    sbm = top2_sbm()
    g = seeded(0)
    inputs = [torch.randn(20, 2, 4, dtype=torch.float64, generator=g,
                          device=g.device) for _ in range(3)]
    weight = torch.randn(20, 2, 4, dtype=torch.float64, generator=g,
                         device=g.device)
    options = SBMAttentionOptions(attention_backend=regime, exploration=0.01,
                                  sparse_memberships=True, tile_size=4,
                                  tile_fill=0.1)
    leaves = [x.clone().requires_grad_() for x in (*inputs, *sbm)]
    res = sbm_attention(*leaves[:3], tuple(leaves[3:]), ptr_q=PTR, ptr_k=PTR,
                        options=options, return_graph=True, generator=seeded(3))
    (res.out * weight).sum().backward()
    assert res.backends["clusters"] == "4/7"
    assert res.graph.num_edges > 0
    want_leaves = [x.clone().requires_grad_() for x in (*inputs, *sbm)]
    want = sparse_attention(*want_leaves[:3], res.graph, sbm=tuple(want_leaves[3:]))
    (want * weight).sum().backward()
    assert torch.allclose(res.out, want, atol=1e-12)
    kept = kept_mask()
    for i, (got, expect) in enumerate(zip(leaves, want_leaves)):
        expect = expect.grad if i not in (3, 5) else torch.where(kept, expect.grad, 0.0)
        assert torch.allclose(got.grad, expect, atol=1e-12), i
    full = sbm_attention(*inputs, sbm, ptr_q=PTR, ptr_k=PTR, generator=seeded(3),
                         options=SBMAttentionOptions(attention_backend=regime,
                                                     exploration=0.01,
                                                     tile_size=4, tile_fill=0.1))
    assert "clusters" not in full.backends
    assert torch.allclose(res.expected_density, full.expected_density, atol=1e-14)


def test_the_sharp_layer_computes_over_its_used_clusters():
    torch.manual_seed(0)
    x = torch.randn(30, 16)
    sharp = SBMConv(16, 8, heads=2, num_clusters=32, sbm_parametrization="sharp")
    sharp(x).sum().backward()
    width, k = map(int, sharp.last_backends["clusters"].split("/"))
    assert k == 32 and 1 <= width <= 32
    assert sharp.sbm.clusters.grad is not None
    mmsb = SBMConv(16, 8, heads=2, num_clusters=32, sbm_parametrization="mmsb")
    mmsb(x)
    assert "clusters" not in mmsb.last_backends
