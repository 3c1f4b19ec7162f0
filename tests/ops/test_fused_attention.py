"""The fused attention of the compiled extension against the PyTorch path of
sparse_attention (the reference), and its registration as torch operators."""
import pytest
import torch

from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg.ops import backend_info, fused_attention
from sbm_pyg.ops.graph import CSRGraph
from sbm_pyg.sampling import fastrg
from tests.helpers import kernels_ran, pin_crossover, seeded
from tests.markers import needs_extension

pytestmark = [pytest.mark.host, needs_extension]

PTR = [0, 7, 19, 19, 40]  # a ragged batch with an empty sequence


def sbm_and_inputs(dtype, H=2, D=5, DV=6, k=3, scale=1.0, seed=0):
    g = seeded(seed)
    N = PTR[-1]
    # Queries from nearly silent (no edge) to dense (rows longer than 16).
    spread = torch.rand(N, 1, 1, generator=g, dtype=torch.float64).pow(2) * 20
    q_memb = torch.rand(N, H, k, generator=g, dtype=torch.float64) * spread
    k_memb = torch.rand(N, H, k, generator=g, dtype=torch.float64) * scale
    block = torch.rand(H, k * k, generator=g, dtype=torch.float64).softmax(-1)
    block = block.view(H, k, k)
    graph = fastrg(q_memb, block, k_memb, ptr_q=PTR, ptr_k=PTR, generator=g)
    query, key = (torch.randn(N, H, D, generator=g) for _ in "qk")
    value = torch.randn(N, H, DV, generator=g)
    sbm = [q_memb, block, k_memb]
    return graph, [t.to(dtype) for t in [query, key, value] + sbm]


def run(backend, graph, inputs, ste, form, grad_dtype=None):
    """Output, weights and the gradients of every input."""
    inputs = [t.clone().requires_grad_() for t in inputs]
    q, k, v, q_memb, block, k_memb = inputs
    kwargs = dict(ste=ste, backend=backend, return_attention_weights=True)
    if form == "sbm":
        out, alpha = sparse_attention(q, k, v, graph, sbm=(q_memb, block, k_memb),
                                      **kwargs)
    else:
        prob = edge_probability(q_memb, block, k_memb, graph)
        out, alpha = sparse_attention(q, k, v, graph, prob, **kwargs)
    grad = torch.randn(out.shape, generator=seeded(1)).to(grad_dtype or out.dtype)
    out.backward(grad.to(out.dtype))
    return [out, alpha] + [t.grad for t in inputs]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10),
                                       (torch.float32, 1e-5)])
@pytest.mark.parametrize("ste", ["paper", "published"])
@pytest.mark.parametrize("form", ["edge_prob", "sbm"])
@pytest.mark.parametrize("D,DV", [(5, 6), (32, 32), (16, 16), (1, 3)])
def test_matches_the_torch_path(dtype, tol, ste, form, D, DV):
    # D = DV = 16, 32: the kernels specialized for the head size (and, in
    # float32 with AVX2, scores eight edges at a time); the others: generic.
    graph, inputs = sbm_and_inputs(dtype, D=D, DV=DV)
    rows = graph.rowptr.diff()
    assert (rows == 0).any() and int(rows.max()) > 16  # empty and long rows
    ref = run("torch", graph, inputs, ste, "edge_prob")
    got = run("cpp", graph, inputs, ste, form)
    assert got[0].dtype == dtype and got[1].shape == (graph.num_edges,)
    names = ["out", "alpha", "query", "key", "value", "q_memb", "block", "k_memb"]
    for name, a, b in zip(names, got, ref):
        assert b.abs().max() > 0, name  # every gradient is exercised
        assert torch.allclose(a, b, rtol=tol, atol=tol * float(b.detach().abs().max())), name


def test_published_clip_is_exercised():
    # Large scores make |dL/da| exceed 1 on some edges: the clip matters.
    graph, inputs = sbm_and_inputs(torch.float64, D=4, DV=4)
    inputs[0] = inputs[0] * 30
    ref = run("torch", graph, inputs, "published", "edge_prob")
    got = run("cpp", graph, inputs, "published", "sbm")
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10 * float(b.detach().abs().max()))
    q_memb, block, k_memb = (t.detach().requires_grad_() for t in inputs[3:])
    prob = edge_probability(q_memb, block, k_memb, graph)
    out = sparse_attention(*[t.detach() for t in inputs[:3]], graph, prob,
                           ste="published", backend="torch")
    g = torch.autograd.grad(out.pow(2).sum(), prob)[0]
    assert g.abs().max() == 1.0  # some edges were clipped


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_computed_in_float32(dtype):
    graph, inputs = sbm_and_inputs(torch.float32, D=8, DV=8)
    half = [t.to(dtype) for t in inputs]
    got = run("cpp", graph, half, "paper", "sbm")
    ref = run("cpp", graph, [t.float() for t in half], "paper", "sbm",
              grad_dtype=dtype)
    assert got[0].dtype == dtype and got[2].dtype == dtype
    assert torch.equal(got[0], ref[0].to(dtype))
    for a, b in zip(got[2:], ref[2:]):
        assert torch.equal(a, b.to(dtype))


def test_does_not_depend_on_the_thread_count():
    # Large enough (~77k edges) for the kernels to split the work.
    g = seeded(0)
    n, H, D, k = 400, 2, 32, 4
    memb = torch.rand(n, H, k, generator=g)
    block = torch.full((H, k, k), 1.0 / k**2)
    graph = fastrg(memb * 1.4, block, memb * 1.4, generator=g)
    assert graph.num_edges > 60000
    inputs = [torch.randn(n, H, D, generator=g) for _ in range(3)]
    inputs += [memb, block, memb.clone()]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run("cpp", graph, inputs, "paper", "sbm")
        torch.set_num_threads(4)
        many = run("cpp", graph, inputs, "paper", "sbm")
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


def test_default_backend_on_the_cpu(monkeypatch):
    graph, inputs = sbm_and_inputs(torch.float64)
    q, k, v = inputs[:3]
    calls = []
    real = fused_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    import sbm_pyg.nn.functional as functional
    monkeypatch.setattr(functional, "fused_attention", spy)
    sparse_attention(q, k, v, graph)
    assert calls == [1]
    # Attention dropout runs in the fused kernel too.
    sparse_attention(q, k, v, graph, dropout=0.5, training=True,
                     generator=seeded(0))
    assert calls == [1, 1]
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    sparse_attention(q, k, v, graph)
    assert calls == [1, 1]
    with pytest.raises(ValueError, match="backend 'cpp' needs the compiled extension"):
        sparse_attention(q, k, v, graph, backend="cpp")


def test_sbm_argument_errors():
    graph, inputs = sbm_and_inputs(torch.float64)
    q, k, v, q_memb, block, k_memb = inputs
    prob = edge_probability(q_memb, block, k_memb, graph)
    with pytest.raises(ValueError, match="edge_prob or sbm"):
        sparse_attention(q, k, v, graph, prob, sbm=(q_memb, block, k_memb))
    with pytest.raises(TypeError, match="sbm must be a tuple"):
        sparse_attention(q, k, v, graph, sbm=[q_memb, block, k_memb])
    with pytest.raises(ValueError, match="block"):
        sparse_attention(q, k, v, graph, sbm=(q_memb, block[:, :2], k_memb))


def op_inputs(form):
    graph, inputs = sbm_and_inputs(torch.float64, D=4, DV=3)
    q, k, v, q_memb, block, k_memb = inputs
    H = q.size(1)
    flat = [t.transpose(0, 1).reshape(H * t.size(0), -1).contiguous()
            for t in (q, k, v)]
    q_block = torch.bmm(q_memb.transpose(0, 1), block).reshape(-1, block.size(-1))
    k_flat = k_memb.transpose(0, 1).reshape(-1, block.size(-1)).contiguous()
    rowptr, col = graph.rowptr, graph.csr.col
    prob = torch.rand(graph.num_edges, dtype=torch.float64, generator=seeded(2))
    extra = ([prob, None, None] if form == "edge_prob"
             else [None, q_block.contiguous(), k_flat])
    return [rowptr, col, graph.colptr, graph.csr.row_t()] + flat + extra


@pytest.mark.parametrize("dropout", [(), (torch.tensor(2**40 + 3), 2**52)])
@pytest.mark.parametrize("form", ["edge_prob", "sbm"])
def test_opcheck(form, dropout):
    # The schema, the autograd registration and the fake kernels, as
    # torch.library's own checker sees them (torch.compile's needs), with
    # and without dropout (seed, threshold of p = 1/2).
    args = op_inputs(form)
    for i in range(4, 10):
        if args[i] is not None:
            args[i] = args[i].requires_grad_()
    torch.library.opcheck(torch.ops.sbm_pyg.sparse_attention.default,
                          args + [0.5, 1, True, *dropout])


def test_compiles_without_graph_breaks():
    args = op_inputs("sbm")
    for i in (4, 5, 6, 8, 9):
        args[i] = args[i].requires_grad_()

    rowptr, col, colptr, _ = args[:4]
    perm = sbm_and_inputs(torch.float64, D=4, DV=3)[0].perm

    def f(*tensors):
        # The graph is built inside: its row_t view is traced as well.
        graph = CSRGraph(rowptr, col, colptr, perm)
        out, alpha, _ = fused_attention(graph, *tensors[4:], scale=0.5,
                                     ste="paper", weights=True)
        return out.pow(2).sum() + alpha.sum()

    eager = torch.autograd.grad(f(*args), [args[i] for i in (4, 5, 6, 8, 9)])
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    loss = compiled(*args)
    got = torch.autograd.grad(loss, [args[i] for i in (4, 5, 6, 8, 9)])
    for a, b in zip(got, eager):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("crossover", [float("inf"), 0.0])
@pytest.mark.parametrize("layer", ["SBMConv", "SBMMultiheadAttention", "SBMGPSConv"])
def test_layers_use_it_by_default(monkeypatch, layer, crossover):
    # Below the dense kernel's crossover (here: at any density) the layers
    # run this kernel; from it on (here: always) the dense one, and say so.
    import sbm_pyg.nn.functional as functional
    from sbm_pyg.nn import SBMConv, SBMGPSConv, SBMMultiheadAttention
    pin_crossover(monkeypatch, crossover)
    calls = []
    real = fused_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("q_block") is not None or args[5] is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(functional, "fused_attention", spy)
    torch.manual_seed(0)
    x = torch.randn(12, 8)
    batch = torch.tensor([0] * 5 + [1] * 7)
    if layer == "SBMConv":
        module = SBMConv(8, 4, heads=2, num_clusters=3)
        out = module(x, batch)
    elif layer == "SBMMultiheadAttention":
        module = SBMMultiheadAttention(8, heads=2, head_channels=4,
                                       num_clusters=3)
        out = module(x.view(2, 6, 8))
    else:
        edge_index = torch.tensor([[0, 1, 5, 6], [1, 0, 6, 5]])
        module = SBMGPSConv(8, None, heads=2, attn_kwargs=dict(num_clusters=3))
        out = module(x, edge_index, batch)
    out.sum().backward()
    if crossover == 0.0:
        assert calls == []
        assert kernels_ran(module.last_backends) == {"sampler": "dense",
                                                     "attention": "dense"}
        return
    # One call, with the memberships: their gradient comes from the kernel.
    assert calls == [True]


def test_weights_only_when_asked():
    # Without weights the forward writes the scores to per-thread scratch:
    # its alpha output is empty, and the output is the same.
    args = op_inputs("edge_prob")
    out, alpha, lse = torch.ops.sbm_pyg.sparse_attention(*args, 0.5, 1, False)
    out_w, alpha_w, lse_w = torch.ops.sbm_pyg.sparse_attention(*args, 0.5, 1,
                                                               True)
    assert alpha.numel() == 0 and alpha_w.numel() == args[1].numel()
    assert torch.equal(out, out_w) and torch.equal(lse, lse_w)
    # The weights of each row sum to one.
    sums = torch.zeros(args[0].numel() - 1, dtype=alpha_w.dtype).index_add_(
        0, torch.repeat_interleave(args[0].diff()), alpha_w)
    has = args[0].diff() > 0
    assert torch.allclose(sums[has], torch.ones_like(sums[has]))
