"""benchmarks.sharp: the sharp head's SBM and its row."""
import pytest
import torch

from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS
from benchmarks.sharp import (
    INSIDE,
    OWN,
    bench_mixed,
    bench_sharp,
    bench_sharp_conv,
    bench_widths,
    sharp_conv,
    sharp_sbm,
)
from sbm_pyg.ops.backend_info import dense_runs


def test_the_sharp_sbm_is_nearly_complete_blocks():
    # V = 0.8 / 0.4 = 2 clusters: p = 0.8 inside a cluster (plus the other
    # cluster's diagonal entry met by two small memberships), 2 OWN eps S
    # across.
    q_memb, block, k_memb = sharp_sbm(6, 0.4, torch.device("cpu"))
    assert q_memb.shape == k_memb.shape == (6, HEADS, CLUSTERS)
    assert block.shape == (HEADS, CLUSTERS, CLUSTERS)
    assert all(t.requires_grad and t.is_leaf for t in (q_memb, block, k_memb))
    eps = (1 - OWN) / (CLUSTERS - 1)
    S = INSIDE / OWN**2
    assert (q_memb.max(-1).values == OWN).all() and (q_memb.argmax(-1) < 2).all()
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    same = q_memb.argmax(-1).T[:, :, None] == k_memb.argmax(-1).T[:, None, :]
    torch.testing.assert_close(p[same], torch.full_like(p[same], INSIDE + eps**2 * S))
    torch.testing.assert_close(p[~same], torch.full_like(p[~same], 2 * OWN * eps * S))
    assert q_memb.argmax(-1).unique().numel() == 2  # both clusters drawn
    # The sparse form: the other 0.02 on the other of the V = 2 clusters.
    q_memb, block, k_memb = sharp_sbm(6, 0.4, torch.device("cpu"), sparse=True)
    top = q_memb.argmax(-1)
    assert (q_memb.max(-1).values == OWN).all() and (top < 2).all()
    assert torch.equal(q_memb.gather(-1, 1 - top[..., None]).squeeze(-1),
                       torch.full((6, HEADS), 1 - OWN))
    assert (q_memb[..., 2:] == 0).all() and torch.equal(q_memb, k_memb)
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    same = top.T[:, :, None] == top.T[:, None, :]
    S = INSIDE / OWN**2
    torch.testing.assert_close(p[same], torch.full_like(p[same], INSIDE + (1 - OWN)**2 * S))
    torch.testing.assert_close(p[~same], torch.full_like(p[~same], 2 * OWN * (1 - OWN) * S))
    # One cluster: all on it.
    q_memb, _, _ = sharp_sbm(6, 0.9, torch.device("cpu"), sparse=True)
    assert (q_memb[..., 0] == 1).all() and (q_memb[..., 1:] == 0).all()


@pytest.mark.slow
def test_a_quick_row():
    lines = []
    # Clusters of about 32 tokens: tiles of 16 (at 64 they would be mostly
    # padding, below the plan's fill).
    rows = bench_sharp([(128, 0.2)], torch.device("cpu"), 1, lines.append, tile=16)
    row = rows[0]
    assert row["clusters"] == 4 and 0.1 < row["sampled_density"] < 0.4
    assert row["sbm_time"] > 0 and row["sdpa_time"] > 0
    assert row["ratio"] == row["sbm_time"] / row["sdpa_time"]
    assert row["backends"]["sampler"] in ("cpp", "torch", "dense")
    assert set(row["breakdown"]) >= {"sampler", "attention_forward", "attention_backward"}
    # The tiled path beside it: the same law (its density near the edge
    # path's), its tiles at least partly filled, some blocks left to
    # fastRG (those whose tiles' padding keeps them below the fill).
    assert row["tiles_ratio"] == row["tiles_time"] / row["sdpa_time"]
    assert row["tiles_torch_ratio"] == row["tiles_torch_time"] / row["sdpa_time"]
    assert row["tiles_kernel"] == ("dense" if dense_runs(torch.device("cpu"))
                                   else "torch")
    assert row["tiles"] >= 1 and 0 < row["tile_fill"] <= 1
    assert 0.1 < row["tiled_density"] < 0.4 and 0 < row["rest_share"] < 1
    # "auto" beside them, its regime named, its attention's two halves.
    assert row["auto_ratio"] == row["auto_time"] / row["sdpa_time"]
    assert row["auto_backends"]["attention"] in ("tiles", row["backends"]["attention"])
    split = row["auto_attention"]
    assert split["forward"] > 0 and split["backward"] > 0
    assert row["auto_backward_vs_forward"] == split["backward"] / split["forward"]
    # The sparse form over its V clusters, through "auto" and the edge path.
    for name in ("sparse_auto", "sparse_edges"):
        assert row[f"{name}_backends"]["clusters"] == "4/128"
        assert row[f"{name}_ratio"] == row[f"{name}_time"] / row["sdpa_time"]
        assert 0.1 < row[f"{name}_density"] < 0.4
    assert row["sparse_edges_backends"]["attention"] == row["backends"]["attention"]
    assert row["sparse_auto_attention"]["backward"] > 0
    assert len(lines) == 5


def test_the_sharp_layer_computes_the_sharp_head():
    # Through the layer's own projections, MLP and clusters: each token's
    # membership 0.98 on its drawn cluster, the block 0.8 / 0.98^2 inside a
    # cluster and sigma(-9) across, so p = 0.8 + O(1e-4) within a block.
    conv, x = sharp_conv(64, 0.2, torch.device("cpu"))
    H = HEADS
    q = conv.lin_query(x).view(-1, H, HEAD_DIM)
    k = conv.lin_key(x).view(-1, H, HEAD_DIM)
    q_memb, block, k_memb = conv.sbm(q, k)
    top = x.view(-1, H, HEAD_DIM).argmax(-1)
    assert torch.equal(q_memb.argmax(-1), top) and torch.equal(k_memb.argmax(-1), top)
    torch.testing.assert_close(q_memb.max(-1).values, torch.full((64, H), OWN))
    inside = block[:, range(4), range(4)]
    torch.testing.assert_close(inside, torch.full_like(inside, INSIDE / OWN**2))
    assert block[:, 0, 1].max() < 2e-4 and block[:, 5, 5].max() < 2e-4
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    same = top.T[:, :, None] == top.T[:, None, :]
    assert (p[same] - INSIDE).abs().max() < 1e-3 and p[~same].max() < 1e-3
    with pytest.raises(ValueError, match="more than the head dimension"):
        sharp_conv(64, 0.01, torch.device("cpu"))
    # The sharp form: top-2 memberships, the layer over the V clusters.
    conv, x = sharp_conv(64, 0.2, torch.device("cpu"), parametrization="sharp")
    q_memb, block, k_memb = conv.sbm(conv.lin_query(x).view(-1, H, HEAD_DIM),
                                     conv.lin_key(x).view(-1, H, HEAD_DIM))
    assert torch.equal(q_memb.argmax(-1), top) and ((q_memb > 0).sum(-1) == 2).all()
    assert q_memb.max(-1).values.min() > 0.9998
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb).detach()
    assert (p[same] - INSIDE).abs().max() < 0.04 and p[~same].max() < 1e-3
    conv(x)
    assert conv.last_backends["clusters"] == "4/128"


@pytest.mark.slow
def test_a_quick_layer_row():
    lines = []
    row = bench_sharp_conv(256, 0.2, torch.device("cpu"), 1, lines.append)
    assert row["auto_ratio"] == row["auto_time"] / row["mha_time"]
    assert row["edges_ratio"] == row["edges_time"] / row["mha_time"]
    assert row["edges_backends"]["attention"] != "tiles"
    assert 0.1 < row["auto_density"] < 0.3 and 0.1 < row["edges_density"] < 0.3
    assert row["sharp_form_ratio"] == row["sharp_form_time"] / row["mha_time"]
    assert row["sharp_form_backends"]["clusters"] == "4/128"
    assert 0.1 < row["sharp_form_density"] < 0.3
    assert len(lines) == 1


@pytest.mark.slow
def test_a_quick_mixed_row():
    # Head 0 dense, head 1 four blocks of about 256 tokens: "auto" runs the
    # dense regime beside the tiles, or beside the edge path where the
    # tiles' fill is out of reach.
    if not dense_runs(torch.device("cpu")):
        pytest.skip("no dense-regime kernel")
    lines = []
    row = bench_mixed(1024, 0.2, torch.device("cpu"), 1, lines.append)
    assert row["tiles_backends"]["attention"] == "tiles"
    assert row["edges_backends"]["attention"] != "tiles"
    for name in ("tiles", "edges"):
        assert row[f"{name}_backends"]["dense_pairs"] == "1/2"
        assert row[f"{name}_ratio"] == row[f"{name}_time"] / row["sdpa_time"]
    assert len(lines) == 1


def test_a_quick_widths_row():
    # One graph of the sharp head, the edge kernel fwd+bwd at each
    # membership width: 0 (edge probabilities), 2, V = 4 and k.
    lines = []
    row = bench_widths(256, 0.2, torch.device("cpu"), 1, lines.append)
    assert row["clusters"] == 4 and row["edges"] > 0
    assert list(row["times"]) == list(row["attention"]) == [0, 2, 4, CLUSTERS]
    assert all(t > 0 for t in row["times"].values())
    assert all(part["backward"] > 0 for part in row["attention"].values())
    assert len(lines) == 1
