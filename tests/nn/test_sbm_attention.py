"""sbm_attention: one function for the whole SBM attention, its regime
chosen per (sequence, head)."""
import dataclasses

import pytest
import torch

from sbm_pyg.nn import SBMAttentionOptions, SBMConv, sbm_attention
from sbm_pyg.ops import backend_info
from tests.helpers import TEST_DEVICE, kernels_ran, seeded

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


REQUESTS = ("include_edges", "return_graph", "return_attention_weights", "sink")


def call(leaves, ptr, seed, **kwargs):
    # kwargs: sbm_attention's requests, and the options' fields
    q, k, v, memb, block = leaves
    requests = {name: kwargs.pop(name) for name in REQUESTS if name in kwargs}
    return sbm_attention(q, k, v, (memb, block, memb), ptr_q=ptr, ptr_k=ptr,
                         options=SBMAttentionOptions(**kwargs),
                         generator=seeded(seed), **requests)


def test_each_sequence_runs_its_regime():
    ptr, leaves = inputs()
    res = call(leaves, ptr, 5, exploration=0.01)
    device = torch.get_default_device()
    sparse = backend_info.resolve_backend("attention", "auto", device)
    assert kernels_ran(res.backends) == {"sampler": backend_info.resolve_backend(
        "sampler", "auto", device), "attention": sparse,
        "dense_pairs": f"{H}/{2 * H}"}
    # Sequence 0: the dense kernel on it alone; sequence 2: the sparse path
    # on the whole batch (its rows read the same streams), from one
    # generator in that order.
    g = seeded(5)
    n0 = SIZES[0]
    q, k, v, memb, block = leaves
    dense = sbm_attention(q[:n0], k[:n0], v[:n0], (memb[:n0], block, memb[:n0]),
                          generator=g, options=SBMAttentionOptions(
                              exploration=0.01, attention_backend="dense"))
    rest = sbm_attention(q, k, v, (memb, block, memb), ptr_q=ptr, ptr_k=ptr,
                         generator=g, options=SBMAttentionOptions(
                             exploration=0.01, attention_backend=sparse))
    assert dense.backends["attention"] == "dense"
    torch.testing.assert_close(res.out[:n0], dense.out)
    torch.testing.assert_close(res.out[n0:], rest.out[n0:])
    # Sequence 0 is all edges; the densities average the non-empty ones:
    # (1 + d_2) / 2 with d_2 >= 0 (sequence 2 draws about 4 edges a head
    # and may draw none), where the mean over all three would be below 1/2.
    assert float(res.sampled_density.min()) >= 0.5
    # Gradients reach every input through both regimes.
    grads = torch.autograd.grad(res.out.square().sum()
                                + res.expected_density.sum(), leaves)
    for grad in grads:
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_heads_of_one_sequence_run_their_own_regimes():
    # Head 0 dense (memberships 1), head 1 sparse (0.01), in every sequence:
    # the dense head is the dense kernel's over the batch, the sparse one
    # has the sampler's few edges, and no edge crosses to the other head.
    ptr, leaves = inputs(requires_grad=False)
    memb = leaves[3].clone()
    memb[:, 0], memb[:, 1] = 1.0, 0.01
    leaves[3] = memb
    res = call(leaves, ptr, 3, return_attention_weights=True)
    assert res.backends["dense_pairs"] == "2/4"
    counts = res.graph.edge_counts()
    sizes = torch.tensor(SIZES)
    assert torch.equal(counts[:, 0], sizes ** 2)  # p = 1: every pair
    assert int(counts[:, 1].sum()) < 0.05 * int((sizes ** 2).sum())
    torch.testing.assert_close(res.sampled_density[0],
                               torch.ones((), dtype=res.sampled_density.dtype))
    ref = call(leaves, ptr, 3)  # the same draws without weights
    torch.testing.assert_close(res.out, ref.out)
    q, k, v, memb, block = leaves
    dense_head = sbm_attention(
        q[:, :1], k[:, :1], v[:, :1], (memb[:, :1], block[:1], memb[:, :1]),
        ptr_q=ptr, ptr_k=ptr, generator=seeded(3),
        options=SBMAttentionOptions(attention_backend="dense"))
    torch.testing.assert_close(res.out[:, 0], dense_head.out[:, 0])


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


def test_a_sink_in_both_regimes():
    # Sequence 0 runs the dense kernel, whose log-sum-exp takes the sink;
    # asked for the weights, the same draws go through the sparse kernel:
    # the same output and gradients, and the rows' weights leave out the
    # sink's share.
    ptr, leaves = inputs()
    sink = torch.tensor([0.5, -1.0], requires_grad=True)
    results = []
    for weights in (False, True):
        res = call(leaves, ptr, 7, sink=sink, return_attention_weights=weights)
        loss = (res.out * torch.randn(res.out.shape, generator=seeded(2))).sum()
        results.append((res, torch.autograd.grad(loss, [*leaves, sink])))
    (plain, grads), (weighted, ref_grads) = results
    assert plain.backends["dense_pairs"] == f"{H}/{2 * H}"
    torch.testing.assert_close(plain.out, weighted.out)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, b, msg=name)
    torch.testing.assert_close(grads[-1], ref_grads[-1])
    assert bool(grads[-1].abs().min() > 0)
    no_sink = call(leaves, ptr, 7)
    assert not torch.allclose(plain.out, no_sink.out)
    graph = weighted.graph
    sums = torch.zeros(H * int(ptr[-1])).index_add_(
        0, graph.csr.row().long(), weighted.alpha.detach())
    has = graph.rowptr.diff() > 0
    assert bool((sums[has] < 1).all() and (sums[has] > 0).all())
    with pytest.raises(ValueError, match="sink must have one logit per head"):
        call(leaves, ptr, 7, sink=torch.zeros(3))


def test_one_regime_needs_no_split():
    # An empty sequence joins the other regime; a dense-only batch runs the
    # dense kernel alone.
    ptr, leaves = inputs()
    n0 = SIZES[0]
    q, k, v, memb, block = (t[:n0] if t.dim() == 3 else t for t in leaves)
    res = sbm_attention(q, k, v, (memb, block, memb),
                        ptr_q=torch.tensor([0, n0, n0]),
                        ptr_k=torch.tensor([0, n0, n0]), generator=seeded(1))
    assert kernels_ran(res.backends) == {"sampler": "dense", "attention": "dense"}


def test_max_edges_counts_both_regimes():
    ptr, leaves = inputs(requires_grad=False)
    pairs = H * SIZES[0] ** 2  # the dense pairs' pairs
    with pytest.raises(ValueError, match="max_edges"):
        call(leaves, ptr, 0, max_edges=pairs - 1)
    with pytest.raises(ValueError, match="max_edges"):
        call(leaves, ptr, 0, max_edges=pairs, exploration=1.0)


def test_options_default_and_are_checked_when_built():
    ptr, leaves = inputs(requires_grad=False)
    q, k, v, memb, block = leaves
    # options=None is the defaults, draw for draw
    default = sbm_attention(q, k, v, (memb, block, memb), ptr_q=ptr,
                            ptr_k=ptr, generator=seeded(2))
    torch.testing.assert_close(default.out, call(leaves, ptr, 2).out)
    with pytest.raises(TypeError, match="options must be"):
        sbm_attention(q, k, v, (memb, block, memb), options={"mode": "exact"})
    with pytest.raises(TypeError, match="sbm must be"):
        sbm_attention(q, k, v, memb)


def test_sbm_shapes_are_checked_against_the_inputs():
    ptr, leaves = inputs(requires_grad=False)
    q, k, v, memb, block = leaves
    wider = torch.cat([memb, memb[..., :1]], -1)
    for sbm in ((wider, block, memb), (memb, block, wider),
                (memb, block[..., :-1], memb), (memb[1:], block, memb[1:]),
                (memb[:, :1], block[:1], memb[:, :1])):
        with pytest.raises(ValueError, match=r"sbm must be \(q_memb \[N_q, H, k\]"):
            sbm_attention(q, k, v, sbm, ptr_q=ptr, ptr_k=ptr)
    with pytest.raises(ValueError, match="sbm's block must have 3 dimensions"):
        sbm_attention(q, k, v, (memb, block[0], memb), ptr_q=ptr, ptr_k=ptr)


@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_exact_mode_refuses_probabilities_above_one(backend):
    ptr, leaves = inputs(requires_grad=False)
    q, k, v, memb, _ = leaves
    # p = 1 on sequence 0 (memberships 1, a block summing to 1) is allowed.
    call(leaves, ptr, 0, mode="exact", attention_backend=backend)
    # Twice that block: sequence 0's p_ij = 2, in both regimes.
    twice = (leaves[3], 2 * leaves[4])
    with pytest.raises(ValueError, match="must not exceed 1"):
        call([q, k, v, *twice], ptr, 0, mode="exact", attention_backend=backend)
    # A rate in the Poisson mode.
    res = call([q, k, v, *twice], ptr, 0, mode="poisson", attention_backend=backend)
    assert float(res.expected_density.max()) > 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(ste="clip"), "ste must be"),
    (dict(attention_backend="flash"), "attention_backend must be"),
    (dict(sampler_backend="dense"), "sampler_backend must be"),
    (dict(max_edges=-1), "max_edges must be"),
    (dict(max_edges=2.5), "max_edges must be"),
    (dict(mode="bernoulli"), "mode must be"),
    (dict(exploration=float("nan")), "exploration must be"),
    (dict(exploration=True), "exploration must be"),
    (dict(dropout=1.0), "dropout must be"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SBMAttentionOptions(**kwargs)
    with pytest.raises(TypeError, match="self_loops must be"):
        SBMAttentionOptions(self_loops=1)


def test_options_are_frozen_and_replaced_with_a_check():
    opts = SBMAttentionOptions(mode="poisson")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.mode = "exact"
    assert dataclasses.replace(opts, dropout=0.5).dropout == 0.5
    with pytest.raises(ValueError, match="dropout must be"):
        dataclasses.replace(opts, dropout=-0.1)


def test_layer_runs_the_dense_regime_where_dense():
    torch.manual_seed(0)
    conv = SBMConv(8, D, heads=H, num_clusters=K, sbm_init="dense")
    conv(torch.randn(20, 8), ptr=torch.tensor([0, 10, 20]))
    assert kernels_ran(conv.last_backends) == {"sampler": "dense",
                                               "attention": "dense"}


def test_self_loops_and_included_pairs_reach_both_regimes():
    ptr, leaves = inputs(requires_grad=False)
    N = int(ptr[-1])
    # (key, query) pairs: one in the dense sequence, two in the sparse one
    include = torch.tensor([[3, 20, 31], [1, 25, 12]])
    res = call(leaves, ptr, 4, self_loops=True, include_edges=include,
               return_graph=True)
    assert res.backends["dense_pairs"] == "2/4"
    j, i = res.graph.edge_index
    got = set(zip(res.graph.head.tolist(), i.tolist(), j.tolist()))
    for h in range(H):
        assert all((h, n, n) in got for n in range(N))  # self-loops
        assert all((h, int(q), int(k)) in got for k, q in include.t())
    torch.testing.assert_close(
        res.sampled_density,
        (res.graph.edge_counts().double() / (torch.tensor(SIZES) ** 2)
         .clamp(min=1)[:, None])[[0, 2]].mean(0).to(res.sampled_density.dtype))


# One forward reads to the host once: the sync that raises the inputs'
# checks and reads the sizes of what is allocated next (the sampler's draws,
# the dense regime's mask) with the regime's choice. Reads of the CPU
# generator's stream seed are host memory (on CUDA the seed is mixed from
# the generator's seed and offset, no read); on CUDA the Triton sampler
# reads its edge count once more (the dense kernel takes its mask's size
# from the sync). A batch of both regimes reads more and is not counted
# here.
@pytest.mark.parametrize("crossover,options,regime", [
    (float("inf"), {}, "sparse"),
    (0.0, {}, "dense"),
    (float("inf"), dict(attention_backend="dense"), "dense"),
    (0.0, dict(sampler_backend="cpp", attention_backend="cpp"), "sparse"),
    (float("inf"), dict(mode="exact", include_input_edges=True), "sparse"),
])
def test_one_host_read_per_forward_none_in_backward(crossover, options,
                                                     regime, monkeypatch):
    from benchmarks.launches import count_reads
    from tests.helpers import pin_crossover
    pin_crossover(monkeypatch, crossover)
    device = torch.get_default_device()
    if device.type != "cpu" and options.get("sampler_backend") == "cpp":
        pytest.skip("the C++ kernels are the CPU's")
    torch.manual_seed(0)
    include = options.pop("include_input_edges", False)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, dropout=0.1,
                   **options).train()
    x = torch.randn(20, 8, requires_grad=True)
    ptr = torch.tensor([0, 8, 20])
    edges = torch.tensor([[0, 1, 9], [1, 2, 10]]) if include else None
    g = seeded(0)
    out = []
    forward = count_reads(lambda: out.append(
        conv(x, ptr=ptr, include_edges=edges, generator=g)))
    assert (conv.last_backends["sampler"] == "dense") == (regime == "dense")
    # Sized by a read of their own: the Triton kernels' outputs, and the
    # included pairs' distinct count (torch.unique's on CUDA).
    sizing = {"sampling/fastrg_triton.py", "ops/triton_dense.py",
              "sampling/edges.py"}
    reads = {k: v for k, v in forward.items()
             if not k.endswith(":stream_seed")}
    assert reads.pop("validation.py:sync") == 1, forward
    assert sum(reads.values()) <= (device.type == "cuda" and regime == "sparse") + include, forward
    assert all(k.split(":")[0] in sizing for k in reads), forward
    assert count_reads(lambda: out[0].square().sum().backward()) == {}
    assert x.grad is not None and any(p.grad is not None for p in conv.sbm.parameters())


def test_a_mixed_batch_reads_the_host_four_times_and_never_backward():
    # The choice's sync; the split's (its sizes, the dense part's guard and
    # mask size, the pair counts); the sampler's; and the kept count of the
    # sampler's graph without the dense pairs' edges (exploration puts some
    # there). On CUDA the Triton sampler reads its edge count too.
    from benchmarks.launches import count_reads
    ptr, leaves = inputs()
    out = []
    forward = count_reads(lambda: out.append(call(leaves, ptr, 3, exploration=0.1)))
    assert out[0].backends["dense_pairs"] == "2/4"
    reads = {k: v for k, v in forward.items() if not k.endswith(":stream_seed")}
    assert reads.pop("validation.py:sync") == 4, forward
    cuda = torch.get_default_device().type == "cuda"
    assert sum(reads.values()) == (cuda and "cpp" not in out[0].backends["sampler"])
    assert count_reads(lambda: out[0].out.square().sum().backward()) == {}


# A batch vector with its size (PyG's Batch.num_graphs) reads nothing more:
# its checks go to the forward's one sync, in the sampled regime, the dense
# warm-up and the GPS layer around the attention.
@pytest.mark.parametrize("layer", ["sampled", "warm-up", "gps"])
def test_a_batch_vector_with_its_size_reads_once(layer, monkeypatch):
    from torch_geometric.nn import GINConv

    from benchmarks.launches import count_reads
    from sbm_pyg.nn import SBMGPSConv
    from tests.helpers import pin_crossover
    pin_crossover(monkeypatch, float("inf"))
    torch.manual_seed(0)
    batch = torch.tensor([0] * 8 + [1] * 12)
    x = torch.randn(20, 8, requires_grad=True)
    if layer == "gps":
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        module = SBMGPSConv(8, GINConv(mlp), heads=2,
                            attn_kwargs=dict(num_clusters=3)).train()
        edge_index = torch.tensor([[0, 1, 9], [1, 2, 10]])
        run = lambda: module(x, edge_index, batch, batch_size=2,  # noqa: E731
                             generator=seeded(0))
    else:
        module = SBMConv(8, 4, heads=2, num_clusters=3, dropout=0.1).train()
        module.attend_all = layer == "warm-up"
        run = lambda: module(x, batch, batch_size=2, generator=seeded(0))  # noqa: E731
    out = []
    forward = count_reads(lambda: out.append(run()))
    reads = {k: v for k, v in forward.items() if not k.endswith(":stream_seed")}
    assert reads.pop("validation.py:sync") == 1, forward
    device = torch.get_default_device()
    sizing = {"sampling/fastrg_triton.py", "ops/triton_dense.py"}
    assert sum(reads.values()) <= (device.type == "cuda" and layer != "warm-up"), forward
    assert all(k.split(":")[0] in sizing for k in reads), forward
    assert count_reads(lambda: out[0].square().sum().backward()) == {}
    # Without the size the batch vector costs one read more.
    without = count_reads(lambda: module(x, batch, generator=seeded(0)) if layer != "gps"
                          else module(x, edge_index, batch, generator=seeded(0)))
    assert without["validation.py:sync"] == 2, without


# On a GPU, CUDA itself counts the syncs (its sync debug mode warns at each
# synchronizing call, host-to-device copies of host scalars included, which
# the CPU's count of reads cannot see): the forward's one sync, and on the
# sampled path the Triton sampler's read of its edge count; none in the
# backward. A warning CUDA reports late names a later call, so where a sync
# comes from is asked of its "error" mode, the explicit reads let through.
@pytest.mark.skipif(TEST_DEVICE.type != "cuda", reason="counts CUDA's syncs")
@pytest.mark.parametrize("layer", [
    pytest.param("sampled", marks=pytest.mark.xfail(
        strict=False, reason="one more sync inside fastrg_op.draw besides the "
        "edge count's read (docs/performance.md, host syncs)")),
    "dense", "warm-up"])
def test_cuda_syncs_of_a_forward_and_a_backward(layer, monkeypatch):
    from benchmarks.gpu.syncs import count_syncs, hidden_sync
    from tests.helpers import pin_crossover
    pin_crossover(monkeypatch, 0.0 if layer == "dense" else float("inf"))
    torch.manual_seed(0)
    batch = torch.tensor([0] * 8 + [1] * 12)
    x = torch.randn(20, 8, requires_grad=True)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, dropout=0.1).train()
    conv.attend_all = layer == "warm-up"
    g = seeded(0)
    conv(x, batch, batch_size=2, generator=g).sum().backward()  # warm-up
    out = []
    forward = count_syncs(lambda: out.append(conv(x, batch, batch_size=2,
                                                  generator=g)))
    assert sum(forward.values()) == 1 + (layer == "sampled"), forward
    assert hidden_sync(lambda: conv(x, batch, batch_size=2, generator=g)) is None
    assert count_syncs(lambda: out[0].square().sum().backward()) == {}
