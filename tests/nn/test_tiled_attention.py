"""Attention over a tiled graph equals the edge path on the same graph:
output and every gradient, the straight-through estimator's included; drawn
and attended in one pass on the dense-regime kernel, it has the sampler's
law."""
import dataclasses
import importlib

import pytest
import torch

from sbm_pyg.nn import SBMAttentionOptions, SBMConv, sbm_attention
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.nn.tiled_attention import tiled_attention, tiled_sbm_attention
from sbm_pyg.ops import backend_info
from sbm_pyg.ops.backend_info import dense_runs
from sbm_pyg.sampling.tiled_graph import draw_tiled
from sbm_pyg.sampling.tiles import in_tiles, plan_tiles, tile_rows
from tests.helpers import pin_tiles_min_edges, seeded
from tests.markers import needs_cpp, needs_triton
from tests.sampling.cases import repeated
from tests.sampling.test_tiles import assert_has_the_law, sharp_sbm

# The module (sbm_pyg.nn's attribute of that name is the function).
tiled_module = importlib.import_module("sbm_pyg.nn.tiled_attention")
attention_module = importlib.import_module("sbm_pyg.nn._sbm_attention")
BACKENDS = ["torch", pytest.param("cpp", marks=needs_cpp),
            pytest.param("triton", marks=needs_triton)]


CLUSTERS = [0, 2, 1, 1, 0, 2, 1, 0, 0, 2, 1, 3, 2, 2, 1, 0, 1,
            2, 0, 0, 1, 3, 2, 0, 1, 2, 2, 0]
PTR = [0, 17, 17, 28]  # three sequences, one empty


def tiled_case(kind, self_loops, seed=1):
    """A 2-head SBM on :data:`CLUSTERS` drawn through 4 x 8 tiles (float64).

    ``"deterministic"``: one-hot memberships and rates 0 or at least 1 in
    the exact mode, so every draw is the same graph: clusters 0 and 1 are
    tiled (rate 8: a fill of at least 8 * 25 / 64 >= 1.5 with the tiles'
    padding), cluster 0's queries also reach cluster 2's keys and cluster 2
    its own (rate 1, fill at most 1: the rest), cluster 3 nothing.
    ``"sharp"``: 0.9 on the cluster, rates in (0, 1), exploration.
    """
    top = (torch.tensor(CLUSTERS)[:, None] + torch.arange(2)) % 4
    share = 1.0 if kind == "deterministic" else 0.9
    memb = torch.full((28, 2, 5), (1 - share) / 4, dtype=torch.float64)
    memb.scatter_(-1, top[..., None], share)
    block = torch.zeros(2, 5, 5, dtype=torch.float64)
    block[:, 0, 0] = block[:, 1, 1] = 8.0
    block[:, 0, 2] = block[:, 2, 2] = 1.0
    if kind == "sharp":
        block = torch.where(block > 0, 0.75, 0.02).double()
    plan = plan_tiles(memb, block, memb, ptr_q=PTR, ptr_k=PTR, tile_q=4,
                      tile_k=8, min_fill=1.5 if kind == "deterministic" else 0.1)
    tiled = draw_tiled(memb, block, memb, plan, mode="exact",
                       exploration=0.0 if kind == "deterministic" else 0.01,
                       self_loops=self_loops, generator=seeded(seed))
    return (memb, block, memb.clone()), tiled


def row_kinds(tiled):
    """Each (head, query) row's (has tile edges, has rest edges)."""
    head, q_rows, _ = tile_rows(tiled.plan)
    in_tiles = torch.zeros(2 * 28, dtype=torch.long)
    in_tiles.index_add_(0, (head[:, None] * 28 + q_rows.clamp(min=0)).flatten(),
                        tiled.mask.sum(-1).flatten())
    in_rest = tiled.rest.csr.rowptr.diff().long()
    return {(bool(t), bool(r)) for t, r in zip(in_tiles.tolist(), in_rest.tolist())}


def run(fn, graph_arg, inputs, sbm, weight, **kwargs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    sbm = [x.detach().clone().requires_grad_() for x in sbm] if sbm else None
    out = fn(*inputs, graph_arg, sbm=tuple(sbm) if sbm else None, **kwargs)
    (out * weight).sum().backward()
    return out, [x.grad for x in inputs + (sbm or [])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ste", ["paper", "published", None])
@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("kind", ["deterministic", "sharp"])
def test_equals_the_edge_path_on_the_same_graph(backend, ste, self_loops, kind):
    sbm, tiled = tiled_case(kind, self_loops)
    graph = tiled.graph()
    if kind == "deterministic":  # rows of every kind, whatever the draw
        kinds = row_kinds(tiled)
        assert {(True, False), (False, True), (True, True)} <= kinds
        assert ((False, False) in kinds) == (not self_loops)
    g = seeded(0)
    inputs = [torch.randn(28, 2, 4, dtype=torch.float64, generator=g,
                          device=g.device) for _ in range(3)]
    weight = torch.randn(28, 2, 4, dtype=torch.float64, generator=g, device=g.device)
    kwargs = dict(ste=ste or "paper", backend=backend)
    got, grads = run(tiled_attention, tiled, inputs, sbm if ste else None,
                     weight, **kwargs)
    want, want_grads = run(sparse_attention, graph, inputs, sbm if ste else None,
                           weight, **kwargs)
    assert torch.allclose(got, want, atol=1e-12)
    assert len(grads) == (6 if ste else 3)
    for a, b in zip(grads, want_grads):
        assert torch.allclose(a, b, atol=1e-12)


def test_bad_arguments_name_themselves():
    sbm, tiled = tiled_case("sharp", False)
    x = torch.randn(28, 2, 4)
    with pytest.raises(ValueError, match="ste must be one of"):
        tiled_attention(x, x, x, tiled, ste="clip")
    with pytest.raises(ValueError, match=r"must match each other and the graph's"):
        tiled_attention(x[:5], x[:5], x[:5], tiled)
    with pytest.raises(ValueError, match=r"must match each other"):
        tiled_attention(x, x[..., :3], x, tiled)
    with pytest.raises(ValueError, match="sbm"):
        tiled_attention(x, x, x, tiled, sbm=(sbm[0][:3], sbm[1], sbm[2]))


def fused_run(inputs, sbm, plan, weight, **kwargs):
    """tiled_sbm_attention's output, graph and gradients (inputs, then the
    SBM's where it takes them)."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    sbm = [x.detach().clone().requires_grad_() for x in sbm]
    out, graph = tiled_sbm_attention(*inputs, tuple(sbm), plan, return_graph=True,
                                     **kwargs)
    (out * weight).sum().backward()
    return out, graph, [x.grad for x in inputs + sbm]


@needs_cpp
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ste", ["paper", "published", None])
@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("kind", ["deterministic", "sharp"])
def test_drawn_on_the_dense_kernel_equals_the_edge_path(backend, ste, self_loops,
                                                       kind):
    # The tiles drawn and attended by the dense-regime kernel, the rest by
    # the sparse one: on the graph it returns, the edge path's output and
    # every gradient; in the deterministic case that graph is draw_tiled's.
    sbm, tiled = tiled_case(kind, self_loops)
    g = seeded(0)
    inputs = [torch.randn(28, 2, 4, dtype=torch.float64, generator=g,
                          device=g.device) for _ in range(3)]
    weight = torch.randn(28, 2, 4, dtype=torch.float64, generator=g, device=g.device)
    out, graph, grads = fused_run(
        inputs, sbm, tiled.plan, weight, mode="exact", ste=ste, backend=backend,
        exploration=0.0 if kind == "deterministic" else 0.01,
        self_loops=self_loops, generator=seeded(2))
    if kind == "deterministic":
        assert torch.equal(graph.edge_index, tiled.graph().edge_index)
        assert torch.equal(graph.head, tiled.graph().head)
    want, want_grads = run(sparse_attention, graph, inputs, sbm if ste else None,
                           weight, ste=ste or "paper", backend=backend)
    assert torch.allclose(out, want, atol=1e-12)
    for a, b in zip(grads, want_grads):
        assert torch.allclose(a, b, atol=1e-12)
    assert all(x is None for x in grads[3:]) == (ste is None)


@needs_cpp
@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_drawn_on_the_dense_kernel_has_the_law(mode):
    # One sequence repeated, drawn through one plan with tiles and rest:
    # each pair's frequency against the mode's probability (z-test,
    # Bonferroni); the other mode's marginals are rejected.
    memb, block = sharp_sbm([0, 2, 1, 1, 0, 2, 1])
    q, b, k, ptr_q, ptr_k = repeated(memb, block, memb)
    plan = plan_tiles(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, tile_q=2, tile_k=2,
                      min_fill=0.3)
    x = torch.zeros(q.size(0), 2, 1, dtype=torch.float64)
    _, graph = tiled_sbm_attention(x, x, x, (q, b, k), plan, mode=mode,
                                   exploration=0.01, self_loops=True,
                                   generator=seeded(4), return_graph=True)
    assert_has_the_law(graph, memb, block, mode=mode, exploration=0.01,
                       self_loops=True)
    key, query = graph.edge_index
    tiled = in_tiles(plan, graph.head, query, key)
    assert tiled.any() and (~tiled).any()  # edges of both parts


def test_without_the_dense_kernel_the_pytorch_path(monkeypatch):
    # Where the dense-regime kernel does not run, draw_tiled and
    # tiled_attention compute it: the same contract on its graph.
    monkeypatch.setattr(tiled_module, "dense_runs", lambda device: False)
    sbm, tiled = tiled_case("sharp", True)
    g = seeded(0)
    inputs = [torch.randn(28, 2, 4, dtype=torch.float64, generator=g,
                          device=g.device) for _ in range(3)]
    weight = torch.randn(28, 2, 4, dtype=torch.float64, generator=g, device=g.device)
    out, graph, grads = fused_run(inputs, sbm, tiled.plan, weight, mode="exact",
                                  self_loops=True, generator=seeded(2),
                                  backend="torch")
    want, want_grads = run(sparse_attention, graph, inputs, sbm, weight,
                           backend="torch")
    assert torch.allclose(out, want, atol=1e-12)
    for a, b in zip(grads, want_grads):
        assert torch.allclose(a, b, atol=1e-12)


def test_fused_bad_arguments_name_themselves():
    sbm, tiled = tiled_case("sharp", False)
    x = torch.randn(28, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="ste must be one of"):
        tiled_sbm_attention(x, x, x, sbm, tiled.plan, ste="clip")
    with pytest.raises(TypeError, match="plan must be a TilePlan"):
        tiled_sbm_attention(x, x, x, sbm, tiled)
    other = plan_tiles(sbm[0][:17], sbm[1], sbm[2][:17], tile_q=4, tile_k=8)
    with pytest.raises(ValueError, match="plan must be made from these memberships"):
        tiled_sbm_attention(x, x, x, sbm, other)
    with pytest.raises(ValueError, match="must match each other"):
        tiled_sbm_attention(x, x[..., :3], x, sbm, tiled.plan)
    with pytest.raises(ValueError, match="mode must be one of"):
        tiled_sbm_attention(x, x, x, sbm, tiled.plan, mode="bernoulli")


@pytest.mark.parametrize("dense_kernel", [True, False])
@pytest.mark.parametrize("self_loops", [False, True])
def test_the_tiled_regime_of_sbm_attention(self_loops, dense_kernel, monkeypatch):
    # attention_backend="tiles": the output and every gradient the edge
    # path's on the graph it returns, the sampled densities that graph's
    # edges per (sequence, head) over its pairs, the kernels named; with the
    # dense-regime kernel and without it (the PyTorch tiles).
    if not dense_kernel:
        for module in (tiled_module, attention_module, backend_info):
            monkeypatch.setattr(module, "dense_runs", lambda device: False)
    elif not dense_runs(torch.get_default_device()):
        pytest.skip("no dense-regime kernel on this device")
    sbm, _ = tiled_case("sharp", self_loops)
    g = seeded(0)
    inputs = [torch.randn(28, 2, 4, dtype=torch.float64, generator=g,
                          device=g.device) for _ in range(3)]
    weight = torch.randn(28, 2, 4, dtype=torch.float64, generator=g, device=g.device)
    leaves = [x.clone().requires_grad_() for x in (*inputs, *sbm)]
    options = SBMAttentionOptions(attention_backend="tiles", tile_size=4,
                                  tile_fill=0.1, exploration=0.01,
                                  self_loops=self_loops)
    res = sbm_attention(*leaves[:3], tuple(leaves[3:]), ptr_q=PTR, ptr_k=PTR,
                        options=options, return_graph=True, generator=seeded(5))
    (res.out * weight).sum().backward()
    assert res.backends["attention"] == "tiles"
    assert res.backends["tiles"] == ("dense" if dense_kernel else "torch")
    graph = res.graph
    want, want_grads = run(sparse_attention, graph, inputs, sbm, weight)
    assert torch.allclose(res.out, want, atol=1e-12)
    for leaf, b in zip(leaves, want_grads):
        assert torch.allclose(leaf.grad, b, atol=1e-12)
    sizes = torch.tensor(PTR).diff()
    key, query = graph.edge_index
    seq = torch.bucketize(query, torch.tensor(PTR)[1:], right=True)
    edges = torch.zeros(3, 2).index_put_((seq, graph.head), torch.ones(len(seq)),
                                         accumulate=True)
    pairs = (sizes * sizes).double()
    want_density = (edges / pairs[:, None])[pairs > 0].mean(0)  # non-empty ones
    torch.testing.assert_close(res.sampled_density.double(), want_density.double())


def test_the_tiled_regime_refuses_what_it_lacks():
    sbm, _ = tiled_case("sharp", False)
    x = torch.randn(28, 2, 4, dtype=torch.float64)
    tiles = SBMAttentionOptions(attention_backend="tiles", tile_size=4)
    for kwargs, name in ((dict(include_edges=torch.zeros(2, 1, dtype=torch.long)),
                          "include_edges"),
                         (dict(sink=torch.zeros(2)), "sink"),
                         (dict(return_attention_weights=True),
                          "return_attention_weights")):
        with pytest.raises(ValueError, match=f"'tiles' does not take {name}"):
            sbm_attention(x, x, x, sbm, ptr_q=PTR, ptr_k=PTR, options=tiles, **kwargs)
    with pytest.raises(ValueError, match="'tiles' does not take dropout"):
        sbm_attention(x, x, x, sbm, ptr_q=PTR, ptr_k=PTR, training=True,
                      options=dataclasses.replace(tiles, dropout=0.1))
    with pytest.raises(ValueError, match="'tiles' does not take max_edges"):
        sbm_attention(x, x, x, sbm, ptr_q=PTR, ptr_k=PTR,
                      options=dataclasses.replace(tiles, max_edges=10**6))
    for field, value in (("tile_size", 0), ("tile_size", 2.0), ("tile_fill", 0.0),
                         ("tile_fill", float("inf"))):
        with pytest.raises(ValueError, match=f"{field} must be"):
            SBMAttentionOptions(**{field: value})


def test_a_layer_in_the_tiled_regime():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, attention_backend="tiles")
    x = torch.randn(30, 8)
    out = conv(x, ptr=torch.tensor([0, 12, 30]))
    out.sum().backward()
    assert out.shape == (30, 8) and torch.isfinite(out).all()
    assert conv.last_backends["attention"] == "tiles"
    assert all(p.grad is not None for p in conv.sbm.parameters())


def test_the_tiled_regime_reads_the_host_five_times_and_never_backward():
    # The inputs' checks, the plan's, the rest sampler's, the count of the
    # rest's edges outside the tiles and the layout's: five syncs a forward
    # (the CPU generator's seeds aside; every output CUDA would size by a
    # read of its own, a nonzero or a boolean index, counted), none in the
    # backward.
    from benchmarks.launches import count_reads
    if torch.get_default_device().type != "cpu":
        pytest.skip("the CPU's count")
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, attention_backend="tiles").train()
    x = torch.randn(20, 8, requires_grad=True)
    out = []
    forward = count_reads(lambda: out.append(conv(x, ptr=torch.tensor([0, 8, 20]))))
    reads = {k: v for k, v in forward.items() if not k.endswith(":stream_seed")}
    assert reads == {"validation.py:sync": 5}, forward
    assert count_reads(lambda: out[0].square().sum().backward()) == {}


def even_sharp_head(n=512, V=8, k=8, inside=0.6):
    """Memberships 0.98 on cluster i % V for token i (V blocks of n / V
    tokens: at n / V = 64 each block one full tile), p = inside within a
    block: the tiles' cut part holds inside / V of the pairs."""
    top = (torch.arange(n) % V)[:, None, None].expand(n, 2, 1)
    memb = torch.full((n, 2, k), 0.02 / (k - 1)).scatter_(-1, top, 0.98)
    block = torch.zeros(2, k, k)
    block[:, range(V), range(V)] = inside / 0.98**2
    return memb, block


@pytest.mark.parametrize("exploration", [0.02, 0.12])
def test_auto_takes_the_tiles_where_they_hold_half_the_edges(exploration, monkeypatch):
    # Tiles of 64 hold 0.075 of the pairs in expectation; with the
    # exploration the call expects about 0.077 + delta: a share of 0.77 at
    # delta = 0.02 (the tiles), 0.38 at 0.12 (the edge path), both below
    # the CPU's dense crossover. The share reported is the expectation's.
    # (No least edge count: a GPU's would keep a call this small off them.)
    device = torch.get_default_device()
    if not dense_runs(device):
        pytest.skip("no dense-regime kernel on this device")
    pin_tiles_min_edges(monkeypatch, 0.0)
    from sbm_pyg.nn._regimes import TILES_MIN_SHARE
    from sbm_pyg.nn.block_model import expected_densities
    memb, block = (t.to(device) for t in even_sharp_head())
    x = torch.randn(512, 2, 4, generator=seeded(0), device=device)
    ptr = torch.tensor([0, 512], device=device)
    per = expected_densities(ptr, ptr, memb, block, memb).double() + exploration
    assert (per < backend_info.dense_crossover(device)[0]).all()
    share = float(0.075 / per.mean())
    options = SBMAttentionOptions(exploration=exploration)
    res = sbm_attention(x, x, x, (memb, block, memb), options=options,
                        generator=seeded(1), return_graph=True)
    if share >= TILES_MIN_SHARE:
        assert res.backends["attention"] == "tiles"
        assert float(res.backends["tile_share"]) == pytest.approx(share, abs=1e-3)
    else:
        assert res.backends["attention"] == backend_info.resolve_backend(
            "attention", "auto", device)
    assert (exploration == 0.02) == (res.backends["attention"] == "tiles")
    # What the tiles do not serve takes the edge path, without an error.
    near = dict(exploration=0.02)
    for kwargs, training, dropout in ((dict(sink=torch.zeros(2, device=device)), False, 0.0),
                                      (dict(return_attention_weights=True), False, 0.0),
                                      ({}, True, 0.1)):
        res = sbm_attention(x, x, x, (memb, block, memb), training=training,
                            options=SBMAttentionOptions(dropout=dropout, **near),
                            generator=seeded(1), **kwargs)
        assert res.backends["attention"] != "tiles", kwargs


def test_auto_keeps_the_edge_path_below_the_devices_least_tile_edges(monkeypatch):
    # The even sharp head's tiles hold about 0.075 * 512**2 * 2 = 39322
    # expected edges (a share of 0.77 at delta = 0.02): above a least count
    # of 39000 they are taken, below one of 40000 not; above the call's
    # 2 * 512**2 pairs they are not even weighed.
    import sbm_pyg.nn._sbm_attention as module
    device = torch.get_default_device()
    if not dense_runs(device):
        pytest.skip("no dense-regime kernel on this device")
    memb, block = (t.to(device) for t in even_sharp_head())
    x = torch.randn(512, 2, 4, generator=seeded(0), device=device)
    options = SBMAttentionOptions(exploration=0.02)
    weighed, took = [], []
    real = module.tiles_share
    monkeypatch.setattr(module, "tiles_share",
                        lambda *args: weighed.append(1) or real(*args))
    for least in (39000.0, 40000.0, 2 * 512**2 + 1.0):
        pin_tiles_min_edges(monkeypatch, least)
        took.append(sbm_attention(x, x, x, (memb, block, memb), options=options,
                                  generator=seeded(1)).backends["attention"])
    edges = backend_info.resolve_backend("attention", "auto", device)
    assert took == ["tiles", edges, edges] and len(weighed) == 2


def test_a_recorder_names_the_regime_of_each_graph(monkeypatch):
    # A layer whose heads are the sharp head takes the tiles under "auto"
    # (4 blocks of about 512 tokens: 64-token tiles fill 0.63 or more);
    # the recorder's graph is the SampledGraph the tiled regime returns.
    from benchmarks.sharp import sharp_conv
    from sbm_pyg.nn import GraphRecorder
    if not dense_runs(torch.get_default_device()):
        pytest.skip("no dense-regime kernel on this device")
    pin_tiles_min_edges(monkeypatch, 0.0)
    conv, x = sharp_conv(2048, 0.2, torch.get_default_device())
    with GraphRecorder(conv) as recorder:
        conv(x.detach(), generator=seeded(2))
    (layer, graph), = recorder.graphs
    assert recorder.backends == [conv.last_backends]
    assert conv.last_backends["attention"] == "tiles"
    assert graph.num_edges == pytest.approx(0.2 * 2 * 2048**2, rel=0.05)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_tiles_take_the_dense_regimes_precision(dtype, monkeypatch):
    # As the dense regime: the tiles' products in the precision PyTorch's
    # matmuls would take for the queries' dtype; on the same draws the
    # output is the float32 call's up to that dtype's rounding.
    device = torch.get_default_device()
    if not dense_runs(device):
        pytest.skip("no dense-regime kernel on this device")
    from sbm_pyg.ops.dense_attention import matmul_precision
    seen = []
    real = tiled_module.dense_attention

    def spy(*args, **kwargs):
        seen.append(kwargs["precision"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tiled_module, "dense_attention", spy)
    sbm = tuple(t.float() for t in tiled_case("sharp", False)[0])
    x = torch.randn(28, 2, 4, generator=seeded(0), device=device)
    options = SBMAttentionOptions(attention_backend="tiles", tile_size=4, tile_fill=0.1)
    out = [sbm_attention(y, y, y, sbm, ptr_q=PTR, ptr_k=PTR, options=options,
                         generator=seeded(3)).out for y in (x, x.to(dtype))]
    assert seen == [matmul_precision(torch.float32), matmul_precision(dtype)]
    assert out[1].dtype == dtype
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(out[1].float(), out[0], atol=tol, rtol=tol)


def test_auto_mixes_dense_pairs_and_tiles(monkeypatch):
    # Head 0 all in one cluster at p = 0.9 (dense above a crossover pinned
    # at 0.5), head 1 the even sharp head (its tiles hold 0.075 of its
    # pairs against 0.077 + 0.02 expected): the dense regime on head 0, the
    # tiled regime on head 1, their share head 1's alone. Output and every
    # gradient the edge path's on the graph returned.
    from tests.helpers import pin_crossover
    device = torch.get_default_device()
    if not dense_runs(device):
        pytest.skip("no dense-regime kernel on this device")
    pin_crossover(monkeypatch, 0.5)
    pin_tiles_min_edges(monkeypatch, 0.0)
    memb, block = (t.double() for t in even_sharp_head())
    memb[:, 0] = 0.0
    memb[:, 0, 0] = 1.0
    block[0] = 0.0
    block[0, 0, 0] = 0.9
    sbm = [t.to(device) for t in (memb, block, memb.clone())]
    g = seeded(0)
    inputs = [torch.randn(512, 2, 4, dtype=torch.float64, generator=g, device=device)
              for _ in range(3)]
    weight = torch.randn(512, 2, 4, dtype=torch.float64, generator=g, device=device)
    leaves = [x.clone().requires_grad_() for x in (*inputs, *sbm)]
    options = SBMAttentionOptions(exploration=0.02)
    tiled_keys = []  # the keys the tiles lay out (the dense part's are not its)
    real = tiled_module.dense_attention

    def spy(q, k, *args, **kwargs):
        tiled_keys.append(k.size(0))
        return real(q, k, *args, **kwargs)

    monkeypatch.setattr(tiled_module, "dense_attention", spy)
    res = sbm_attention(*leaves[:3], tuple(leaves[3:]), options=options,
                        return_graph=True, generator=seeded(1))
    (res.out * weight).sum().backward()
    assert res.backends["attention"] == "tiles" and res.backends["dense_pairs"] == "1/2"
    assert tiled_keys == [512]  # head 1's 8 blocks of 64 keys, none of head 0
    from sbm_pyg.nn.block_model import expected_densities
    ptr = torch.tensor([0, 512], device=device)
    per = float(expected_densities(ptr, ptr, *sbm)[0, 1]) + 0.02  # head 1's
    assert float(res.backends["tile_share"]) == pytest.approx(0.075 / per, abs=2e-3)
    density = res.graph.density()[0]
    assert 0.88 < float(density[0]) < 0.93 and 0.08 < float(density[1]) < 0.12
    want, want_grads = run(sparse_attention, res.graph, inputs, sbm, weight)
    assert torch.allclose(res.out, want, atol=1e-10)
    for leaf, b in zip(leaves, want_grads):
        assert torch.allclose(leaf.grad, b, atol=1e-10)
    torch.testing.assert_close(res.sampled_density.double(), density.double())
    # A budget of edges: the tiles take none, the edge path serves the
    # sparse head.
    capped = sbm_attention(*inputs, tuple(sbm), generator=seeded(1),
                           options=dataclasses.replace(options, max_edges=10**6))
    assert capped.backends["attention"] != "tiles"
    assert capped.backends["dense_pairs"] == "1/2"
