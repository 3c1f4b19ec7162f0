"""fastrg_static: fastRG's law into buffers of a fixed size, its overflow,
its counter-based uniforms, and the padded CSR it writes; both backends
(the arrivals in PyTorch, the C++ row sampler) where the law is the same."""
import math

import pytest
import torch

from sbm_pyg.ops import WITH_EXTENSION
from sbm_pyg.sampling import expected_adjacency, expected_draws, fastrg_static, valid_graph
from sbm_pyg.sampling.checks import check_pointers, included_pairs
from sbm_pyg.sampling.static_fastrg import counter_uniform
from tests.helpers import max_binomial_z, seeded, z_bound
from tests.sampling.cases import (
    NQ,
    TRIALS,
    H,
    check_marginals,
    repeated,
    sample_counts,
    small_sbm,
)

BACKENDS = ["torch", pytest.param("cpp", marks=pytest.mark.skipif(
    not WITH_EXTENSION, reason="the C++ extension is not built"))]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def static_result(q, b, k, *, ptr_q=None, ptr_k=None, generator=None,
                  capacity=None, include_edges=None, mode="poisson", **kwargs):
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, q.size(0), k.size(0),
                                          q.device)
    included = None
    if include_edges is not None:
        *included, check = included_pairs(include_edges, ptr_q, ptr_k,
                                          q.size(0), k.size(0))
        checks.append(check)
    seed = torch.randint(2**62, (), generator=generator, device=q.device)
    if capacity is None:  # ten deviations above the mean draws
        mean = float(fastrg_static(q, b, k, ptr_q, ptr_k, capacity=1, seed=seed,
                                   mode=mode, **kwargs).expected_draws)
        capacity = int(mean + 10 * math.sqrt(mean) + 64)
    res = fastrg_static(q, b, k, ptr_q, ptr_k, capacity=capacity, seed=seed,
                        mode=mode, included=included, **kwargs)
    for flag, message in checks + res.checks:
        assert not bool(flag), message
    return res


def static(q, b, k, **kwargs):
    """fastrg's signature: the valid graph, no overflow."""
    res = static_result(q, b, k, **kwargs)
    assert not bool(res.overflow)
    return valid_graph(res.graph)


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_marginals(mode, backend):
    check_marginals(lambda *a, **kw: static(*a, backend=backend, **kw), mode)


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_exploration_and_self_loops_marginals(mode, backend):
    delta = 0.3
    counts, prob, (q, b, k) = sample_counts(
        lambda *a, **kw: static(*a, backend=backend, **kw), mode,
        exploration=delta, self_loops=True, scale=3.0)
    assert torch.all(counts.diagonal(dim1=1, dim2=2) == TRIALS)
    off = ~torch.eye(NQ, dtype=torch.bool).expand(H, NQ, NQ)
    assert max_binomial_z(counts[off], TRIALS, prob[off]) < z_bound(int(off.sum()))
    plain = expected_adjacency(q, b, q, mode=mode, self_loops=True)
    assert max_binomial_z(counts[off], TRIALS, plain[off]) > z_bound(int(off.sum()))


def test_edge_counts_and_draws_follow_the_poisson_mean():
    # Edges of each (sequence, head) from the row pointer, the draws'
    # mean in closed form (the arrivals'; the C++ plan counts a dense row
    # at its keys, below).
    q, b, k = small_sbm()
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k)
    res = static_result(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, generator=seeded(4),
                        backend="torch")
    rate = torch.einsum("ihu,huv,jhv->hij", q, b, k)
    assert math.isclose(float(res.expected_draws), TRIALS * float(rate.sum()),
                        rel_tol=1e-9)
    graph = valid_graph(res.graph)
    assert torch.equal(res.edges, graph.edge_counts())
    mean = float((-torch.expm1(-rate)).sum(dim=(1, 2)).sum()) * TRIALS
    sd = math.sqrt(mean)  # a sum of Bernoullis: variance below the mean
    assert abs(graph.num_edges - mean) < 4 * sd


@pytest.mark.parametrize("mode", ["poisson", "exact"])
@pytest.mark.parametrize("exploration", [0.0, 0.1])
def test_expected_draws_is_the_samplers_mean_before_it_samples(mode, exploration,
                                                              backend):
    g = seeded(3)
    q, k = torch.rand(30, 2, 3, generator=g), torch.rand(25, 2, 3, generator=g)
    b = torch.rand(2, 3, 3, generator=g) * 0.2
    ptr_q, ptr_k = torch.tensor([0, 12, 30]), torch.tensor([0, 10, 25])
    res = fastrg_static(q, b, k, ptr_q, ptr_k, capacity=64, seed=torch.tensor(7),
                        mode=mode, exploration=exploration, backend=backend)
    mean = expected_draws(q, b, k, ptr_q, ptr_k, mode=mode, exploration=exploration,
                          backend=backend)
    assert mean.dtype == torch.float64 and mean.dim() == 0
    assert math.isclose(float(mean), float(res.expected_draws), rel_tol=1e-12)
    if mode == "poisson":  # sum of p_ij + exploration over each sequence's pairs
        rate = torch.einsum("ihu,huv,jhv->hij", q.double(), b.double(), k.double()) + exploration
        pairs = [(slice(0, 12), slice(0, 10)), (slice(12, 30), slice(10, 25))]
        closed = sum(float(rate[:, i, j].sum()) for i, j in pairs)
        if backend == "cpp":  # a row dense from half its keys counts them
            row = [rate[:, i, j].sum(-1) for i, j in pairs]
            closed = sum(float(torch.where(r >= 0.5 * n, float(n), r).sum())
                         for r, n in zip(row, (10, 15)))
        # The C++ plan sums W = Y B in the memberships' float32.
        assert math.isclose(float(mean), closed,
                            rel_tol=1e-9 if backend == "torch" else 1e-6)
    with pytest.raises(ValueError, match="mode"):
        expected_draws(q, b, k, ptr_q, ptr_k, mode="fast")


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_include_edges_is_a_union(mode, backend):
    q, b, _ = small_sbm()
    ptr = [0, 3, 6]
    include = torch.tensor([[0, 2, 2, 4, 5], [1, 0, 0, 3, 5]])
    kwargs = dict(ptr_q=ptr, ptr_k=ptr, mode=mode, capacity=256, backend=backend)
    plain = static(q, b, q, generator=seeded(3), **kwargs)
    union = static(q, b, q, include_edges=include, generator=seeded(3), **kwargs)

    def edges(g):
        j, i = g.edge_index
        return set(zip(g.head.tolist(), i.tolist(), j.tolist()))
    forced = {(h, i, j) for h in range(H) for j, i in include.t().tolist()}
    assert edges(union) == edges(plain) | forced
    assert forced - edges(plain), "nothing was added: the test is vacuous"
    assert union.num_edges == len(edges(union))


def test_a_larger_capacity_draws_the_same_graph(backend):
    # The arrivals (the rows' streams) depend on their index only: where
    # nothing overflows, the capacity pads and changes no edge; the seed does.
    q, b, k = small_sbm()
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=50)
    seed = torch.tensor(7)
    a, c = (fastrg_static(qq, b, kk, ptr_q, ptr_k, capacity=cap, seed=seed,
                          mode="exact", backend=backend) for cap in (8000, 20000))
    other = fastrg_static(qq, b, kk, ptr_q, ptr_k, capacity=8000,
                          seed=torch.tensor(8), mode="exact", backend=backend)
    assert not bool(a.overflow) and a.graph.csr.col.numel() == 8000
    ga, gc, go = (valid_graph(x.graph) for x in (a, c, other))
    assert torch.equal(ga.edge_index, gc.edge_index)
    assert torch.equal(ga.csr.perm, gc.csr.perm)
    assert not torch.equal(ga.edge_index, go.edge_index)


def test_overflow_is_flagged_and_stays_in_the_buffer(backend):
    q, b, k = small_sbm()
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=100)
    res = fastrg_static(qq, b, kk, ptr_q, ptr_k, capacity=100,
                        seed=torch.tensor(1), self_loops=False, backend=backend)
    assert float(res.expected_draws) > 1000
    assert bool(res.overflow)
    graph = valid_graph(res.graph)
    assert 0 < graph.num_edges <= 100
    assert int(res.edges.sum()) == graph.num_edges
    # Still a graph: rows and columns consistent.
    assert torch.equal(graph.csr.row_t(), graph.csr.row()[graph.csr.perm.long()])


def test_padded_csr_pointers_cover_the_valid_edges_only(backend):
    q, b, k = small_sbm()
    res = fastrg_static(q, b, k, *check_pointers(None, None, NQ, k.size(0),
                                                 q.device)[:2],
                        capacity=300, seed=torch.tensor(2), backend=backend)
    csr = res.graph.csr
    E = int(csr.rowptr[-1])
    assert E < 300 and int(csr.colptr[-1]) == E
    assert torch.all(csr.col[E:] == 0) and csr.perm.numel() == 300
    assert torch.equal(torch.sort(csr.perm[:E]).values,
                       torch.arange(E, dtype=csr.perm.dtype))
    assert torch.equal(csr.perm[E:], torch.arange(E, 300, dtype=csr.perm.dtype))
    assert torch.equal(csr.row()[:E].long(),
                       torch.repeat_interleave(csr.rowptr.diff().long()))


def test_exact_mode_flags_a_drawn_pair_above_one(backend):
    # p = 1.5 on a quarter of the pairs, 0.1 elsewhere: a mean of 0.45 that
    # the densities' check passes, but drawn pairs with p > 1.
    N = 40
    memb = torch.zeros(N, 1, 2, dtype=torch.float64)
    memb[: N // 2, 0, 0] = 1.0
    memb[N // 2:, 0, 1] = 1.0
    block = torch.tensor([[[1.5, 0.1], [0.1, 0.1]]], dtype=torch.float64)
    ptr = torch.tensor([0, N])
    res = fastrg_static(memb, block, memb, ptr, ptr, capacity=40_000,
                        seed=torch.tensor(3), mode="exact", backend=backend)
    assert bool(res.above_one) and not bool(res.overflow)
    fine = fastrg_static(memb, block * 0.6, memb, ptr, ptr, capacity=4000,
                         seed=torch.tensor(3), mode="exact", backend=backend)
    assert not bool(fine.above_one)
    # Exploration is no SBM probability: p + delta above 1 is allowed.
    explored = fastrg_static(memb, block * 0.6, memb, ptr, ptr, capacity=4000,
                             seed=torch.tensor(3), mode="exact", exploration=0.2,
                             backend=backend)
    assert not bool(explored.above_one)


def test_counter_uniform_is_uniform_and_streams_are_independent():
    n, bins = 200_000, 100
    index = torch.arange(n)
    u = counter_uniform(torch.tensor(5), 0, index)
    assert 0 < float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u, bins, 0, 1)
    # Each bin count is Binomial(n, 1/bins).
    assert max_binomial_z(counts.long(), n, torch.full((bins,), 1 / bins)) < z_bound(bins)
    v = counter_uniform(torch.tensor(5), 1, index)
    w = counter_uniform(torch.tensor(6), 0, index)
    for other in (v, w):
        r = float(torch.corrcoef(torch.stack([u, other]))[0, 1])
        assert abs(r) < 5 / math.sqrt(n)
    # Large indices (edge keys) too, and the same value for the same input.
    big = index + 2**40
    assert not torch.equal(counter_uniform(torch.tensor(5), 0, big), u)
    assert torch.equal(counter_uniform(torch.tensor(5), 0, index[:10]), u[:10])


@pytest.mark.parametrize("capacity, seed, error", [
    (0, torch.tensor(0), ValueError), (1.5, torch.tensor(0), ValueError),
    (10, 0, TypeError), (10, torch.tensor(0.0), TypeError)])
def test_bad_arguments(capacity, seed, error, backend):
    q, b, k = small_sbm()
    ptr_q, ptr_k, _ = check_pointers(None, None, NQ, k.size(0), q.device)
    with pytest.raises(error, match="capacity|seed"):
        fastrg_static(q, b, k, ptr_q, ptr_k, capacity=capacity, seed=seed,
                      backend=backend)


def test_bad_backend():
    q, b, k = small_sbm()
    ptr_q, ptr_k, _ = check_pointers(None, None, NQ, k.size(0), q.device)
    with pytest.raises(ValueError, match="backend must be one of"):
        fastrg_static(q, b, k, ptr_q, ptr_k, capacity=10, seed=torch.tensor(0),
                      backend="triton")


def test_buffers_beyond_int32_or_the_memory_are_refused_before_allocating(backend):
    q, b, k = small_sbm()
    ptr_q, ptr_k, _ = check_pointers(None, None, NQ, k.size(0), q.device)
    with pytest.raises(ValueError, match="2\\^31 - 1"):
        fastrg_static(q, b, k, ptr_q, ptr_k, capacity=2**31, seed=torch.tensor(0),
                      backend=backend)
    with pytest.raises(ValueError, match=r"capacity=2000000000.*GiB"):
        fastrg_static(q, b, k, ptr_q, ptr_k, capacity=2 * 10**9, seed=torch.tensor(0),
                      backend=backend)


@pytest.mark.parametrize("Nq, Nk, ptr_q, ptr_k", [
    (0, 5, [0, 0], [0, 5]), (4, 0, [0, 4], [0, 0]), (0, 0, [0], [0]),
    (4, 5, [0, 0, 4], [0, 5, 5])])
def test_no_pair_draws_an_empty_padded_graph(Nq, Nk, ptr_q, ptr_k, backend):
    # An empty query or key side, no sequence, or sequences whose other side
    # is empty: nothing drawn, every slot padding, pointers all zero.
    g = seeded(5)
    q, k = torch.rand(Nq, 2, 3, generator=g), torch.rand(Nk, 2, 3, generator=g)
    b = torch.rand(2, 3, 3, generator=g)
    res = fastrg_static(q, b, k, torch.tensor(ptr_q), torch.tensor(ptr_k), capacity=16,
                        seed=torch.tensor(1), backend=backend)
    csr = res.graph.csr
    assert csr.col.numel() == 16 and not bool(res.overflow)
    assert int(csr.rowptr[-1]) == 0 and int(csr.colptr[-1]) == 0
    assert csr.rowptr.numel() == 2 * Nq + 1 and csr.colptr.numel() == 2 * Nk + 1
    assert float(res.expected_draws) == 0.0 and int(res.edges.sum()) == 0
    assert res.edges.shape == (len(ptr_q) - 1, 2)
