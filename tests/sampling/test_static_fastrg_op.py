"""fastrg_static's "cpp" backend (the operator sbm_pyg::fastrg_capped): the
default route's graph for a seed while the draws fit, its rows in order up
to the capacity when they do not, dense rows counted at their keys, and one
graph for torch.compile."""
import pytest
import torch
import torch._dynamo.utils

from sbm_pyg.ops import WITH_EXTENSION
from sbm_pyg.sampling import expected_draws, fastrg_static, valid_graph
from sbm_pyg.sampling.checks import included_pairs
from sbm_pyg.sampling.fastrg import plan_fastrg
from sbm_pyg.validation import sync
from tests.helpers import seeded

pytestmark = pytest.mark.skipif(not WITH_EXTENSION,
                                reason="the C++ extension is not built")


def sbm(offset=0, n=(40, 90), H=2, k=5, scale=0.05):
    g = seeded(11 + offset)
    N = sum(n)
    q = torch.rand(N, H, k, generator=g)
    kk = torch.rand(N, H, k, generator=g)
    b = torch.rand(H, k, k, generator=g) * scale
    ptr = torch.tensor([0, n[0], N])
    return q, b, kk, ptr


def default_route(q, b, k, ptr, seed, **kwargs):
    planned = plan_fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, seed=seed, backend="cpp",
                          **kwargs)
    return planned.finish(sync(planned.checks, *planned.scalars))


def edge_set(graph):
    j, i = graph.edge_index
    return set(zip(graph.head.tolist(), i.tolist(), j.tolist()))


@pytest.mark.parametrize("mode", ["poisson", "exact"])
@pytest.mark.parametrize("offset", [0, 3, 7])
def test_the_default_routes_graph_for_a_seed(mode, offset):
    # Sparse rows, a sequence of dense rows (scale), exploration, self-loops
    # and included pairs: edge for edge the default route's CSR.
    q, b, k, ptr = sbm(offset)
    b[1] *= 40  # head 1's rows are sampled densely
    include = torch.tensor([[3, 5, 50], [1, 1, 60]])
    kwargs = dict(mode=mode, exploration=0.01, self_loops=True)
    seed = 2**61 + 12345 + offset
    ref = default_route(q, b, k, ptr, seed, include_edges=include, **kwargs)
    *included, check = included_pairs(include, ptr, ptr, q.size(0), k.size(0))
    res = fastrg_static(q, b, k, ptr, ptr, capacity=60_000, seed=torch.tensor(seed),
                        included=included, backend="cpp", **kwargs)
    assert not bool(res.overflow)
    got = valid_graph(res.graph)
    for name in ("rowptr", "col", "colptr", "perm"):
        assert torch.equal(getattr(got.csr, name), getattr(ref.csr, name)), name
    assert torch.equal(got.csr.row_t(), ref.csr.row_t())
    assert torch.equal(got.csr.row(), ref.csr.row())
    assert float(res.expected_draws) == pytest.approx(ref.expected_draws, rel=1e-12)
    assert torch.equal(res.edges, got.edge_counts())


@pytest.mark.parametrize("offset", [0, 3, 7])
def test_an_overflow_keeps_the_rows_that_fit_and_empties_the_rest(offset):
    q, b, k, ptr = sbm(offset, scale=0.5)
    seed = 99 + offset
    ref = default_route(q, b, k, ptr, seed)
    H, R = q.size(1), q.size(1) * q.size(0)
    capacity = ref.num_draws // 2
    res = fastrg_static(q, b, k, ptr, ptr, capacity=capacity, seed=torch.tensor(seed),
                        backend="cpp")
    assert bool(res.overflow)
    got = valid_graph(res.graph)
    assert 0 < got.num_edges <= capacity
    # The rows in order while they fit: the default route's up to the last
    # kept row, nothing after it.
    counts, ref_counts = got.csr.rowptr.diff(), ref.csr.rowptr.diff()
    last = int(torch.nonzero(counts).max())
    assert torch.equal(counts[:last + 1], ref_counts[:last + 1])
    assert int(counts[last + 1:].sum()) == 0 and int(ref_counts[last + 1:].sum()) > 0
    E = got.num_edges
    assert torch.equal(got.csr.col, ref.csr.col[:E])
    assert got.csr.rowptr.numel() == R + 1 and H == 2
    # Still a graph: its column order is its own.
    assert torch.equal(got.csr.row_t(), got.csr.row()[got.csr.perm.long()])


def test_expected_draws_count_a_dense_row_at_its_keys():
    q, b, k, ptr = sbm()
    b[0] *= 200  # head 0 dense: its rows cost their keys, not their rate
    for mode in ("poisson", "exact"):
        ref = default_route(q, b, k, ptr, 5, mode=mode)
        mean = expected_draws(q, b, k, ptr, ptr, mode=mode, backend="cpp")
        assert float(mean) == pytest.approx(ref.expected_draws, rel=1e-12)
        torch_mean = expected_draws(q, b, k, ptr, ptr, mode=mode, backend="torch")
        assert float(torch_mean) > 1.5 * float(mean)  # the rates, far above


def test_one_graph_for_torch_compile():
    q, b, k, ptr = sbm()

    def edges(q, seed):
        res = fastrg_static(q, b, k, ptr, ptr, capacity=8192, seed=seed, mode="exact",
                            backend="cpp")
        return res.graph.csr.col, res.edges, res.overflow

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(edges, fullgraph=True, dynamic=False)
    for s in (1, 2, 3):
        seed = torch.tensor(s)
        for a, c in zip(compiled(q, seed), edges(q, seed)):
            assert torch.equal(a, c)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_cpu_only():
    q, b, k, ptr = sbm()
    with pytest.raises(ValueError, match="sampler backend 'cpp' runs on the CPU"):
        fastrg_static(q.to("meta"), b.to("meta"), k.to("meta"), ptr, ptr,
                      capacity=10, seed=torch.tensor(0), backend="cpp")
