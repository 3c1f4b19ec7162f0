"""benchmarks.launches: operators and host reads per step, graph breaks."""
import pytest
import torch

from benchmarks.launches import count_ops, main


def test_counts_each_dispatched_operator_and_host_read():
    x = torch.ones(3)
    w = torch.zeros(1, requires_grad=True)
    w.grad = torch.ones(1)
    opt = torch.optim.Adam([w], lr=0.1, foreach=False)

    def fn():
        y = x.add(1).mul(2)  # two operators
        int(y.sum())  # one more, and a host read

    res = count_ops(fn)
    assert res["ops"] == 4 and res["views"] == 0 and res["host_reads"] == 1
    assert count_ops(lambda: x.view(3, 1).t())["views"] == 2
    assert res["reads"] == {"other": 1}
    assert res["top"]["aten.add.Tensor"] == 1
    assert res["sbm_pyg_ops"] == 0
    # tolist reads without an operator; the optimizers' reads are apart
    assert count_ops(lambda: x.tolist())["host_reads"] == 1
    steps = count_ops(lambda: opt.step())
    assert steps["host_reads"] == 0 and steps["reads"]["torch.optim"] >= 1


def test_reads_are_named_by_their_place_in_sbm_pyg():
    from sbm_pyg.nn import SBMConv
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, attention_backend="cpp"
                   if torch.get_default_device().type == "cpu" else "auto")
    x = torch.randn(20, 8)
    g = torch.Generator(x.device).manual_seed(0)
    res = count_ops(lambda: conv(x, ptr=torch.tensor([0, 8, 20]), generator=g))
    assert res["host_reads"] == sum(res["reads"].values()) >= 1
    assert all(k.endswith(".py:" + k.split(":")[-1]) and ".py:" in k
               for k in res["reads"]), res["reads"]


def test_the_layer_compiles_around_its_one_host_read():
    # One SBMConv forward under torch._dynamo.explain: the projections and
    # memberships, then (after the one eager region: the checks, the regime
    # choice, the sampler) the attention operator traced into a graph, then
    # the output projection: a break inside sbm_attention, called from the
    # layer's forward, resumes both frames apart (without the layer's try
    # block around the call the count is the same).
    from benchmarks.launches import graph_breaks
    res = graph_breaks(64)
    assert res["traced"] == ["sbm_pyg.sparse_attention"], res
    assert (res["graphs"], res["breaks"]) == (3, 2), res


def test_forward_parts_count_each_operator_once():
    from benchmarks.launches import PARTS, count_ops, forward_parts
    parts = forward_parts(64)
    assert set(parts) <= set(PARTS) | {"other"}
    # The regime choice, the sampler's plan and the attention are there.
    assert all(parts.get(p, 0) > 0 for p in ("regimes", "tiles_share", "_plan",
                                            "attend_graph")), parts
    from sbm_pyg.nn import SBMConv
    torch.manual_seed(0)
    conv = SBMConv(64, 32, heads=2, num_clusters=128)
    x = torch.randn(64, 64)
    g = torch.Generator().manual_seed(0)
    res = count_ops(lambda: conv(x, generator=g))
    assert sum(parts.values()) == res["ops"] - res["views"]


@pytest.mark.slow
def test_quick_run(tmp_path):
    res = main(["--quick", "--out", str(tmp_path / "l.json")])
    assert res["training_sbm"]["sbm_pyg_ops"] > 0
    assert res["training_full"]["sbm_pyg_ops"] == 0
    assert res["graph_breaks"]["graphs"] >= 1
    # The batch vector's size spares its read, one sync fewer.
    assert res["gps_layer"]["reads"]["validation.py:sync"] == 2
    assert res["gps_layer_sized"]["reads"]["validation.py:sync"] == 1
    # A batch of both regimes: the choice, the split, the rest's sampler,
    # the rest's graph outside the dense pairs.
    assert res["mixed_batch"]["reads"]["validation.py:sync"] == 4


def test_mixed_syncs_counts_a_forward_and_its_backward(monkeypatch):
    # The GPU plan's count of a batch of both regimes, its CUDA counter
    # replaced by one that runs the call and counts the calls.
    from benchmarks.gpu import syncs
    calls = []
    monkeypatch.setattr(syncs, "count_syncs",
                        lambda fn: calls.append(fn()) or {"n": len(calls)})
    res = syncs.mixed_syncs(64, torch.get_default_device())
    assert res == {"n": 64, "forward": {"n": 1}, "backward": {"n": 2}}
    assert calls == [None, None]
