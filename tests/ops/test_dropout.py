"""Attention dropout by counter: the mask function against SplitMix64
written out by hand, its keep rate, and every sparse kernel (PyTorch path,
C++, Triton) against a dense reference that applies the same mask."""
import importlib.util
import math

import pytest
import torch

from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg.ops import backend_info
from sbm_pyg.ops.dropout import (
    dropout_keep,
    dropout_row_states,
    dropout_threshold,
    keep_scale,
)
from sbm_pyg.sampling import fastrg
from tests.helpers import pin_crossover, seeded

M64 = 2**64 - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _keep_by_hand(seed, r, c, threshold):
    # Rng(seed, r, purpose 2) of csrc/sampler/stream.h, its output at
    # counter c + 1, top 53 bits against the threshold.
    state = _mix64(seed ^ _mix64((r * 4 + 2 + 0x632BE59BD9B4E019) & M64))
    bits = _mix64((state + (c + 1) * 0x9E3779B97F4A7C15) & M64)
    return (bits >> 11) >= threshold


def test_mask_is_splitmix64_of_the_pair():
    g = seeded(0)
    rows = torch.cat([torch.randint(0, 2**31 - 1, (300,), generator=g),
                      torch.tensor([0, 1, 2**31 - 2])])
    cols = torch.cat([torch.randint(0, 2**31 - 1, (300,), generator=g),
                      torch.tensor([2**31 - 2, 0, 5])])
    for seed in (0, 12345, 2**62 - 1):
        for p in (0.1, 0.5, 0.9):
            t = dropout_threshold(p)
            got = dropout_keep(seed, rows, cols, t).tolist()
            want = [_keep_by_hand(seed, r, c, t)
                    for r, c in zip(rows.tolist(), cols.tolist())]
            assert got == want


def test_row_states_are_the_rows_streams_by_hand():
    # The dense kernels' per-row argument: Rng(seed, r, 2).state as int64
    # bits, from an int seed or a seed tensor alike.
    rows = torch.tensor([[0, 1], [7, 2**31 - 2]])
    for seed in (0, 12345, 2**62 - 1):
        want = [_mix64(seed ^ _mix64((r * 4 + 2 + 0x632BE59BD9B4E019) & M64))
                for r in rows.flatten().tolist()]
        for s in (seed, torch.tensor(seed)):
            got = dropout_row_states(s, rows)
            assert got.shape == rows.shape and got.dtype == torch.int64
            assert [x & M64 for x in got.flatten().tolist()] == want


def test_threshold_and_scale():
    assert dropout_threshold(0.0) == 0
    assert dropout_threshold(0.5) == 2**52
    assert keep_scale(2**52) == 2.0
    assert keep_scale(0) == 1.0
    assert abs(keep_scale(dropout_threshold(0.1)) - 1 / 0.9) < 1e-15
    for p in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="dropout"):
            dropout_threshold(p)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    # 256 x 1024 pairs of one seed: the kept fraction within 5 standard
    # deviations of 1 - p (a false alarm about once in 3.5 million).
    r, c = torch.meshgrid(torch.arange(256), torch.arange(1024), indexing="ij")
    kept = dropout_keep(7, r, c, dropout_threshold(p)).double()
    n = kept.numel()
    assert abs(float(kept.mean()) - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    # Rows and columns are not correlated: each row's rate as well.
    per_row = kept.mean(1)
    sd = math.sqrt(p * (1 - p) / 1024)
    assert float((per_row - (1 - p)).abs().max()) < 6 * sd


PTR = [0, 5, 12, 12, 20]  # ragged, with an empty sequence


def _inputs(dtype, H=2, D=4, DV=3, k=3, seed=0):
    g = seeded(seed)
    N = PTR[-1]
    q_memb = torch.rand(N, H, k, generator=g, dtype=torch.float64) * 3
    k_memb = torch.rand(N, H, k, generator=g, dtype=torch.float64)
    block = torch.rand(H, k * k, generator=g, dtype=torch.float64).softmax(-1)
    block = block.view(H, k, k)
    graph = fastrg(q_memb, block, k_memb, ptr_q=PTR, ptr_k=PTR, generator=g)
    q, k_, v = (torch.randn(N, H, d, generator=g) for d in (D, D, DV))
    return graph, [t.to(dtype) for t in (q, k_, v, q_memb, block, k_memb)]


def _dense_reference(graph, q, k, v, prob, p, seed, ste):
    # The attention over the graph as dense [H, N, N] matrices, the mask of
    # dropout_keep applied to the softmax, the straight-through estimator
    # as an identity whose gradient is the estimator's.
    N, H, D = q.shape
    heads = graph.head
    kj, qi = graph.edge_index
    S = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(D)
    score = S[heads, qi, kj]
    if ste == "paper":
        score = score + score.detach() * (prob - prob.detach())
    else:
        from sbm_pyg.ops.torch_attention import clip_grad
        score = score + clip_grad(prob - prob.detach())
    full = torch.full((H, N, N), float("-inf"), dtype=q.dtype)
    full = full.index_put((heads, qi, kj), score)
    A = torch.softmax(full, -1).nan_to_num(0.0)  # empty rows: zero
    t = dropout_threshold(p)
    h, i, j = torch.meshgrid(torch.arange(H), torch.arange(N), torch.arange(N),
                             indexing="ij")
    keep = dropout_keep(seed, h * N + i, h * N + j, t).to(q.dtype) * keep_scale(t)
    return torch.einsum("hnm,mhd->nhd", A * keep, v)


def _backends():
    out = ["torch"]
    if backend_info.WITH_EXTENSION and torch.get_default_device().type == "cpu":
        out.append("cpp")
    if importlib.util.find_spec("triton") is not None and backend_info.triton_runs(
            torch.get_default_device()):
        out.append("triton")
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("ste", ["paper", "published"])
@pytest.mark.parametrize("form", ["edge_prob", "sbm"])
@pytest.mark.parametrize("p", [0.3, 0.75])
def test_kernels_apply_the_mask_in_forward_and_backward(backend, ste, form, p):
    graph, inputs = _inputs(torch.float64)
    from sbm_pyg.sampling.fastrg_op import stream_seed
    seed = stream_seed(seeded(11), torch.get_default_device())  # what the op draws

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        w = torch.randn(out.shape, generator=seeded(3), dtype=out.dtype)
        out.backward(w)
        return [out.detach()] + [t.grad for t in leaves]

    def kernel(q, k, v, qm, b, km):
        if form == "sbm":
            return sparse_attention(q, k, v, graph, sbm=(qm, b, km), dropout=p,
                                    training=True, ste=ste, backend=backend,
                                    generator=seeded(11))
        return sparse_attention(q, k, v, graph, edge_probability(qm, b, km, graph),
                                dropout=p, training=True, ste=ste,
                                backend=backend, generator=seeded(11))

    def reference(q, k, v, qm, b, km):
        return _dense_reference(graph, q, k, v, edge_probability(qm, b, km, graph),
                                p, seed, ste)

    got, want = grads(kernel), grads(reference)
    names = ["out", "query", "key", "value", "q_memb", "block", "k_memb"]
    for name, a, b in zip(names, got, want):
        assert b.abs().max() > 0, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # Dropout did drop: the output is not the undropped one.
    plain = sparse_attention(*inputs[:3], graph, backend=backend)
    assert not torch.allclose(got[0], plain)


@pytest.mark.parametrize("backend", _backends())
def test_same_generator_same_mask_and_a_new_mask_each_call(backend):
    graph, (q, k, v, *_) = _inputs(torch.float32)

    def attend(gen):
        return sparse_attention(q, k, v, graph, dropout=0.5, training=True,
                                generator=gen, backend=backend)

    gen = seeded(5)
    first, second = attend(gen), attend(gen)
    assert torch.equal(first, attend(seeded(5)))
    assert not torch.equal(first, second)
    # Off outside training.
    assert torch.equal(sparse_attention(q, k, v, graph, dropout=0.5,
                                        training=False, backend=backend),
                       sparse_attention(q, k, v, graph, backend=backend))


@pytest.mark.parametrize("backend", _backends())
def test_a_seed_tensor_read_on_the_device_is_the_drawn_seed(backend):
    # A seed given as a tensor (a static call's: the kernels read it on the
    # device) drops what the same seed drawn from the generator drops, in
    # the forward and in the backward.
    from sbm_pyg.sampling.fastrg_op import stream_seed
    graph, inputs = _inputs(torch.float64)
    seed = stream_seed(seeded(11), torch.get_default_device())

    def grads(**kw):
        leaves = [t.clone().requires_grad_() for t in inputs[:3]]
        out = sparse_attention(*leaves, graph, dropout=0.4, training=True,
                               backend=backend, **kw)
        out.backward(torch.randn(out.shape, generator=seeded(3), dtype=out.dtype))
        return [out.detach()] + [t.grad for t in leaves]

    drawn = grads(generator=seeded(11))
    for given in (grads(dropout_seed=torch.tensor(seed)), grads(dropout_seed=seed)):
        for a, b in zip(given, drawn):
            assert torch.equal(a, b)
    assert not torch.equal(grads(dropout_seed=torch.tensor(seed + 1))[0], drawn[0])


def test_bad_seeds_are_refused_by_name():
    from sbm_pyg.ops.dense_attention import dense_attention
    from sbm_pyg.ops.fused_attention import fused_attention
    graph, (q, k, v, *_) = _inputs(torch.float32, H=1)
    with pytest.raises(TypeError, match="dropout_seed must be a one-element int64"):
        sparse_attention(q, k, v, graph, dropout=0.1, training=True,
                         dropout_seed=torch.tensor(1.0))
    q, k, v = (t[:, 0] for t in (q, k, v))
    if backend_info.WITH_EXTENSION:
        with pytest.raises(ValueError, match="needs its dropout_seed"):
            fused_attention(graph.csr, q, k, v, scale=0.5, dropout=0.1)
        with pytest.raises(ValueError, match=r"dropout_seed must lie in \[0, 2\^62\)"):
            fused_attention(graph.csr, q, k, v, scale=0.5, dropout=0.1,
                            dropout_seed=2**62)
        with pytest.raises(TypeError, match="dropout_seed must be an int"):
            fused_attention(graph.csr, q, k, v, scale=0.5, dropout=0.1,
                            dropout_seed=1.5)
        memb, ptr = torch.ones(q.size(0), 2), torch.tensor([0, q.size(0)])
        with pytest.raises(TypeError, match="seed must be a one-element int64"):
            dense_attention(q, k, v, memb, memb, ptr, ptr, heads=1, scale=0.5,
                            seed=torch.tensor([1, 2]))


def test_layer_with_dropout_runs_the_fused_kernel_as_the_torch_path(monkeypatch):
    # SBMConv with attention dropout: "auto" runs the fused kernel (C++ on
    # the CPU, Triton on CUDA), which gives the PyTorch path's output and
    # gradients for the same generator. The sparse regime is pinned: the
    # dense regime samples its mask otherwise (a GPU's own crossover, 0.24
    # on an H200, would take it at these densities, about 0.27).
    pin_crossover(monkeypatch, float("inf"))
    fused = backend_info.backends(torch.get_default_device())["attention"]
    if fused == "torch":
        pytest.skip("no fused kernel here (extension not built)")
    x = torch.randn(30, 8, generator=seeded(0))
    batch = torch.arange(30) // 10
    results = []
    for backend in ("auto", "torch"):
        torch.manual_seed(0)
        conv = SBMConv(8, 4, heads=2, num_clusters=4, dropout=0.5,
                       attention_backend=backend).double()
        xx = x.double().requires_grad_()
        out = conv(xx, batch, generator=seeded(9))
        out.square().sum().backward()
        grads = [p.grad for p in conv.sbm.parameters()]
        results.append((conv.last_backends["attention"], out.detach(), xx.grad,
                        *grads))
    assert [r[0] for r in results] == [fused, "torch"]
    for a, b in zip(results[0][1:], results[1][1:]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _dense_backends():
    out = []
    if backend_info.WITH_EXTENSION:
        out.append(pytest.param(False, id="cpp"))
    if importlib.util.find_spec("triton") is not None and backend_info.triton_runs(
            torch.device("cpu")) and torch.get_default_device().type == "cpu":
        out.append(pytest.param(True, id="triton"))
    return out


@pytest.mark.parametrize("seeds", [(5, 99), (torch.tensor(5), torch.tensor(99))],
                         ids=["ints", "tensors"])
@pytest.mark.parametrize("triton_on_cpu", _dense_backends())
def test_dense_regime_drops_what_the_sparse_kernel_drops(triton_on_cpu, seeds):
    # The dense-regime kernel with dropout against the sparse PyTorch path
    # on the graph it sampled (read off its mask), with the same dropout
    # seed: the same output and gradients, the memberships' included.
    from sbm_pyg.ops.csr import heads_first, nodes_first
    from sbm_pyg.ops.dense_attention import dense_attention, mask_keys
    from sbm_pyg.sampling import SampledGraph
    g = seeded(0)
    H, N, D = 2, 12, 4
    ptr = torch.tensor([0, 5, 12])
    x = [torch.randn(N, H, D, generator=g, dtype=torch.float64) for _ in range(3)]
    qm = torch.rand(N, H, 3, generator=g, dtype=torch.float64)
    km = torch.rand(N, H, 3, generator=g, dtype=torch.float64)
    block = torch.eye(3, dtype=torch.float64).expand(H, 3, 3) * 0.4
    w = torch.randn(N, H, D, generator=g, dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in x + [qm, km]]
        out = fn(*leaves)
        (out * w).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    keys = []

    def dense(q, k, v, qm_, km_):
        qb = heads_first(torch.einsum("nhu,huv->nhv", qm_, block)).contiguous()
        res = dense_attention(
            *(heads_first(t).contiguous() for t in (q, k, v)), qb,
            heads_first(km_).contiguous(), ptr, ptr, heads=H, scale=0.5,
            seed=seeds[0], ste="paper", dropout=0.4, dropout_seed=seeds[1],
            triton_on_cpu=triton_on_cpu)
        keys.append(mask_keys(res.mask, ptr, ptr, H))
        return nodes_first(res.out, H)

    got = grads(dense)
    graph = SampledGraph.from_keys(keys[0], H, N, N, ptr_q=ptr, ptr_k=ptr)
    assert 0 < graph.num_edges < H * (5 * 5 + 7 * 7)

    def sparse(q, k, v, qm_, km_):
        from sbm_pyg.ops.torch_attention import SparseAttention
        prob = edge_probability(qm_, block, km_, graph)
        out, _, _ = SparseAttention.apply(graph.csr, heads_first(q), heads_first(k),
                                       heads_first(v), prob, 0.5, 0.4, 99, "paper")
        return nodes_first(out, H)

    want = grads(sparse)
    for name, a, b in zip(["out", "q", "k", "v", "q_memb", "k_memb"], got, want):
        assert b.abs().max() > 0, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
