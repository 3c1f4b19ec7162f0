import functools
import importlib
import math
import os

import pytest
import torch

from sbm_pyg import sampling
from sbm_pyg.ops import WITH_EXTENSION
from sbm_pyg.sampling import (
    SampledGraph,
    bernoulli,
    expected_adjacency,
    fastrg_compiled,
)
from tests.helpers import TEST_DEVICE, max_binomial_z, seeded, z_bound

needs_compiled = pytest.mark.skipif(
    not WITH_EXTENSION or TEST_DEVICE.type != "cpu",
    reason="sbm_pyg._C not built, or the tests run on another device")
# A test that takes `sample` runs on each backend of fastrg: the
# pure-PyTorch reference, the compiled one as configured, and the compiled
# one with all rows sampled densely (one Bernoulli per key) or all by drawing.
BACKENDS = [
    ("torch", None),
    pytest.param(("compiled", None), marks=needs_compiled),
    pytest.param(("compiled", 0.0), marks=needs_compiled, id="compiled-dense"),
    pytest.param(("compiled", math.inf), marks=needs_compiled,
                 id="compiled-drawn"),
]


@pytest.fixture(params=BACKENDS, ids=lambda p: p[0] if isinstance(p, tuple) else None)
def sample(request, monkeypatch):
    """fastrg on the backend under test."""
    name, threshold = request.param
    if threshold is not None:
        monkeypatch.setattr(fastrg_compiled, "DENSE_ROW_THRESHOLD", threshold)
    return functools.partial(sampling.fastrg, backend=name)


NQ, NK, H, K = 6, 5, 2, 3
TRIALS = 3000


def small_sbm(dtype=torch.float64, scale=1.0, device=None):
    g = seeded(0)
    q = torch.rand(NQ, H, K, generator=g, dtype=dtype)
    k = torch.rand(NK, H, K, generator=g, dtype=dtype)
    b = torch.rand(H, K, K, generator=g, dtype=dtype) * 0.28 * scale
    return q.to(device), b.to(device), k.to(device)


def repeated(q, b, k, trials=TRIALS):
    """The same sequence ``trials`` times as one ragged batch."""
    ptr_q = torch.arange(trials + 1, device=q.device) * q.size(0)
    ptr_k = torch.arange(trials + 1, device=q.device) * k.size(0)
    return q.repeat(trials, 1, 1), b, k.repeat(trials, 1, 1), ptr_q, ptr_k


def pair_counts(graph: SampledGraph, nq: int, nk: int) -> torch.Tensor:
    """[H, nq, nk] how often each (head, query, key) of the repeated sequence
    was sampled; also asserts no edge crosses sequences."""
    j, i = graph.edge_index
    assert torch.equal(i // nq, j // nk), "edge across sequences"
    flat = (graph.head * nq + i % nq) * nk + j % nk
    return torch.bincount(flat, minlength=graph.num_heads * nq * nk).view(-1, nq, nk)


def sample_counts(sampler, mode, exploration=0.0, self_loops=False, scale=1.0,
                  seed=1):
    """Counts of each (head, query, key) over TRIALS independent samples."""
    q, b, k = small_sbm(scale=scale)
    if self_loops:  # queries and keys must be the same sequences
        k = q
    kwargs = dict(mode=mode, exploration=exploration, self_loops=self_loops)
    gen = seeded(seed)
    if sampler is not bernoulli:  # one call on TRIALS copies of the sequence
        qq, b, kk, ptr_q, ptr_k = repeated(q, b, k)
        graph = sampler(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, generator=gen,
                        **kwargs)
        counts = pair_counts(graph, q.size(0), k.size(0))
    else:  # the dense reference: TRIALS calls
        counts = sum(pair_counts(sampler(q, b, k, generator=gen, **kwargs),
                                 q.size(0), k.size(0)) for _ in range(TRIALS))
    prob = expected_adjacency(q, b, k, **kwargs)
    return counts, prob, (q, b, k)


def check_marginals(sampler, mode):
    counts, prob, (q, b, k) = sample_counts(sampler, mode)
    rate = torch.einsum("ihu,huv,jhv->hij", q, b, k)
    assert 0.05 < float(rate.min()) and float(rate.max()) < 0.95
    # The closed forms the test checks against.
    expected = -torch.expm1(-rate) if mode == "poisson" else rate
    assert torch.allclose(prob, expected)
    bound = z_bound(prob.numel())
    assert max_binomial_z(counts, TRIALS, prob) < bound
    # Power: the other mode's marginals are rejected by the same test.
    wrong = rate if mode == "poisson" else -torch.expm1(-rate)
    assert max_binomial_z(counts, TRIALS, wrong) > bound


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_marginals(sample, mode):
    check_marginals(sample, mode)


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_bernoulli_marginals(mode):
    check_marginals(bernoulli, mode)


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_exploration_marginals(sample, mode):
    # scale 3 puts some rates p + delta above 1: exact mode caps them at 1.
    delta = 0.3
    counts, prob, (q, b, k) = sample_counts(sample, mode, exploration=delta,
                                            scale=3.0)
    rate = torch.einsum("ihu,huv,jhv->hij", q, b, k) + delta
    expected = -torch.expm1(-rate) if mode == "poisson" else rate.clamp(max=1)
    assert torch.allclose(prob, expected)
    if mode == "exact":
        assert bool((rate > 1).any())
    assert max_binomial_z(counts, TRIALS, prob) < z_bound(prob.numel())
    # Without exploration the marginals would be rejected.
    plain = expected_adjacency(q, b, k, mode=mode)
    assert max_binomial_z(counts, TRIALS, plain) > z_bound(prob.numel())


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_self_loops_marginals(sample, mode):
    counts, prob, _ = sample_counts(sample, mode, self_loops=True)
    assert torch.all(counts.diagonal(dim1=1, dim2=2) == TRIALS)
    assert torch.all(prob.diagonal(dim1=1, dim2=2) == 1)
    off = ~torch.eye(NQ, dtype=torch.bool).expand(H, NQ, NQ)
    assert max_binomial_z(counts[off], TRIALS, prob[off]) < z_bound(int(off.sum()))


def test_self_loops_need_same_sequences(sample):
    q, b, k = small_sbm()
    with pytest.raises(ValueError, match="self_loops"):
        sample(q, b, k, self_loops=True)  # N_q != N_k
    with pytest.raises(ValueError, match="ptr_q must equal ptr_k"):
        sample(q, b, q, ptr_q=[0, 2, 6], ptr_k=[0, 3, 6], self_loops=True)


def edge_set(graph: SampledGraph) -> set:
    j, i = graph.edge_index
    return set(zip(graph.head.tolist(), i.tolist(), j.tolist()))


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_include_edges_is_a_union(sample, mode):
    # Two sequences of 3 and 3 nodes; included edges (key j, query i), one
    # repeated and one already likely to be sampled.
    q, b, k = small_sbm()
    ptr = [0, 3, 6]
    include = torch.tensor([[0, 2, 2, 4, 5], [1, 0, 0, 3, 5]])
    kwargs = dict(ptr_q=ptr, ptr_k=ptr, mode=mode)
    plain = sample(q, b, q, generator=seeded(3), **kwargs)
    union = sample(q, b, q, include_edges=include,
                   generator=seeded(3), **kwargs)
    forced = {(h, i, j) for h in range(H) for j, i in include.t().tolist()}
    assert edge_set(union) == edge_set(plain) | forced
    assert forced - edge_set(plain), "nothing was added: the test is vacuous"
    assert union.num_edges == len(edge_set(union))  # no duplicates
    key = (union.head * NQ + union.edge_index[1]) * NQ + union.edge_index[0]
    assert torch.all(key.diff() > 0)  # still sorted by (head, query, key)


def test_include_edges_bad_input(sample):
    q, b, k = small_sbm()
    ptr = [0, 3, 6]
    with pytest.raises(ValueError, match="include_edges.*within one sequence"):
        sample(q, b, q, ptr_q=ptr, ptr_k=ptr,
               include_edges=torch.tensor([[0], [4]]))  # crosses sequences
    with pytest.raises(ValueError, match="include_edges.*N_k=5"):
        sample(q, b, k, include_edges=torch.tensor([[5], [0]]))
    with pytest.raises(ValueError, match="include_edges.*N_k=5"):
        sample(q, b, k, include_edges=torch.tensor([[-1], [0]]))
    with pytest.raises(TypeError, match="include_edges"):
        sample(q, b, k, include_edges=torch.tensor([[0.0], [1.0]]))
    with pytest.raises(TypeError, match="include_edges"):
        sample(q, b, k, include_edges=torch.tensor([[0, 1, 2]]))


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_edge_count_matches_poisson_mean(mode, sample):
    # With every row dense (one Bernoulli per key) nothing is drawn from a
    # Poisson law: num_draws counts the tested pairs, and only the distinct
    # edge count is checked.
    dense_rows = sample.keywords["backend"] == "compiled" and (
        fastrg_compiled.DENSE_ROW_THRESHOLD == 0.0)
    q, b, k = small_sbm(scale=0.5)
    gen = seeded(2)
    runs = 400
    draws, edges = [], []
    for _ in range(runs):
        graph = sample(q, b, k, mode=mode, generator=gen)
        draws.append(graph.num_draws)
        edges.append(graph.num_edges)
    lam = graph.expected_draws
    rate = torch.einsum("ihu,huv,jhv->hij", q, b, k)
    if dense_rows:
        assert lam == H * NQ * NK
    elif mode == "poisson":  # exact mode inflates the rate by c >= 1
        assert math.isclose(lam, float(rate.sum()), rel_tol=1e-12)
    else:
        assert lam > float(rate.sum())
    draws = torch.tensor(draws, dtype=torch.float64)
    bound = z_bound(3)
    if dense_rows:
        assert torch.all(draws == H * NQ * NK)
    else:
        # Mean and index of dispersion of a Poisson(lam) sample.
        assert abs(float(draws.mean()) - lam) / math.sqrt(lam / runs) < bound
        dispersion = float(((draws - draws.mean()) ** 2).sum()) / lam
        assert abs(dispersion - (runs - 1)) / math.sqrt(2 * (runs - 1)) < bound
    # Distinct edges: a sum of independent Bernoullis.
    prob = expected_adjacency(q, b, k, mode=mode)
    mean, var = float(prob.sum()), float((prob * (1 - prob)).sum())
    edges = torch.tensor(edges, dtype=torch.float64)
    assert abs(float(edges.mean()) - mean) / math.sqrt(var / runs) < bound


def test_heads_are_independent(sample):
    q, b, k = small_sbm()
    # Both heads get head 0's parameters: same marginals, independent draws.
    q, b, k = (t.clone() for t in (q, b, k))
    q[:, 1], b[1], k[:, 1] = q[:, 0], b[0], k[:, 0]
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k)
    graph = sample(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k,
                   generator=seeded(3))
    j, i = graph.edge_index
    key = i * kk.size(0) + j  # (sequence, query, key) without the head
    values, seen = torch.unique(key, return_counts=True)
    both = values[seen == 2]  # sampled in both heads
    local = (both // kk.size(0)) % NQ * NK + both % kk.size(0) % NK
    joint = torch.bincount(local, minlength=NQ * NK).view(NQ, NK)
    prob = expected_adjacency(q, b, k)[0]
    assert max_binomial_z(joint, TRIALS, prob ** 2) < z_bound(prob.numel())
    assert not torch.equal(key[graph.head == 0], key[graph.head == 1])


def test_ragged_batch_marginals_and_no_crossing(sample):
    q, b, k = small_sbm()
    # Alternating sequences of lengths (6, 5) and (3, 2): each sequence keeps
    # the marginals of its own rows.
    reps = 1500
    rows_q = torch.cat([torch.arange(NQ), torch.arange(3)]).repeat(reps)
    rows_k = torch.cat([torch.arange(NK), torch.arange(2)]).repeat(reps)
    lens_q = torch.tensor([NQ, 3]).repeat(reps)
    lens_k = torch.tensor([NK, 2]).repeat(reps)
    ptr_q = torch.cat([torch.zeros(1, dtype=torch.long), lens_q.cumsum(0)])
    ptr_k = torch.cat([torch.zeros(1, dtype=torch.long), lens_k.cumsum(0)])
    graph = sample(q[rows_q], b, k[rows_k], ptr_q=ptr_q, ptr_k=ptr_k,
                   generator=seeded(4))
    j, i = graph.edge_index
    seq_q = torch.searchsorted(ptr_q, i, right=True) - 1
    seq_k = torch.searchsorted(ptr_k, j, right=True) - 1
    assert torch.equal(seq_q, seq_k)
    for parity, (nq, nk) in enumerate([(NQ, NK), (3, 2)]):
        sel = seq_q % 2 == parity
        flat = (graph.head[sel] * nq + (i - ptr_q[seq_q])[sel]) * nk + (j - ptr_k[seq_k])[sel]
        counts = torch.bincount(flat, minlength=H * nq * nk).view(H, nq, nk)
        prob = expected_adjacency(q[:nq], b, k[:nk])
        assert max_binomial_z(counts, reps, prob) < z_bound(2 * prob.numel())


def test_graph_structure(sample):
    q, b, k = small_sbm(scale=2.0)
    qq, b, kk, ptr_q, ptr_k = repeated(q, b, k, trials=20)
    graph = sample(qq, b, kk, ptr_q=ptr_q, ptr_k=ptr_k, exploration=0.1,
                   generator=seeded(5))
    Nq, Nk, E = qq.size(0), kk.size(0), graph.num_edges
    j, i = graph.edge_index
    key = (graph.head * Nq + i) * Nk + j
    assert E > 0 and bool((key.diff() > 0).all())  # sorted, no duplicates
    row = graph.head * Nq + i
    assert torch.equal(graph.rowptr, torch.searchsorted(row, torch.arange(H * Nq + 1)))
    t_key = ((graph.head * Nk + j) * Nq + i)[graph.perm]
    assert bool((t_key.diff() > 0).all())
    assert torch.equal(torch.sort(graph.perm).values, torch.arange(E))
    colptr, row_t = graph.csr_t()
    col_sorted = (graph.head * Nk + j)[graph.perm]
    assert torch.equal(colptr, torch.searchsorted(col_sorted, torch.arange(H * Nk + 1)))
    assert torch.equal(row_t, row[graph.perm])
    # edge_counts / density against a direct count.
    seq = torch.searchsorted(ptr_q, i, right=True) - 1
    direct = torch.bincount(seq * H + graph.head, minlength=20 * H).view(20, H)
    assert torch.equal(graph.edge_counts(), direct)
    assert torch.allclose(graph.density(), direct.double() / (NQ * NK))


def test_generator_determinism(sample):
    q, b, k = small_sbm()
    graphs = [sample(q, b, k, mode=m, generator=seeded(s))
              for m, s in [("poisson", 7), ("poisson", 7), ("poisson", 8),
                           ("exact", 7), ("exact", 7)]]
    assert torch.equal(graphs[0].edge_index, graphs[1].edge_index)
    assert torch.equal(graphs[0].head, graphs[1].head)
    assert not torch.equal(graphs[0].edge_index, graphs[2].edge_index)
    assert torch.equal(graphs[3].edge_index, graphs[4].edge_index)


def test_empty_sequences_and_zero_edges(sample):
    q, b, k = small_sbm()
    graph = sample(q, b, k, ptr_q=[0, 3, 3, 6], ptr_k=[0, 2, 2, 5],
                   generator=seeded(0))
    assert graph.num_graphs == 3
    assert torch.all(graph.edge_counts()[1] == 0)
    assert torch.all(graph.density()[1] == 0)
    empty = sample(q, torch.zeros_like(b), k)
    assert empty.num_edges == 0 and empty.num_draws == 0
    assert empty.edge_index.shape == (2, 0)
    assert torch.all(empty.rowptr == 0) and torch.all(empty.colptr == 0)
    nothing = sample(q[:0], b, k[:0])
    assert nothing.num_edges == 0 and nothing.rowptr.shape == (1,)


def test_expected_adjacency_dense_reference():
    q, b, k = small_sbm()
    P = expected_adjacency(q, b, k, ptr_q=[0, 2, 6], ptr_k=[0, 4, 5],
                           mode="exact")
    p = torch.einsum("ihu,huv,jhv->hij", q, b, k).clamp(max=1)
    assert torch.allclose(P[:, :2, :4], p[:, :2, :4])
    assert torch.allclose(P[:, 2:, 4:], p[:, 2:, 4:])
    assert torch.all(P[:, :2, 4:] == 0) and torch.all(P[:, 2:, :4] == 0)


BAD_INPUTS = [
    (dict(q=lambda q: -q), ValueError, "q_memb"),
    (dict(b=lambda b: b.index_fill(1, torch.tensor([0]), float("nan"))), ValueError, "block"),
    (dict(k=lambda k: k.index_fill(0, torch.tensor([1]), float("inf"))), ValueError, "k_memb"),
    (dict(q=lambda q: q[:, 0]), ValueError, "q_memb"),
    (dict(q=lambda q: q.long()), TypeError, "q_memb"),
    (dict(b=lambda b: b[:, :2]), ValueError, "block"),
    (dict(k=lambda k: k[:, :1]), ValueError, "k_memb"),
    (dict(q="not a tensor"), TypeError, "q_memb"),
    (dict(ptr_q=[0, 3, 5]), ValueError, "ptr_q"),
    (dict(ptr_q=[0, 4, 2, 6], ptr_k=[0, 1, 2, 5]), ValueError, "ptr_q"),
    (dict(ptr_k=[0, 2, 5]), ValueError, "ptr_q and ptr_k"),
    (dict(ptr_q=torch.tensor([0.0, 6.0])), TypeError, "ptr_q"),
    (dict(mode="dense"), ValueError, "mode"),
    (dict(exploration=-0.1), ValueError, "exploration"),
    (dict(exploration=float("nan")), ValueError, "exploration"),
    (dict(max_edges=-1), ValueError, "max_edges"),
    (dict(b=lambda b: b * 1e308), ValueError, "overflow"),
]


@pytest.mark.parametrize("change,error,match", BAD_INPUTS)
def test_bad_input(sample, change, error, match):
    q, b, k = small_sbm()
    args = dict(q=q, b=b, k=k)
    kwargs = {}
    for name, value in change.items():
        if name in args:
            args[name] = value(args[name]) if callable(value) else value
        else:
            kwargs[name] = value
    with pytest.raises(error, match=match):
        sample(args["q"], args["b"], args["k"], **kwargs)


def test_max_edges_error_names_counts(sample):
    q, b, k = small_sbm()
    with pytest.raises(ValueError, match=r"N_q=6, N_k=5 drew \d+ edges "
                                         r"\(expected [\d.]+\), more than "
                                         r"max_edges=3"):
        sample(q, b, k, max_edges=3, generator=seeded(0))


def test_dense_head_at_64k_raises_instead_of_allocating(sample):
    n = 65536
    ones = torch.ones(n, 1, 1)
    block = torch.ones(1, 1, 1)  # p = 1 everywhere: 4.3e9 expected edges
    with pytest.raises(ValueError, match="max_edges=10000000"):
        sample(ones, block, ones, max_edges=10_000_000)
    # Without max_edges, the memory guard refuses the allocation.
    with pytest.raises(ValueError, match="GiB"):
        sample(ones, block, ones)


def test_to_device_roundtrip(sample, device):
    q, b, k = small_sbm(device=device)
    graph = sample(q, b, k, generator=torch.Generator(device).manual_seed(0))
    assert graph.device.type == device.type
    moved = graph.to("cpu")
    assert torch.equal(moved.edge_index, graph.edge_index.cpu())
    assert moved.num_draws == graph.num_draws


def conversion_graph():
    q, b, k = small_sbm(scale=2.0)
    ptr_q, ptr_k = [0, 2, 6], [0, 3, 5]
    graph = sampling.fastrg(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, generator=seeded(0))
    masks = torch.zeros(H, NQ, NK, dtype=torch.bool)
    masks[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    assert masks.any(-1).any(-1).all() and (~masks[:, 2:, :3]).all()
    return graph, masks


@pytest.mark.parametrize("head", [0, 1, None])
def test_to_sparse_csr_and_edge_index(head):
    graph, masks = conversion_graph()
    expected = masks[head] if head is not None else torch.block_diag(
        *masks.int()).bool()  # [H N_q, H N_k]
    csr = graph.to_sparse_csr(head)
    assert csr.layout == torch.sparse_csr
    assert torch.equal(csr.to_dense().bool(), expected)
    ei = graph.to_edge_index(head)
    assert ei.sparse_size() == expected.t().shape
    assert ei.is_sorted_by_col and ei._indptr is not None
    assert torch.equal(ei.get_csc()[0][0], csr.crow_indices())
    assert torch.equal(ei.to_dense().bool(), expected.t())  # key -> query
    back = SampledGraph.from_edge_index(ei, *expected.shape)
    assert torch.equal(back.to_sparse_csr().to_dense().bool(), expected)
    back = SampledGraph.from_edge_index(csr, *expected.shape)
    assert torch.equal(back.to_sparse_csr().to_dense().bool(), expected)


def test_to_sparse_tensor():
    pytest.importorskip("torch_sparse", reason="torch_sparse not installed")
    graph, masks = conversion_graph()
    adj_t = graph.to_sparse_tensor(1)
    assert torch.equal(adj_t.to_dense().bool(), masks[1])
    assert torch.equal(graph.to_sparse_tensor().to_dense().bool(),
                       torch.block_diag(*masks.int()).bool())
    back = SampledGraph.from_edge_index(adj_t, NQ, NK)
    assert torch.equal(back.edge_index, graph.to_edge_index(1).as_tensor())


def test_from_edge_index_merges_and_checks():
    pairs = torch.tensor([[0, 2, 2, 1], [1, 0, 0, 1]])  # (key, query)
    graph = SampledGraph.from_edge_index(pairs, 2, 3)
    assert graph.num_edges == 3 and graph.num_heads == 1
    assert graph.edge_index.tolist() == [[2, 0, 1], [0, 1, 1]]
    assert torch.equal(graph.rowptr, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="edge_index must hold pairs"):
        SampledGraph.from_edge_index(pairs, 2, 2)
    with pytest.raises(ValueError, match="edge_index must hold.*sequence"):
        SampledGraph.from_edge_index(pairs, 2, 3, ptr_q=[0, 1, 2],
                                     ptr_k=[0, 1, 3])
    with pytest.raises(ValueError, match="head must be an int"):
        graph.to_sparse_csr(head=1)
    with pytest.raises(ValueError, match="num_keys"):
        SampledGraph.from_edge_index(pairs, 2, -1)


def test_poisson_mode_caps_an_sbm_transformer_head_at_1_minus_1_over_e(sample):
    # Saturated memberships and a block summing to 1: p_ij = 1, the largest
    # an SBM-Transformer head can reach. Poisson merging samples each pair
    # with 1 - 1/e; exact mode gives full attention.
    n, k = 300, 4
    memb = torch.ones(n, 1, k, dtype=torch.float64)
    block = torch.full((1, k, k), 1.0 / k**2, dtype=torch.float64)
    gen = seeded(0)
    poisson = sample(memb, block, memb, generator=gen).density().item()
    exact = sample(memb, block, memb, mode="exact", generator=gen).density().item()
    cap = 1 - math.exp(-1)
    assert abs(poisson - cap) < 4 * math.sqrt(cap * (1 - cap) / n**2)
    assert exact == 1.0


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_marginals_few_draws_over_many_keys(sample, mode):
    # A handful of draws per query over 8192 keys: the compiled backend then
    # merges duplicates by sorting a short list instead of a bitmap. Keys
    # are grouped into 4 classes (cluster 0 or 1, weight 0.5 or 1) whose
    # pairs share a probability, so the counts of each (query, class) are
    # binomial.
    nq, nk, trials = 4, 8192, 400
    j = torch.arange(nk)
    cluster, weight = j // (nk // 2), 0.5 + 0.5 * (j % 2).double()
    k_memb = torch.zeros(nk, 1, 2, dtype=torch.float64)
    k_memb[j, 0, cluster] = weight
    q_memb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.3, 0.7]],
                          dtype=torch.float64)[:, None]
    block = torch.tensor([[[4e-4, 1e-4], [2e-4, 8e-4]]], dtype=torch.float64)
    gen = seeded(0)
    cls = cluster * 2 + j % 2  # class of each key
    counts = torch.zeros(nq, 4, dtype=torch.float64)
    for _ in range(trials):
        graph = sample(q_memb, block, k_memb, mode=mode, generator=gen)
        key, query = graph.edge_index
        counts.index_put_((query, cls[key]), torch.ones(key.numel(),
                                                        dtype=torch.float64),
                          accumulate=True)
    p = expected_adjacency(q_memb, block, k_memb, mode=mode)[0]  # [nq, nk]
    prob = torch.stack([p[:, cls == c][:, 0] for c in range(4)], dim=1)
    size = trials * nk // 4
    assert 2 < float(p.sum(1).max()) < 8  # a few draws per query
    z = (counts - size * prob) / (size * prob * (1 - prob)).sqrt()
    assert float(z.abs().max()) < z_bound(z.numel())


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


def test_from_keys_builds_the_graph_and_rejects_bad_keys():
    # Keys (h N_q + i) N_k + j with H=2, N_q=2, N_k=3.
    key = torch.tensor([0, 3, 5, 6, 11])
    g = SampledGraph.from_keys(key, 2, 2, 3)
    assert torch.equal(g.edge_index.cpu(), torch.tensor([[0, 0, 2, 0, 2],
                                                         [0, 1, 1, 0, 1]]))
    assert torch.equal(g.head.cpu(), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(g.rowptr.cpu(), torch.tensor([0, 1, 3, 4, 5]))
    assert g.num_edges == g.num_draws == 5
    # The key order: the transposed CSR visits (head, key, query).
    colptr, row_t = g.csr_t()
    assert torch.equal(colptr.cpu(), torch.tensor([0, 2, 2, 3, 4, 4, 5]))
    assert torch.equal(row_t.cpu(), torch.tensor([0, 1, 1, 2, 3]))
    for bad, match in [(torch.tensor([3, 0]), "strictly increasing"),
                       (torch.tensor([0, 0]), "strictly increasing"),
                       (torch.tensor([12]), r"\[0, H \* N_q \* N_k"),
                       (torch.tensor([-1]), r"\[0, H \* N_q \* N_k"),
                       (torch.tensor([0.0]), "key")]:
        with pytest.raises((ValueError, TypeError), match=match):
            SampledGraph.from_keys(bad, 2, 2, 3)
    # An edge across two sequences of one query and one key each.
    with pytest.raises(ValueError, match="within one sequence"):
        SampledGraph.from_keys(torch.tensor([1]), 1, 2, 2, ptr_q=[0, 1, 2],
                               ptr_k=[0, 1, 2])
    with pytest.raises(ValueError, match="num_heads"):
        SampledGraph.from_keys(key, 0, 2, 3)


def test_sequence_is_the_batch_restricted_to_one_input():
    g = seeded(0)
    ptr_q, ptr_k = [0, 4, 4, 11], [0, 3, 5, 12]
    q_memb = torch.rand(11, 2, 3, generator=g)
    k_memb = torch.rand(12, 2, 3, generator=g)
    block = torch.full((2, 3, 3), 0.3)
    graph = sampling.fastrg(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k,
                            generator=g)
    dense = torch.zeros(2, 11, 12, dtype=torch.bool)
    dense[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    for s in range(3):
        part = graph.sequence(s)
        nq, nk = ptr_q[s + 1] - ptr_q[s], ptr_k[s + 1] - ptr_k[s]
        assert (part.num_queries, part.num_keys, part.num_heads) == (nq, nk, 2)
        local = torch.zeros(2, nq, nk, dtype=torch.bool)
        local[part.head, part.edge_index[1], part.edge_index[0]] = True
        assert torch.equal(local, dense[:, ptr_q[s]:ptr_q[s + 1],
                                        ptr_k[s]:ptr_k[s + 1]])
        assert torch.allclose(part.density()[0], graph.density()[s])
    with pytest.raises(ValueError, match="index must be an int in"):
        graph.sequence(3)
