"""fastrg's backends against each other: the same graph where it is
determined, independence from the thread count, the choice and the
fallback."""
import math
import os

import pytest
import torch

from sbm_pyg import sampling
from sbm_pyg.ops import WITH_EXTENSION, backend_info
from sbm_pyg.sampling import (
    fastrg_op,
)
from tests.helpers import max_binomial_z, seeded, z_bound
from tests.markers import needs_cpp, needs_triton
from tests.sampling.cases import (
    pair_counts,
    repeated,
    small_sbm,
)


@needs_cpp
@pytest.mark.parametrize("threshold", [0.0, 0.5, math.inf])
def test_compiled_equals_torch_where_the_graph_is_determined(threshold,
                                                             monkeypatch):
    # p_ij is 0 or >= 1 in exact mode: every backend must return exactly the
    # same graph, with self-loops and included edges, over a ragged batch.
    monkeypatch.setattr(fastrg_op, "DENSE_ROW_THRESHOLD", threshold)
    g = seeded(0)
    n, H, k = 40, 2, 3
    memb = torch.nn.functional.one_hot(torch.randint(k, (n, H), generator=g),
                                       k).double()
    block = torch.eye(k, dtype=torch.float64).repeat(H, 1, 1) * 1.5
    block[1, 0, 0] = 0.0  # head 1 never links cluster 0 to itself
    ptr = [0, 7, 7, 25, 40]
    include = torch.tensor([[0, 3, 10, 30, 39], [6, 3, 24, 35, 25]])
    kwargs = dict(ptr_q=ptr, ptr_k=ptr, mode="exact", self_loops=True,
                  include_edges=include)
    ref = sampling.fastrg(memb, block, memb, backend="torch", **kwargs)
    out = sampling.fastrg(memb, block, memb, backend="cpp",
                          generator=seeded(1), **kwargs)
    assert ref.num_edges > 100
    for name in ("edge_index", "head", "rowptr", "perm", "colptr", "ptr_q",
                 "ptr_k"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), name


@needs_cpp
def test_compiled_graph_does_not_depend_on_the_thread_count():
    q, b, k = small_sbm(scale=2.0)
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=300)
    threads = torch.get_num_threads()
    graphs = []
    try:
        for num in (1, 2, 3):
            torch.set_num_threads(num)
            graphs.append(sampling.fastrg(
                qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, mode="exact",
                exploration=0.1, backend="cpp",
                generator=seeded(0)))
    finally:
        torch.set_num_threads(threads)
    for other in graphs[1:]:
        assert torch.equal(other.edge_index, graphs[0].edge_index)
        assert torch.equal(other.perm, graphs[0].perm)


@needs_cpp
def test_chunked_draws_do_not_depend_on_the_thread_count():
    # Sequences of 2048 keys or more draw by chunk of rows in the C++
    # kernel, and a chunk's size follows the thread count: the graph must
    # not. Ragged queries, so that chunks straddle a sequence's and a
    # head's first row.
    g = seeded(3)
    q = torch.rand(601, 2, 8, generator=g)
    k = torch.rand(4100, 2, 8, generator=g)
    block = torch.rand(2, 8, 8, generator=g) * 0.002
    kwargs = dict(ptr_q=[0, 257, 601], ptr_k=[0, 2050, 4100], mode="exact",
                  exploration=0.002, backend="cpp")
    threads = torch.get_num_threads()
    graphs = []
    try:
        for num in (1, 2, 3):
            torch.set_num_threads(num)
            graphs.append(sampling.fastrg(q, block, k, generator=seeded(7), **kwargs))
    finally:
        torch.set_num_threads(threads)
    assert graphs[0].num_draws > 20_000
    for other in graphs[1:]:
        assert torch.equal(other.edge_index, graphs[0].edge_index)
        assert torch.equal(other.perm, graphs[0].perm)


def test_backend_argument():
    q, b, k = small_sbm()
    with pytest.raises(ValueError, match="backend"):
        sampling.fastrg(q, b, k, backend="cuda")
    # (without the extension "cpp" raises: the test below, on every machine)


@pytest.mark.skipif(os.environ.get("CI") is None, reason="CI only")
def test_ci_builds_the_compiled_backend():
    # CI tests both backends: the compiled one must have been built.
    assert WITH_EXTENSION


@pytest.mark.host
def test_without_the_compiled_kernels_fastrg_falls_back_to_torch(monkeypatch):
    # As after an install without a compiler: the default backend is torch.
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    q, b, k = small_sbm()
    gen = seeded(0)
    graph = sampling.fastrg(q, b, k, generator=gen)
    ref = sampling.fastrg(q, b, k, backend="torch",
                          generator=seeded(0))
    assert torch.equal(graph.edge_index, ref.edge_index)
    with pytest.raises(ValueError, match="backend 'cpp' needs the compiled"):
        sampling.fastrg(q, b, k, backend="cpp")


def _edge_set(graph):
    return set(map(tuple, torch.cat([graph.head[None], graph.edge_index]).T.tolist()))


@needs_triton
@pytest.mark.parametrize("mode, exploration, dtype, threshold", [
    ("exact", 0.0, torch.float32, 0.5), ("poisson", 0.05, torch.float64, 0.5),
    ("exact", 0.02, torch.float64, 0.0), ("poisson", 0.0, torch.float32, math.inf)])
@pytest.mark.slow
def test_triton_gives_the_cpp_graph_for_the_same_seed(mode, exploration, dtype,
                                                      threshold, monkeypatch):
    # The same row streams, key tables and algorithm: the same edges
    # (up to floating-point ties, so >= 99.9% overlap where they could
    # differ: another device's sums and exp), over a ragged batch with
    # sparse rows (Poisson by inversion and by PTRS: degrees around 12),
    # dense rows, self-loops and included edges. The C++ kernel runs on CPU
    # copies with the same seed.
    _same_graph(mode, exploration, dtype, threshold, monkeypatch)


@needs_triton
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_triton_rows_past_the_register_sort_give_the_cpp_graph(mode,
                                                               monkeypatch):
    # With register sorts of at most 2 and 4 entries, rows of 3 or 4 draws
    # and forced keys take the larger sort and every longer row the bitmap
    # (exact mode thins there, then the forced keys are set): the graph is
    # the C++ kernel's all the same.
    from sbm_pyg.sampling import fastrg_triton
    monkeypatch.setattr(fastrg_triton, "SORT_SIZES", (2, 4))
    monkeypatch.setattr(fastrg_triton, "SORT_BLOCK", 4)
    _same_graph(mode, 0.02, torch.float64, 0.5, monkeypatch)


@needs_triton
def test_triton_gives_the_cpp_graph_where_rows_draw_by_chunk(monkeypatch):
    # The C++ kernel draws the rows of a sequence of 2048 keys or more by
    # chunk: every draw's cluster and word first, then the draws grouped by
    # key table and resolved table by table. The Triton kernel draws row by
    # row. Few queries against many keys (the interpreter runs a program a
    # row), a short sequence drawn row by row in the same chunks, the
    # exploration's uniform keys and exact mode's thinning, which continues
    # each row's stream after its draws: the same graph, edge for edge.
    monkeypatch.setattr(fastrg_op, "stream_seed", lambda *_: 2**61 + 54321)
    device = torch.get_default_device()
    g = torch.Generator("cpu").manual_seed(3)
    with torch.device("cpu"):
        q = torch.rand(12, 2, 4, generator=g, dtype=torch.float64)
        memb_k = torch.rand(2100, 2, 4, generator=g, dtype=torch.float64)
        block = torch.rand(2, 4, 4, generator=g, dtype=torch.float64) * 0.06
        kwargs = dict(ptr_q=[0, 2, 2, 12], ptr_k=[0, 5, 5, 2100], mode="exact",
                      exploration=0.01)
        ref = sampling.fastrg(q, block, memb_k, backend="cpp", **kwargs)
    out = sampling.fastrg(q.to(device), block.to(device), memb_k.to(device),
                          backend="triton", **kwargs)
    degree = ref.rowptr.diff()
    assert degree[[2, 3, 4, 5, 14, 15, 16, 17]].min() > 50  # the long rows
    assert out.num_draws == ref.num_draws
    if device.type == "cpu":  # the interpreter: numpy's float64, no ties
        for name in ("edge_index", "head", "rowptr", "perm", "colptr"):
            assert torch.equal(getattr(out, name), getattr(ref, name)), name
    else:
        a, b = _edge_set(ref), _edge_set(out.to("cpu"))
        assert len(a & b) >= 0.999 * max(len(a), len(b))


def _same_graph(mode, exploration, dtype, threshold, monkeypatch):
    monkeypatch.setattr(fastrg_op, "DENSE_ROW_THRESHOLD", threshold)
    monkeypatch.setattr(fastrg_op, "stream_seed", lambda *_: 2**61 + 12345)
    device = torch.get_default_device()
    g = torch.Generator("cpu").manual_seed(0)
    n, H, k = 80, 2, 4
    with torch.device("cpu"):
        q = torch.rand(n, H, k, generator=g, dtype=dtype)
        memb_k = torch.rand(n, H, k, generator=g, dtype=dtype)
        block = torch.rand(H, k, k, generator=g, dtype=dtype) * 0.1
        block[1] *= 12  # head 1: denser rows
        ptr = [0, 3, 3, 80]
        include = torch.tensor([[0, 3, 10, 70], [2, 3, 10, 79]])
        kwargs = dict(ptr_q=ptr, ptr_k=ptr, mode=mode, exploration=exploration,
                      self_loops=True)
        ref = sampling.fastrg(q, block, memb_k, backend="cpp",
                              include_edges=include, **kwargs)
    out = sampling.fastrg(q.to(device), block.to(device), memb_k.to(device),
                          backend="triton", include_edges=include.to(device),
                          **kwargs)
    assert 500 < ref.num_edges < 0.9 * 2 * (3 * 3 + 77 * 77)
    a, b = _edge_set(ref), _edge_set(out.to("cpu"))
    assert len(a & b) >= 0.999 * max(len(a), len(b))
    assert out.num_draws == ref.num_draws
    if device.type == "cpu":  # the interpreter: numpy's float64, no ties
        for name in ("edge_index", "head", "rowptr", "perm", "colptr"):
            assert torch.equal(getattr(out, name), getattr(ref, name)), name


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_triton_marginals(mode):
    # Fewer trials than the other backends' marginal tests (the interpreter
    # is slow), so wider tolerance per pair; z_bound still bounds the
    # largest of all pairs' z-scores at the family-wise level.
    trials = 80
    q, b, k = small_sbm(scale=2.0)
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=trials)
    graph = sampling.fastrg(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, mode=mode,
                            backend="triton", generator=seeded(4))
    counts = pair_counts(graph, q.size(0), k.size(0))
    prob = sampling.expected_adjacency(q, b, k, mode=mode)
    assert max_binomial_z(counts, trials, prob) < z_bound(prob.numel())
    # Power: probabilities half as large are rejected by the same test.
    assert max_binomial_z(counts, trials, prob / 2) > z_bound(prob.numel())
