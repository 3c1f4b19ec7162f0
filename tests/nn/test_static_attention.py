"""Static calls (the options' capacity): no host read, the same operators
and shapes on every call, one graph for torch.compile, the overflow flag,
the checks on the device, and the attention over the sampled graph as
the sparse path computes it."""
from dataclasses import replace

import pytest
import torch
import torch._dynamo.utils
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import GINConv

from benchmarks.launches import count_reads
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import (
    SBMAttentionOptions,
    SBMConv,
    SBMGPSConv,
    SBMMultiheadAttention,
    sbm_attention,
)
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.sampling import round_capacity
from tests.helpers import seeded


class _Trace(TorchDispatchMode):
    # Each dispatched operator with the shapes and dtypes of its tensors.
    def __init__(self) -> None:
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple((tuple(a.shape), a.dtype) for a in args
                       if isinstance(a, torch.Tensor))
        self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


def layer(capacity=8192, num_clusters=4, **kwargs):
    torch.manual_seed(0)
    return SBMConv(16, 8, heads=2, num_clusters=num_clusters, capacity=capacity,
                   **kwargs).train()


# The static sampler's backends: "auto" is the C++ row sampler on the CPU
# (its operator reads host memory only, inside its kernel), "torch" the
# arrivals a GPU captures.
@pytest.mark.parametrize("sampler_backend", ["auto", "torch"])
def test_a_training_step_reads_nothing_and_keeps_its_operators_and_shapes(sampler_backend):
    conv = layer(sampler_backend=sampler_backend)
    x = torch.randn(96, 16)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([30, 26, 40]))

    def step():
        out = conv(x, batch, batch_size=3)
        (out.sum() + conv.expected_density.sum()).backward()

    step()
    traces = []
    for _ in range(5):
        with _Trace() as trace:
            step()
        traces.append(trace.ops)
    assert all(t == traces[0] for t in traces[1:])
    assert len(traces[0]) > 100
    assert count_reads(step) == {}
    assert not bool(conv.overflow)
    # The default layer's call reads (the edge count sizes its buffers).
    plain = layer(capacity=None)
    assert count_reads(lambda: plain(x, batch, batch_size=3).sum().backward())


@pytest.mark.parametrize("sampler_backend", ["auto", "torch"])
def test_torch_compile_traces_one_graph_and_matches_eager(sampler_backend):
    conv = layer(eval_seed=5, sampler_backend=sampler_backend)
    x = torch.randn(64, 16)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(conv, fullgraph=True, dynamic=False,
                             backend="aot_eager")
    for _ in range(4):
        compiled(x).sum().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]
    conv.eval()
    with torch.no_grad():
        assert torch.equal(compiled(x), conv(x))  # the same seed, the same graph


def test_the_output_and_gradients_are_the_sparse_attention_on_its_graph():
    g = seeded(0)
    N, H, D, k = 60, 2, 4, 3
    q, kk, v = (torch.randn(N, H, D, generator=g, requires_grad=True)
                for _ in range(3))
    memb = torch.rand(N, H, k, generator=g, requires_grad=True)
    block = torch.softmax(torch.randn(H, k * k, generator=g), -1).view(H, k, k)
    ptr = torch.tensor([0, 25, 60])
    opts = SBMAttentionOptions(capacity=round_capacity(4e4), exploration=0.05)
    res = sbm_attention(q, kk, v, (memb, block, memb), ptr_q=ptr, ptr_k=ptr,
                        options=opts, return_attention_weights=True,
                        generator=seeded(1))
    assert res.backends == {"sampler": "static", "attention": "cpp"}
    assert not bool(res.overflow) and res.alpha.numel() == res.graph.num_edges
    grads = torch.autograd.grad(res.out.square().sum(), (q, memb))
    out, alpha = sparse_attention(q, kk, v, res.graph, sbm=(memb, block, memb),
                                  return_attention_weights=True)
    assert torch.allclose(out, res.out) and torch.allclose(alpha, res.alpha)
    expect = torch.autograd.grad(out.square().sum(), (q, memb))
    for a, b in zip(grads, expect):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(res.sampled_density,
                          res.graph.density().mean(0).float())


def test_dropout_is_the_sparse_kernel_s_with_the_sampler_s_seed():
    # A static call's dropout seed is its sampler's, on the device: the
    # output is the sparse attention's on the same graph with that seed.
    g = seeded(3)
    N, H, D, k = 50, 2, 4, 3
    q, kk, v = (torch.randn(N, H, D, generator=g) for _ in range(3))
    memb = torch.rand(N, H, k, generator=g)
    block = torch.softmax(torch.randn(H, k * k, generator=g), -1).view(H, k, k)
    opts = SBMAttentionOptions(capacity=round_capacity(4e4), exploration=0.1,
                               dropout=0.5)
    seed = torch.tensor(12345)
    res = sbm_attention(q, kk, v, (memb, block, memb), options=opts,
                        training=True, seed=seed, return_graph=True)
    assert not bool(res.overflow) and res.graph.num_edges > 200
    want = sparse_attention(q, kk, v, res.graph, dropout=0.5, training=True,
                            dropout_seed=seed)
    assert torch.equal(res.out, want)
    # Half the weights dropped: not the output without dropout, nor another
    # seed's; out of training, none dropped.
    plain = sparse_attention(q, kk, v, res.graph)
    other = sparse_attention(q, kk, v, res.graph, dropout=0.5, training=True,
                             dropout_seed=seed + 1)
    assert not torch.allclose(res.out, plain) and not torch.allclose(want, other)
    res = sbm_attention(q, kk, v, (memb, block, memb), options=opts, seed=seed,
                        return_graph=True)
    assert torch.equal(res.out, sparse_attention(q, kk, v, res.graph))


def test_a_layer_with_dropout_compiles_as_one_graph_and_draws_new_masks():
    conv = layer(dropout=0.3)
    x = torch.randn(48, 16, generator=seeded(7))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(conv, fullgraph=True, dynamic=False,
                             backend="aot_eager")
    outs = []
    for _ in range(3):
        out = compiled(x)
        out.sum().backward()
        outs.append(out.detach())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]
    assert not torch.equal(outs[0], outs[1])  # a new graph and mask a call
    assert count_reads(lambda: conv(x).sum().backward()) == {}


def test_an_overflow_is_flagged_and_the_call_still_runs():
    conv = layer(capacity=16)
    out = conv(torch.randn(64, 16))
    assert bool(conv.overflow) and float(conv.expected_draws) > 16
    assert torch.isfinite(out).all()
    assert float(conv.sampled_density.sum()) * 64 * 64 <= 16 + 2 * 64


def test_a_failed_check_raises_on_the_device():
    conv = layer()
    x = torch.randn(20, 16)
    x[3, 0] = float("nan")
    with pytest.raises(RuntimeError, match="q_memb must be finite"):
        conv(x)
    with pytest.raises(RuntimeError, match="ptr_q must"):
        conv(torch.randn(20, 16), ptr=torch.tensor([0, 12, 9, 20]))
    # p_ij > 1 on a quarter of the pairs, a mean of 0.45: exact mode refuses.
    N = 40
    memb = torch.zeros(N, 1, 2)
    memb[: N // 2, 0, 0] = memb[N // 2:, 0, 1] = 1.0
    block = torch.tensor([[[1.5, 0.1], [0.1, 0.1]]])
    x = torch.randn(N, 1, 4)
    with pytest.raises(RuntimeError, match="a sampled pair has p_ij > 1"):
        sbm_attention(x, x, x, (memb, block, memb),
                      options=SBMAttentionOptions(capacity=40_000))


@pytest.mark.parametrize("change", [
    dict(attention_backend="dense"), dict(attention_backend="tiles"),
    dict(attention_backend="torch"), dict(sampler_backend="triton")])
def test_what_a_static_call_cannot_serve_is_refused_by_name(change):
    name = next(iter(change))
    with pytest.raises(ValueError, match=f"capacity.*{name}"):
        replace(SBMAttentionOptions(capacity=64), **change)


def test_max_edges_bounds_a_static_call_s_capacity():
    assert SBMAttentionOptions(capacity=64, max_edges=64).capacity == 64
    with pytest.raises(ValueError, match=r"capacity \(65\) exceeds max_edges \(64\)"):
        SBMAttentionOptions(capacity=65, max_edges=64)
    # Within it, the call is the one without it.
    memb = torch.rand(30, 2, 3, generator=seeded(1)).softmax(-1)
    block = torch.rand(2, 3, 3, generator=seeded(2)) / 3
    x = torch.randn(30, 2, 4, generator=seeded(3))
    runs = [sbm_attention(x, x, x, (memb, block, memb), options=SBMAttentionOptions(
        capacity=2048, max_edges=limit), seed=torch.tensor(5)) for limit in (None, 2048)]
    assert torch.equal(runs[0].out, runs[1].out) and not bool(runs[1].overflow)


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SBMAttentionOptions(capacity=capacity)


def test_bad_seed_and_custom_attention():
    x = torch.randn(10, 1, 4)
    memb = torch.rand(10, 1, 2)
    block = torch.full((1, 2, 2), 0.25)
    opts = SBMAttentionOptions(capacity=256)
    with pytest.raises(TypeError, match="seed"):
        sbm_attention(x, x, x, (memb, block, memb), options=opts,
                      seed=torch.tensor(1.0))
    with pytest.raises(ValueError, match="message_passing"):
        sbm_attention(x, x, x, (memb, block, memb), options=opts,
                      attend=lambda graph, weights: (x, None))
    with pytest.raises(ValueError, match="expected_draws"):
        round_capacity(float("nan"))


def test_round_capacity_steps():
    assert round_capacity(0.0) == 64
    assert round_capacity(1000.0) == 1536  # 1000 + 8 * 31.6 + 64 = 1317
    caps = {round_capacity(float(m)) for m in range(10_000, 12_000, 10)}
    assert len(caps) <= 2  # few shapes while the mean moves 20%


def _around(which, capacity=16384):
    # A layer or model that holds SBMConv, with capacity, and its loss.
    torch.manual_seed(0)
    sbm = dict(num_clusters=4, capacity=capacity)
    if which == "multihead":
        attn = SBMMultiheadAttention(16, heads=2, head_channels=8, **sbm)
        x = torch.randn(3, 20, 16)
        return attn, lambda m: m(x).square().mean()
    if which == "gps":
        gps = SBMGPSConv(16, GINConv(torch.nn.Linear(16, 16)), heads=2,
                         attn_kwargs=sbm)
        x = torch.randn(50, 16)
        edge_index = torch.randint(0, 25, (2, 80))
        edge_index[:, 40:] += 25  # within each graph
        batch = torch.arange(2).repeat_interleave(25)
        return gps, lambda m: m(x, edge_index, batch, batch_size=2).square().mean()
    net = SBMTransformer(16, 64, channels=16, num_layers=2, heads=2, **sbm)
    tokens = torch.randint(16, (2, 64))
    label = torch.tensor([1, 3])

    def loss(m):  # the LRA step's loss, its density penalty included
        out = m(tokens, output="sequence")
        return (torch.nn.functional.cross_entropy(out.seq_logits, label)
                + 0.1 * out.density_loss)
    return net, loss


@pytest.mark.parametrize("which", ["multihead", "gps", "transformer"])
def test_the_layers_and_the_model_around_it_compile_as_one_graph(which):
    module, loss = _around(which)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(module, fullgraph=True, dynamic=False,
                             backend="aot_eager")
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    for _ in range(4):  # training steps: forward and loss compiled
        optimizer.zero_grad()
        loss(compiled).backward()
        optimizer.step()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]


@pytest.mark.parametrize("which", ["multihead", "gps", "transformer"])
def test_automatic_capacities_compile_after_one_eager_step(which):
    module, loss = _around(which, capacity="auto")
    loss(module).backward()  # eagerly: each layer's first call reads once
    convs = [m for m in module.modules() if isinstance(m, SBMConv)]
    assert convs and all(m.capacity == "auto" for m in convs)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(module, fullgraph=True, dynamic=False,
                             backend="aot_eager")
    for _ in range(3):
        loss(compiled).backward()
        capacities = [m.update_capacity() for m in convs]  # between steps
        assert all(c is not None for c in capacities)
        assert not any(bool(m.overflow) for m in convs)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]


@pytest.mark.slow  # inductor generates and compiles C++: about two minutes
def test_inductor_computes_what_eager_does():
    # The default backend (inductor's own kernels, not only the trace):
    # a training step from the same global seed draws the same graph, so
    # the output and every gradient match eager's; a seeded evaluation is
    # the same graph and, here, the same values to the last bit.
    conv = layer(eval_seed=5)
    x = torch.randn(64, 16, generator=seeded(3))
    torch._dynamo.reset()
    compiled = torch.compile(conv, fullgraph=True, dynamic=False)
    results = []
    for module in (compiled, conv):
        conv.zero_grad()
        torch.manual_seed(11)
        out = module(x)
        out.square().sum().backward()
        results.append([out.detach(), *(p.grad.clone() for p in conv.parameters())])
    assert not bool(conv.overflow)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    conv.eval()
    with torch.no_grad():
        assert torch.equal(compiled(x), conv(x))


def _masked(capacity, **kwargs):
    torch.manual_seed(0)
    return SBMMultiheadAttention(16, heads=2, head_channels=8, num_clusters=4,
                                 capacity=capacity, **kwargs).train()


def test_a_masked_static_call_attends_the_real_tokens_alone():
    # Every pair sampled (exact mode, exploration 1): the static call's
    # graph is each row's real tokens, all of them, so it computes what the
    # default route computes on the real tokens gathered; the padding,
    # wherever it sits in a row, neither sends nor receives.
    x = torch.randn(3, 12, 16, generator=seeded(3), requires_grad=True)
    mask = torch.rand(3, 12, generator=seeded(4)) < 0.6
    mask[:, 5] = True  # no row without a real token
    outs, grads = [], []
    for capacity in (4096, None):
        attn = _masked(capacity, mode="exact", exploration=1.0)
        out = attn(x, mask=mask)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), x)[0])
        assert torch.allclose(attn.conv.sampled_density, torch.ones(2))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0], grads[1])
    assert outs[0][~mask].eq(0).all() and grads[0][~mask].eq(0).all()


def test_a_masked_static_call_reads_nothing_and_keeps_its_shapes():
    attn = _masked(4096)
    x = torch.randn(2, 20, 16)
    masks = [torch.arange(20)[None] < torch.tensor([[20], [7]]),
             torch.arange(20)[None] < torch.tensor([[3], [15]]),
             torch.rand(2, 20, generator=seeded(5)) < 0.5]
    attn(x, mask=masks[0]).sum().backward()  # the gradients made: then added to
    traces = []
    for mask in masks:
        with _Trace() as trace:
            attn(x, mask=mask).sum().backward()
        traces.append(trace.ops)
        assert count_reads(lambda m=mask: attn(x, mask=m).sum().backward()) == {}
        assert not bool(attn.conv.overflow)
    assert traces[1] == traces[0] and traces[2] == traces[0]
    # The densities are the real tokens': the padding's sequences hold no pair.
    attn.conv.eval()
    lengths = torch.tensor([[20], [7]])
    with torch.no_grad():
        attn(x, mask=torch.arange(20)[None] < lengths, generator=seeded(6))
    expected = attn.conv.expected_density
    attn.conv.capacity = None
    with torch.no_grad():
        attn(x, mask=torch.arange(20)[None] < lengths, generator=seeded(6))
    torch.testing.assert_close(expected, attn.conv.expected_density)


def test_a_masked_static_call_compiles_as_one_graph():
    attn = _masked(4096)
    x = torch.randn(2, 20, 16)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(attn, fullgraph=True, dynamic=False, backend="aot_eager")
    for length in (20, 9, 14, 1):  # a new mask, the same graph
        mask = torch.arange(20)[None] < torch.tensor([[20], [length]])
        compiled(x, key_padding_mask=~mask).square().mean().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]


def test_a_masked_static_call_refuses_a_row_without_a_real_token():
    attn = _masked(4096)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(RuntimeError, match="without a real token"):
        attn(torch.randn(2, 6, 16), mask=mask)


def test_a_masked_static_call_refuses_self_loops_by_name():
    attn = _masked(4096, self_loops=True)
    x = torch.randn(2, 6, 16)
    attn(x)  # without a mask, one sequence a row: served
    with pytest.raises(ValueError, match="self_loops"):
        attn(x, mask=torch.ones(2, 6, dtype=torch.bool))


def test_a_static_call_serves_the_sharp_form_at_full_width():
    # The sharp form's memberships are zero off each token's top clusters;
    # a static call keeps all k (no read of the width kept), which changes
    # no probability: with every pair sampled (exact mode, exploration 1)
    # it computes the default route's output and gradients, and a training
    # step reads nothing.
    x = torch.randn(40, 16, generator=seeded(3))
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor([15, 25]))
    outs, grads = [], []
    for capacity in (8192, None):
        conv = layer(capacity=capacity, num_clusters=8, sbm_parametrization="sharp",
                     mode="exact", exploration=1.0)
        out = conv(x, batch, batch_size=2)
        outs.append(out)
        loss = out.square().sum() + conv.expected_density.sum()
        grads.append(torch.autograd.grad(loss, list(conv.parameters())))
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    conv = layer(num_clusters=8, sbm_parametrization="sharp")
    conv(x, batch, batch_size=2).sum().backward()
    assert count_reads(lambda: conv(x, batch, batch_size=2).sum().backward()) == {}
