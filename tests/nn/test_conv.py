import typing
import warnings

import pytest
import torch
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor

from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.sampling import expected_adjacency
from tests.helpers import kernels_ran, pin_crossover, seeded
from tests.markers import needs_cpp

BATCH = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])
PTR = torch.tensor([0, 3, 7, 9])


def make_conv(**kwargs):
    torch.manual_seed(0)
    kwargs.setdefault("num_clusters", 4)
    return SBMConv(8, 4, heads=2, **kwargs)


def run(conv, x, seed=0, **kwargs):
    return conv(x, generator=seeded(seed), **kwargs)


def x_input(n=9, channels=8, seed=1):
    return torch.randn(n, channels, generator=seeded(seed))


def sparse_only(monkeypatch):
    """"auto" below the dense kernel's crossover at any density: the test
    is about the sampler and the sparse kernels."""
    pin_crossover(monkeypatch, float("inf"))


@pytest.mark.parametrize("concat,root_weight,shape", [
    (True, True, (9, 8)), (False, True, (9, 4)), (True, False, (9, 8)),
])
def test_shapes(concat, root_weight, shape):
    conv = make_conv(concat=concat, root_weight=root_weight)
    assert run(conv, x_input(), batch=BATCH).shape == shape


def test_repr():
    assert repr(make_conv()) == ("SBMConv(8, 4, heads=2, num_clusters=4, "
                                 "mode='exact', ste='paper')")
    assert repr(SBMConv((8, 6), 4, num_clusters=2, mode="exact",
                        ste="published")) == \
        "SBMConv((8, 6), 4, heads=1, num_clusters=2, mode='exact', ste='published')"


def test_reset_parameters():
    conv = make_conv()
    torch.manual_seed(5)
    conv.reset_parameters()
    first = {n: p.clone() for n, p in conv.named_parameters()}
    torch.manual_seed(5)
    conv.reset_parameters()
    assert all(torch.equal(first[n], p) for n, p in conv.named_parameters())
    conv.reset_parameters()
    assert not torch.equal(first["sbm.clusters"], conv.sbm.clusters)


def test_determinism_under_generator():
    conv = make_conv()
    x = x_input()
    a, (ga, _) = run(conv, x, seed=3, batch=BATCH, return_attention_weights=True)
    b, (gb, _) = run(conv, x, seed=3, batch=BATCH, return_attention_weights=True)
    c, (gc, _) = run(conv, x, seed=4, batch=BATCH, return_attention_weights=True)
    assert torch.equal(a, b) and torch.equal(ga.edge_index, gb.edge_index)
    assert not torch.equal(ga.edge_index, gc.edge_index)


def test_batch_and_ptr_agree_and_no_edge_crosses_sequences():
    conv = make_conv()
    x = x_input()
    out_b, (graph, alpha) = run(conv, x, batch=BATCH, return_attention_weights=True)
    out_p = run(conv, x, ptr=PTR)
    # Where "auto" runs the dense kernel, the weights come from the sparse
    # kernel on its graph: the same output up to rounding.
    torch.testing.assert_close(out_b, out_p, rtol=1e-5, atol=1e-6)
    j, i = graph.edge_index
    assert graph.num_edges > 0 and torch.equal(BATCH[i], BATCH[j])
    # alpha sums to 1 over each (head, query) that has edges.
    sums = torch.zeros(2 * 9).index_add_(0, graph.head * 9 + i, alpha)
    has = graph.rowptr.diff() > 0
    assert torch.allclose(sums[has], torch.ones(int(has.sum())))


def test_bipartite_input():
    torch.manual_seed(0)
    conv = SBMConv((8, 6), 4, heads=2, num_clusters=3)
    x_src, x_dst = x_input(5, 8), x_input(7, 6)
    batch = (torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    out, (graph, _) = run(conv, (x_src, x_dst), batch=batch,
                          return_attention_weights=True)
    assert out.shape == (7, 8)
    assert (graph.num_queries, graph.num_keys) == (7, 5)
    j, i = graph.edge_index
    assert torch.equal(batch[1][i], batch[0][j])


@pytest.mark.parametrize("ste,parametrization,sink", [
    ("paper", "paper", False), ("published", "paper", False),
    ("paper", "mmsb", False), ("paper", "mmsb", True), ("paper", "sharp", True)])
def test_fused_path_equals_pyg_message_passing(monkeypatch, ste,
                                               parametrization, sink):
    sparse_only(monkeypatch)
    conv = make_conv(dropout=0.0, ste=ste,
                     sbm_parametrization=parametrization, sink=sink)
    if sink:  # each head's own logit, its gradient compared below
        with torch.no_grad():
            conv.sink.copy_(torch.tensor([0.4, -0.8]))
    assert conv.attention_backend == "auto"
    x = x_input().requires_grad_()
    with monkeypatch.context() as m:  # the fused path must not call message()
        m.setattr(conv, "message", None)
        out_fused, (g1, a1) = run(conv, x, batch=BATCH, return_attention_weights=True)
    grads_fused = torch.autograd.grad(out_fused.pow(2).sum(), [x] + list(conv.parameters()))
    conv.attention_backend = "message_passing"
    calls = []
    message = conv.message
    monkeypatch.setattr(conv, "message", lambda *a, **k: calls.append(1) or message(*a, **k))
    out_ref, (g2, a2) = run(conv, x, batch=BATCH, return_attention_weights=True)
    assert calls
    grads_ref = torch.autograd.grad(out_ref.pow(2).sum(), [x] + list(conv.parameters()))
    assert torch.equal(g1.edge_index, g2.edge_index)
    assert torch.allclose(out_fused, out_ref, atol=1e-6)
    assert torch.allclose(a1, a2, atol=1e-6)
    for a, b in zip(grads_fused, grads_ref):
        assert torch.allclose(a, b, atol=1e-5)
    # The estimators differ, so the test above compares the chosen one.
    other = make_conv(dropout=0.0, ste="paper" if ste == "published" else "published",
                      sbm_parametrization=parametrization, sink=sink)
    other.load_state_dict(conv.state_dict())
    out_other = run(other, x, batch=BATCH)
    grad_other = torch.autograd.grad(out_other.pow(2).sum(), other.sbm.clusters)
    grad_fused = grads_fused[1 + [n for n, _ in conv.named_parameters()].index("sbm.clusters")]
    assert torch.allclose(out_other, out_fused)
    assert not torch.allclose(grad_other[0], grad_fused, atol=1e-5)


@pytest.mark.parametrize("parametrization", ["paper", "mmsb", "sharp"])
def test_gradients_reach_the_sbm_through_ste_and_regularizer(parametrization):
    conv = make_conv(sbm_parametrization=parametrization)
    sbm_params = [p for _, p in conv.sbm.named_parameters()]
    assert len(sbm_params) == {"paper": 5, "mmsb": 6, "sharp": 8}[parametrization]
    out = run(conv, x_input(), batch=BATCH)
    grads = torch.autograd.grad(out.pow(2).sum(), sbm_params, retain_graph=True)
    assert all(float(g.abs().sum()) > 0 for g in grads)
    reg = torch.autograd.grad(conv.expected_density.sum(), sbm_params)
    assert all(float(g.abs().sum()) > 0 for g in reg)



def test_no_straight_through_work_without_grad(monkeypatch):
    import sbm_pyg.nn._call as call_module
    sparse_only(monkeypatch)
    conv = make_conv()
    x = x_input()
    torch.manual_seed(3)
    expected = run(conv, x, seed=1, batch=BATCH).detach()
    given = []

    def spy(*args, sbm=None, **kwargs):
        given.append(sbm is not None)
        return sparse_attention(*args, sbm=sbm, **kwargs)

    monkeypatch.setattr(call_module, "sparse_attention", spy)
    with torch.no_grad():
        torch.manual_seed(3)
        out = run(conv, x, seed=1, batch=BATCH)
    assert torch.allclose(out, expected)
    run(conv, x, batch=BATCH)
    assert given == [False, True]  # the SBM reaches the attention with grad only


@pytest.mark.parametrize("parametrization", ["paper", "mmsb", "sharp"])
def test_density_statistics(parametrization):
    conv = make_conv(sbm_parametrization=parametrization)
    conv.eval()
    x = x_input()
    _, (graph, _) = run(conv, x, batch=BATCH, return_attention_weights=True)
    assert torch.allclose(conv.sampled_density, graph.density().mean(0).float())
    with torch.no_grad():
        query = conv.lin_query(x).view(-1, 2, 4)
        key = conv.lin_key(x).view(-1, 2, 4)
        q_memb, block, k_memb = conv.sbm(query, key)
        p = expected_adjacency(q_memb, block, k_memb, ptr_q=PTR, ptr_k=PTR, mode="exact")
    sizes = PTR.diff()
    per_seq = torch.stack([p[:, a:b, a:b].sum((1, 2)) / (n * n)
                           for a, b, n in zip(PTR[:-1], PTR[1:], sizes)])
    assert torch.allclose(conv.expected_density, per_seq.mean(0), atol=1e-6)
    assert conv.expected_density.requires_grad


def test_exploration_only_while_training():
    conv = make_conv(exploration=0.5)
    with torch.no_grad():  # memberships ~ 0: the SBM itself samples nothing
        conv.sbm.weight2.zero_()
        conv.sbm.bias2.fill_(1.0)
        conv.sbm.clusters.fill_(-10.0)
    conv.train()
    _, (g_train, _) = run(conv, x_input(), batch=BATCH, return_attention_weights=True)
    conv.eval()
    _, (g_eval, _) = run(conv, x_input(), batch=BATCH, return_attention_weights=True)
    assert g_eval.num_edges == 0
    # Expected: 2 heads * sum_g n_g^2 pairs * (1 - exp(-0.5)) = 22.8 edges.
    assert 8 < g_train.num_edges < 40


def test_self_loops():
    conv = make_conv(self_loops=True)
    _, (graph, _) = run(conv, x_input(), batch=BATCH, return_attention_weights=True)
    loops = graph.edge_index[0] == graph.edge_index[1]
    assert int(loops.sum()) == 2 * 9


def test_max_edges_exceeded():
    conv = make_conv(max_edges=0, exploration=1.0)
    with pytest.raises(ValueError, match="max_edges=0"):
        run(conv, x_input(), batch=BATCH)


@pytest.mark.slow
def test_torch_compile_matches_eager(monkeypatch):
    # The sampler runs eagerly (a graph break: its edge count is
    # data-dependent); the attention operator is traced into the graphs the
    # compiler gets, and output and gradients match eager mode.
    sparse_only(monkeypatch)
    conv = make_conv()
    x = x_input()
    traced = []

    def backend(gm, example_inputs):
        traced.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    compiled = torch.compile(conv, backend=backend)
    out = run(compiled, x, batch=BATCH)
    assert conv.last_backends["attention"] in ("cpp", "triton")
    assert "sbm_pyg.sparse_attention" in traced
    assert torch.allclose(out, run(conv, x, batch=BATCH), atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), list(conv.parameters()))
    eager = torch.autograd.grad(run(conv, x, batch=BATCH).square().sum(),
                                list(conv.parameters()))
    for a, b in zip(grads, eager):
        assert torch.allclose(a, b, atol=1e-6)
    # Inductor too.
    out = run(torch.compile(conv), x, batch=BATCH)
    assert torch.allclose(out, run(conv, x, batch=BATCH), atol=1e-6)


def test_torch_sparse_features():
    conv = make_conv()
    x = x_input() * (torch.rand(9, 8, generator=seeded(2)) < 0.3)
    dense = run(conv, x, batch=BATCH)
    for sparse in (x.to_sparse(), x.to_sparse_csr()):
        assert torch.allclose(run(conv, sparse, batch=BATCH), dense, atol=1e-6)


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="torch_sparse not installed")
def test_sparse_tensor_features():
    conv = make_conv()
    x = x_input() * (torch.rand(9, 8) < 0.3)
    dense = run(conv, x, batch=BATCH)
    assert torch.allclose(run(conv, SparseTensor.from_dense(x), batch=BATCH), dense, atol=1e-6)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch=torch.tensor([0, 0, 1, 1, 0, 1, 1, 2, 2])), ValueError, "sorted"),
    (dict(batch=torch.tensor([0, 0, 1])), ValueError, "batch"),
    (dict(batch=BATCH.float()), TypeError, "batch"),
    (dict(batch=BATCH, ptr=PTR), ValueError, "either batch or ptr"),
    (dict(ptr=torch.tensor([0, 3, 8])), ValueError, "ptr_q"),
    (dict(x=torch.randn(9, 5)), ValueError, "x_dst must have 8 channels"),
    (dict(x=torch.randn(9)), ValueError, "x_dst"),
    (dict(x=[1, 2]), TypeError, "x_dst"),
])
def test_bad_input(kwargs, error, match):
    conv = make_conv()
    x = kwargs.pop("x", x_input())
    with pytest.raises(error, match=match):
        run(conv, x, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(dropout=1.0), "dropout"), (dict(mode="dense"), "mode"),
    (dict(exploration=-1.0), "exploration"), (dict(ste="mine"), "ste"),
    (dict(sbm_init="zeros"), "sbm_init"),
    (dict(sbm_parametrization="rate"), "sbm_parametrization"),
])
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SBMConv(8, 4, **kwargs)


@pytest.mark.parametrize("structure", ["EdgeIndex", "sparse_csr", "SparseTensor"])
def test_include_edges_as_pyg_structure_types(structure):
    # Included edges given as PyG layers take a graph give the result of the
    # plain edge_index.
    from torch_geometric import EdgeIndex
    conv = make_conv()
    x = x_input()
    edge_index = torch.tensor([[0, 2, 1, 5, 8], [1, 1, 2, 6, 7]])  # (key, query)
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(5), (9, 9),
                                    check_invariants=True)
    if structure == "SparseTensor":
        torch_sparse = pytest.importorskip("torch_sparse",
                                           reason="torch_sparse not installed")
        given = torch_sparse.SparseTensor.from_torch_sparse_coo_tensor(adj_t)
    elif structure == "EdgeIndex":
        given = EdgeIndex(edge_index, sparse_size=(9, 9))
    else:
        given = adj_t.to_sparse_csr()
    out, (graph, _) = run(conv, x, batch=BATCH, include_edges=given,
                          return_attention_weights=True)
    ref, (ref_graph, _) = run(conv, x, batch=BATCH, include_edges=edge_index,
                              return_attention_weights=True)
    assert torch.equal(graph.edge_index, ref_graph.edge_index)
    assert torch.allclose(out, ref)


def test_edge_index_in_place_of_batch_is_explained():
    # PyG users call conv(x, edge_index) first: the error says what to do.
    from torch_geometric import EdgeIndex
    conv = make_conv()
    x = x_input()
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    for graph in (edge_index, EdgeIndex(edge_index, sparse_size=(10, 10)),
                  edge_index.new_ones(3).float().diag().to_sparse()):
        with pytest.raises(ValueError, match="include_edges=edge_index"):
            conv(x, graph)
    # and conv(x, edge_index, batch), as PyG's convs take it
    with pytest.raises(ValueError, match="include_edges=edge_index"):
        conv(x, edge_index, BATCH)
    with pytest.raises(TypeError, match="takes \\(x, batch\\)"):
        conv(x, BATCH, BATCH)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_features_are_named(bad):
    conv = make_conv()
    x = x_input()
    x[3, 2] = bad
    with pytest.raises(ValueError, match=r"x \(x_dst: the queries\) or the layer's "
                                         r"weights contain NaN or inf"):
        conv(x)
    keys = x_input(n=9)
    keys[0, 0] = bad
    with pytest.raises(ValueError, match=r"x \(x_src: the keys\)"):
        conv((keys, x_input(n=4)))


def test_eval_seed_makes_evaluation_repeatable(monkeypatch):
    conv = make_conv(eval_seed=0)
    x = x_input()
    conv.eval()
    first = conv(x, batch=BATCH)
    assert torch.equal(conv(x, batch=BATCH), first)
    copy = make_conv(eval_seed=0)
    copy.load_state_dict(conv.state_dict())
    copy.eval()
    assert torch.equal(copy(x, batch=BATCH), first)  # a round trip agrees
    conv.train()  # training samples afresh
    outs = [conv(x, batch=BATCH) for _ in range(3)]
    assert not all(torch.equal(o, outs[0]) for o in outs[1:])
    # Without a seed, evaluation samples afresh too (the paper's setting),
    # and says so once.
    from sbm_pyg.nn import inputs
    monkeypatch.setattr(inputs, "_EVAL_WARNED", [False])
    free = make_conv(exploration=0.0)
    free.eval()
    with pytest.warns(UserWarning, match="eval_seed") as record:
        outs = [free(x, batch=BATCH) for _ in range(3)]
    # Each layer's place for the seed, SBMGPSConv's included.
    assert "attn_kwargs={'eval_seed'" in str(record[0].message)
    assert not all(torch.equal(o, outs[0]) for o in outs[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        free(x, batch=BATCH)
    with pytest.raises(TypeError, match="eval_seed must be an int"):
        make_conv(eval_seed=0.5)


def test_backends_are_constructor_arguments_and_the_layer_says_what_ran(
        monkeypatch):
    from sbm_pyg.ops import backends
    # backends() names the sparse kernels "auto" runs below the crossover.
    sparse_only(monkeypatch)
    conv = make_conv(dropout=0.0, sampler_backend="torch", attention_backend="torch")
    assert conv.last_backends is None
    run(conv, x_input(), batch=BATCH)
    assert conv.last_backends == {"sampler": "torch", "attention": "torch"}
    conv = make_conv(dropout=0.0)
    run(conv, x_input(), batch=BATCH)
    assert kernels_ran(conv.last_backends) == backends(torch.get_default_device())
    # On a GPU the layer also says which crossover "auto" compared with.
    assert ("crossover" in conv.last_backends) == (
        torch.get_default_device().type == "cuda")
    conv.attention_backend = "message_passing"
    run(conv, x_input(), batch=BATCH)
    assert conv.last_backends["attention"] == "message_passing"
    assert not hasattr(SBMConv, "fuse") or conv.fuse is False  # PyG's own meaning
    with pytest.raises(ValueError, match="sampler_backend must be one of"):
        make_conv(sampler_backend="cuda")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        make_conv(attention_backend="compiled")


def test_training_and_evaluation_run_the_same_kernels():
    # With attention dropout, "auto" takes the fused kernel, in training
    # and evaluation alike.
    from sbm_pyg.ops import backends
    conv = make_conv(dropout=0.3)
    ran = []
    for training in (True, False):
        conv.train(training)
        run(conv, x_input(), batch=BATCH)
        ran.append(conv.last_backends["attention"])
    fused = backends(torch.get_default_device())["attention"]
    assert ran == [fused, fused]


def test_aggregations_and_flows_other_than_attention_are_refused():
    with pytest.raises(ValueError, match="aggr must be 'add'"):
        make_conv(aggr="mean")
    with pytest.raises(ValueError, match="flow must be 'source_to_target'"):
        make_conv(flow="target_to_source")
    assert make_conv(aggr="add").aggr == "add"


@pytest.mark.skipif(not hasattr(typing, "get_overloads"), reason="Python < 3.11")
def test_forward_is_typed_by_return_attention_weights():
    # As PyG's TransformerConv: one overload per return shape.
    overloads = typing.get_overloads(SBMConv.forward)
    returns = [typing.get_type_hints(f)["return"] for f in overloads]
    assert returns[0] is torch.Tensor
    assert typing.get_args(returns[1])[0] is torch.Tensor





@needs_cpp
def test_auto_takes_the_dense_kernel_from_the_crossover_on(monkeypatch):
    conv = make_conv(dropout=0.0)
    pin_crossover(monkeypatch, 0.0)
    run(conv, x_input(), batch=BATCH)
    assert conv.last_backends == {"sampler": "dense", "attention": "dense"}
    # Weights and graph hooks get the dense kernel's graph, attended by the
    # sparse kernel: the same sample, the same output.
    out = run(conv, x_input(), batch=BATCH)
    out_w, (graph, alpha) = run(conv, x_input(), batch=BATCH,
                                return_attention_weights=True)
    assert conv.last_backends == {"sampler": "dense", "attention": "cpp"}
    torch.testing.assert_close(out_w, out, rtol=1e-5, atol=1e-6)
    assert alpha.numel() == graph.num_edges > 0
    seen = []
    handle = conv.register_graph_hook(lambda module, g: seen.append(g))
    run(conv, x_input(), batch=BATCH)
    handle.remove()
    assert torch.equal(seen[0].edge_index, graph.edge_index)
    pin_crossover(monkeypatch, float("inf"))
    run(conv, x_input(), batch=BATCH)
    assert conv.last_backends == {"sampler": "cpp", "attention": "cpp"}
    # With attention dropout too (the dense kernel has it).
    pin_crossover(monkeypatch, 0.0)
    conv = make_conv(dropout=0.2)
    run(conv, x_input(), batch=BATCH)
    assert conv.last_backends == {"sampler": "dense", "attention": "dense"}


@needs_cpp
@pytest.mark.parametrize("parametrization", ["paper", "mmsb"])
def test_dense_kernel_trains_the_layer_like_the_sparse_one(monkeypatch,
                                                           parametrization):
    # The same layer on both kernels: densities agree with the expected one
    # (the same distribution), and every parameter, the SBM's included, gets
    # a gradient.
    conv = make_conv(attention_backend="dense", self_loops=True,
                     exploration=0.0, sbm_parametrization=parametrization)
    x = x_input(n=300, seed=4)
    batch = torch.arange(300) // 100
    out = run(conv, x, batch=batch)
    assert conv.last_backends == {"sampler": "dense", "attention": "dense"}
    # Each head's density against the mean of min(p, 1) + the self-loops'
    # share, computed densely (30000 pairs a head: sd below 0.003).
    with torch.no_grad():
        q = conv.lin_query(x).view(300, 2, 4)
        k = conv.lin_key(x).view(300, 2, 4)
        qm, block, km = conv.sbm(q, k)
        p = torch.einsum("ihu,huv,jhv->hij", qm, block, km)
        same = (batch[:, None] == batch[None, :]).float()
        p = torch.where(torch.eye(300, dtype=torch.bool), 1.0, p.clamp(max=1))
        expected = (p * same).sum((1, 2)) / same.sum()
    torch.testing.assert_close(conv.sampled_density, expected, rtol=0,
                               atol=0.015)
    grads = torch.autograd.grad(out.sum() + conv.expected_density.sum(),
                                list(conv.parameters()), allow_unused=True)
    for (name, _), g in zip(conv.named_parameters(), grads):
        assert g is not None and g.abs().sum() > 0, name
    # Zero memberships (p = 0): only the self-loops and the included pairs,
    # the same graph on both kernels, so the same output.
    monkeypatch.setattr(conv.sbm, "membership", lambda h, key=False: torch.zeros(
        h.size(0), 2, 4))
    include = torch.tensor([[1, 0, 150], [0, 2, 170]])
    outs = []
    for backend in ("dense", "cpp"):
        conv.attention_backend = backend
        outs.append(run(conv, x, batch=batch, include_edges=include))
    assert conv.sampled_density.tolist() == [pytest.approx(303 / 30000)] * 2
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@needs_cpp
def test_dense_kernel_refusals_and_guard():
    # Attention dropout runs on the dense kernel: only in training.
    conv = make_conv(attention_backend="dense", dropout=0.5, eval_seed=1)
    x = x_input()
    conv.train()
    assert conv(x, batch=BATCH, generator=seeded(0)).equal(
        conv(x, batch=BATCH, generator=seeded(0)))
    assert conv.last_backends["attention"] == "dense"
    # Another seed: another mask and other dropped weights.
    assert not conv(x, batch=BATCH, generator=seeded(1)).equal(
        conv(x, batch=BATCH, generator=seeded(0)))
    # The same layer without dropout: in training the dropout changes the
    # output (the same mask: its seed is drawn before the dropout's); in
    # evaluation the two are the same layer.
    plain = make_conv(attention_backend="dense", dropout=0.0, eval_seed=1)
    plain.load_state_dict(conv.state_dict())
    plain.train()
    assert not conv(x, batch=BATCH, generator=seeded(0)).equal(
        plain(x, batch=BATCH, generator=seeded(0)))
    conv.eval(), plain.eval()
    assert conv(x, batch=BATCH).equal(plain(x, batch=BATCH))
    conv = make_conv(attention_backend="dense", max_edges=10)
    with pytest.raises(ValueError, match="max_edges"):
        run(conv, x_input(), batch=BATCH)
    with pytest.raises(ValueError, match="takes no graph"):
        sparse_attention(*[torch.randn(3, 1, 2)] * 3, None, backend="dense")


@needs_cpp
def test_dense_kernel_evaluation_is_repeatable_with_eval_seed():
    conv = make_conv(attention_backend="dense", eval_seed=3).eval()
    x = x_input()
    a = conv(x, batch=BATCH)
    b = conv(x, batch=BATCH)
    assert torch.equal(a, b)


def test_init_density_starts_the_layer_sparse():
    torch.manual_seed(0)
    rho = 64 / 4096
    conv = SBMConv(64, 32, heads=2, init_density=rho)
    assert conv.sbm.density == rho and conv.exploration == pytest.approx(rho / 10)
    assert SBMConv(64, 32, heads=2).exploration == 0.01
    assert SBMConv(64, 32, heads=2, init_density=0.5).exploration == 0.01
    assert SBMConv(64, 32, init_density=rho, exploration=0.0).exploration == 0.0
    # On unit features, every head within a few percent above rho (the
    # block model's own test bounds it), and the graph drawn from it.
    conv(torch.randn(4096, 64, generator=seeded(1)), generator=seeded(2))
    ratio = conv.expected_density / rho
    assert bool(((ratio > 0.975) & (ratio < 1.1)).all()), ratio
    explored = (rho + conv.exploration) / rho
    assert bool(((conv.sampled_density / rho > 0.8 * explored)
                 & (conv.sampled_density / rho < 1.25 * explored)).all())


@pytest.mark.parametrize("bad", [0, 1.0, -1e-3, True, "0.1"])
def test_init_density_refuses_bad_values(bad):
    with pytest.raises(ValueError, match="init_density must be a number in"):
        SBMConv(8, 4, init_density=bad)


def test_init_density_and_dense_init_exclude_each_other():
    with pytest.raises(ValueError, match="sbm_init='dense' or init_density"):
        SBMConv(8, 4, sbm_init="dense", init_density=0.1)


def test_memory_refusal_says_how_to_start_sparse(monkeypatch):
    from sbm_pyg import validation
    monkeypatch.setattr(validation, "available_memory", lambda device: 1024)
    pin_crossover(monkeypatch, float("inf"))  # the sampler, which guards
    torch.manual_seed(0)
    conv = SBMConv(16, 8, heads=2, num_clusters=8)
    with pytest.raises(ValueError, match="GiB are available.*build it with init_density"):
        conv(torch.randn(256, 16, generator=seeded(1)), generator=seeded(2))
