"""fastrg on every backend: its distribution, its arguments, its errors
and the backends against each other."""
import math

import pytest
import torch

from sbm_pyg.sampling import (
    SampledGraph,
    expected_adjacency,
    fastrg_op,
)
from tests.helpers import max_binomial_z, seeded, z_bound
from tests.sampling.cases import (
    NK,
    NQ,
    TRIALS,
    H,
    check_marginals,
    repeated,
    sample_counts,
    small_sbm,
)


@pytest.mark.many_draws
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_marginals(sample, mode):
    check_marginals(sample, mode)


@pytest.mark.many_draws
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


@pytest.mark.many_draws
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


@pytest.mark.slow
@pytest.mark.many_draws
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_edge_count_matches_poisson_mean(mode, sample):
    # With every row dense (one Bernoulli per key) nothing is drawn from a
    # Poisson law: num_draws counts the tested pairs, and only the distinct
    # edge count is checked.
    dense_rows = sample.keywords["backend"] == "cpp" and (
        fastrg_op.DENSE_ROW_THRESHOLD == 0.0)
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


@pytest.mark.many_draws
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


@pytest.mark.many_draws
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


@pytest.mark.many_draws
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
    colptr, row_t = graph.colptr, graph.csr.row_t()
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


@pytest.mark.many_draws
def test_dense_head_at_64k_raises_instead_of_allocating(sample):
    n = 65536
    ones = torch.ones(n, 1, 1)
    block = torch.ones(1, 1, 1)  # p = 1 everywhere: 4.3e9 expected edges
    with pytest.raises(ValueError, match="max_edges=10000000"):
        sample(ones, block, ones, max_edges=10_000_000)
    # Without max_edges, a guard refuses the allocation: the memory's (on a
    # device with less memory than the graph needs) or the int32 CSR's.
    with pytest.raises(ValueError, match="GiB|int32 CSR"):
        sample(ones, block, ones)


def test_to_device_roundtrip(sample, device):
    q, b, k = small_sbm(device=device)
    graph = sample(q, b, k, generator=torch.Generator(device).manual_seed(0))
    assert graph.device.type == device.type
    moved = graph.to("cpu")
    assert torch.equal(moved.edge_index, graph.edge_index.cpu())
    assert moved.num_draws == graph.num_draws


@pytest.mark.many_draws
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


@pytest.mark.slow
@pytest.mark.many_draws
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


@pytest.fixture
def fast_matmul():
    """Float32 matmuls allowed below IEEE precision (TF32 on a GPU, bfloat16
    passes on a CPU), as a user's training script may set them."""
    torch.set_float32_matmul_precision("medium")
    yield
    torch.set_float32_matmul_precision("highest")


def test_the_sampler_multiplies_in_ieee_float32(sample, fast_matmul,
                                                monkeypatch):
    # Every product that feeds the draws runs with TF32 and bfloat16 passes
    # off, and the setting is the user's again afterwards.
    seen = []
    bmm, einsum = torch.bmm, torch.einsum

    def spy(fn):
        def call(*args, **kwargs):
            seen.append((torch.backends.cuda.matmul.fp32_precision,
                         torch.backends.mkldnn.matmul.fp32_precision))
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(torch, "bmm", spy(bmm))
    monkeypatch.setattr(torch, "einsum", spy(einsum))
    q, b, k = small_sbm(torch.float32)
    sample(q, b, k, mode="exact", generator=seeded(1))
    assert seen and set(seen) == {("ieee", "ieee")}
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


def test_the_graph_does_not_depend_on_the_matmul_precision(sample):
    q, b, k = small_sbm(torch.float32)
    before = sample(q, b, k, generator=seeded(2))
    torch.set_float32_matmul_precision("medium")
    try:
        after = sample(q, b, k, generator=seeded(2))
    finally:
        torch.set_float32_matmul_precision("highest")
    assert torch.equal(before.edge_index, after.edge_index)
