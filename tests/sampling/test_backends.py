"""fastrg's backends against each other: the same graph where it is
determined, independence from the thread count, the choice and the
fallback."""
import importlib
import math
import os

import pytest
import torch

from sbm_pyg import sampling
from sbm_pyg.ops import WITH_EXTENSION
from sbm_pyg.sampling import (
    fastrg_compiled,
)
from tests.helpers import seeded
from tests.sampling.cases import (
    needs_compiled,
    repeated,
    small_sbm,
)


@needs_compiled
@pytest.mark.parametrize("threshold", [0.0, 0.5, math.inf])
def test_compiled_equals_torch_where_the_graph_is_determined(threshold,
                                                             monkeypatch):
    # p_ij is 0 or >= 1 in exact mode: every backend must return exactly the
    # same graph, with self-loops and included edges, over a ragged batch.
    monkeypatch.setattr(fastrg_compiled, "DENSE_ROW_THRESHOLD", threshold)
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
    out = sampling.fastrg(memb, block, memb, backend="compiled",
                          generator=seeded(1), **kwargs)
    assert ref.num_edges > 100
    for name in ("edge_index", "head", "rowptr", "perm", "colptr", "ptr_q",
                 "ptr_k"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), name


@needs_compiled
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
                exploration=0.1, backend="compiled",
                generator=seeded(0)))
    finally:
        torch.set_num_threads(threads)
    for other in graphs[1:]:
        assert torch.equal(other.edge_index, graphs[0].edge_index)
        assert torch.equal(other.perm, graphs[0].perm)


def test_backend_argument():
    q, b, k = small_sbm()
    with pytest.raises(ValueError, match="backend"):
        sampling.fastrg(q, b, k, backend="cuda")
    if not WITH_EXTENSION:
        with pytest.raises(ValueError, match="backend='compiled'"):
            sampling.fastrg(q, b, k, backend="compiled")


@pytest.mark.skipif(os.environ.get("CI") is None, reason="CI only")
def test_ci_builds_the_compiled_backend():
    # CI tests both backends: the compiled one must have been built.
    assert WITH_EXTENSION


def test_without_the_compiled_kernels_fastrg_falls_back_to_torch(monkeypatch):
    # As after an install without a compiler: the default backend is torch.
    monkeypatch.setattr(importlib.import_module("sbm_pyg.sampling.fastrg"),
                        "WITH_EXTENSION", False)
    q, b, k = small_sbm()
    gen = seeded(0)
    graph = sampling.fastrg(q, b, k, generator=gen)
    ref = sampling.fastrg(q, b, k, backend="torch",
                          generator=seeded(0))
    assert torch.equal(graph.edge_index, ref.edge_index)
    with pytest.raises(ValueError, match="backend='compiled'"):
        sampling.fastrg(q, b, k, backend="compiled")
