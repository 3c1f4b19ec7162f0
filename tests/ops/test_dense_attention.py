"""The dense-regime attention operator: the same output and gradients as
the sparse attention on the graph of its mask, the sampler's graph from the
same seed, the SBM's marginals, and its guards."""
import math

import pytest
import torch

from sbm_pyg.ops import dense_attention, fused_attention
from sbm_pyg.ops.csr import heads_first
from sbm_pyg.ops.dense_attention import mask_keys as unpack
from sbm_pyg.sampling import fastrg, fastrg_op
from sbm_pyg.sampling.edges import csr_from_keys
from tests.helpers import max_binomial_z, seeded, z_bound
from tests.markers import needs_extension

pytestmark = [pytest.mark.host, needs_extension]

H, D, DV, K = 2, 8, 6, 4


def mask_keys(mask, ptr_q, ptr_k, heads):
    """The edge keys (h N_q + i) N_k + j of a mask, sorted: the reference
    unpacking of its bits (a Python loop over sequences)."""
    Nq, Nk = int(ptr_q[-1]), int(ptr_k[-1])
    bits = ((mask[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()
    keys, at = [], 0
    for g in range(ptr_q.numel() - 1):
        qs, nq = int(ptr_q[g]), int(ptr_q[g + 1] - ptr_q[g])
        ks, nk = int(ptr_k[g]), int(ptr_k[g + 1] - ptr_k[g])
        rb = (nk + 7) // 8
        block = bits[at * 8:(at + heads * nq * rb) * 8].view(heads, nq, rb * 8)
        h, i, j = block[..., :nk].nonzero(as_tuple=True)
        keys.append((h * Nq + qs + i) * Nk + ks + j)
        at += heads * nq * rb
    assert at == mask.numel()
    return torch.sort(torch.cat(keys)).values


def inputs(sizes=(5, 0, 37, 140), dtype=torch.float64, scale=0.25):
    g = seeded(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    N = int(ptr[-1])
    q_memb = torch.rand(N, H, K, generator=g, dtype=dtype)
    k_memb = torch.rand(N, H, K, generator=g, dtype=dtype)
    block = torch.rand(H, K, K, generator=g, dtype=dtype) * scale
    x = [torch.randn(H * N, d, generator=g, dtype=dtype) for d in (D, D, DV)]
    return ptr, q_memb, block, k_memb, x


def run_dense(ptr, q_memb, block, k_memb, x, seed=12345, **kwargs):
    q_block = heads_first(torch.einsum("nhu,huv->nhv", q_memb, block))
    return dense_attention(*x, q_block, heads_first(k_memb), ptr, ptr,
                           heads=H, scale=0.3, seed=seed, **kwargs), q_block


@pytest.mark.parametrize("ste", ["paper", "published"])
@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_matches_the_sparse_attention_on_its_mask(ste, mode):
    # Forward and every gradient against the fused sparse kernel given the
    # graph of the dense path's own mask (float64, 1e-10): over a ragged
    # batch with an empty sequence and one longer than a row block (128).
    ptr, q_memb, block, k_memb, x = inputs()
    x = [t.requires_grad_() for t in x]
    memb = [t.requires_grad_() for t in (q_memb, block, k_memb)]
    res, _ = run_dense(ptr, *memb, x, mode=mode, ste=ste, self_loops=True,
                       exploration=0.01)
    N = int(ptr[-1])
    keys = mask_keys(res.mask, ptr, ptr, H)
    assert torch.equal(unpack(res.mask, ptr, ptr, H), keys)
    graph = csr_from_keys(keys, H, N, N)
    counts = torch.zeros(ptr.numel() - 1, H, dtype=torch.long)
    per_row = graph.rowptr.diff().view(H, N)
    for g in range(ptr.numel() - 1):
        counts[g] = per_row[:, ptr[g]:ptr[g + 1]].sum(1)
    assert torch.equal(res.edges, counts)
    assert 0.2 < graph.num_edges / float((ptr.diff() ** 2).sum() * H) < 0.9
    # Self-loops are in the mask.
    i = torch.arange(N)
    assert torch.isin((i * N + i), keys % (N * N)).all()
    w = torch.randn(res.out.shape, generator=seeded(3), dtype=torch.float64)
    params = x + memb
    grads = torch.autograd.grad((res.out * w).sum(), params)
    q_block = heads_first(torch.einsum("nhu,huv->nhv", memb[0], memb[1]))
    ref, _, _ = fused_attention(graph, *x, None, q_block, heads_first(memb[2]),
                             scale=0.3, ste=ste)
    ref_grads = torch.autograd.grad((ref * w).sum(), params)
    torch.testing.assert_close(res.out, ref, rtol=0, atol=1e-10)
    for name, a, b in zip(["q", "k", "v", "q_memb", "block", "k_memb"], grads,
                          ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=name)
        assert b.abs().max() > 0, name


@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_same_graph_as_the_sampler_for_the_same_seed(mode, monkeypatch):
    # Every row of the sampler tested densely (threshold 0): the sampler and
    # the dense path read the same stream at the same counters.
    monkeypatch.setattr(fastrg_op, "DENSE_ROW_THRESHOLD", 0.0)
    ptr, q_memb, block, k_memb, x = inputs()
    N = int(ptr[-1])
    seed = fastrg_op.stream_seed(seeded(5), torch.device("cpu"))
    res, _ = run_dense(ptr, q_memb, block, k_memb, x, seed=seed, mode=mode)
    graph = fastrg(q_memb, block, k_memb, ptr_q=ptr, ptr_k=ptr, mode=mode,
                   generator=seeded(5), backend="cpp")
    row = graph.csr.row().long()
    sampled = row * N + graph.csr.col.long() % N
    dense = mask_keys(res.mask, ptr, ptr, H)
    overlap = torch.isin(dense, sampled).sum() / max(sampled.numel(), 1)
    assert sampled.numel() > 1000 and dense.numel() == sampled.numel()
    assert overlap >= 0.999


@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_marginals(mode):
    # The same 6 x 5 sequence 3000 times: each pair's frequency against
    # min(p + delta, 1) or 1 - exp(-(p + delta)), max |z| under a
    # Bonferroni bound; scale 3 puts some rates above 1.
    g = seeded(1)
    nq, nk, trials, delta = 6, 5, 3000, 0.05
    q_memb = torch.rand(nq, H, K, generator=g, dtype=torch.float64)
    k_memb = torch.rand(nk, H, K, generator=g, dtype=torch.float64)
    block = torch.rand(H, K, K, generator=g, dtype=torch.float64) * 0.9
    rate = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb) + delta
    ptr_q = torch.arange(trials + 1) * nq
    ptr_k = torch.arange(trials + 1) * nk
    qm, km = q_memb.repeat(trials, 1, 1), k_memb.repeat(trials, 1, 1)
    q_block = heads_first(torch.einsum("nhu,huv->nhv", qm, block))
    x = [torch.zeros(H * trials * n, D, dtype=torch.float64) for n in (nq, nk)]
    res = dense_attention(x[0], x[1], x[1], q_block, heads_first(km), ptr_q,
                          ptr_k, heads=H, scale=1.0, seed=777, mode=mode,
                          exploration=delta)
    keys = mask_keys(res.mask, ptr_q, ptr_k, H)
    Nq, Nk = trials * nq, trials * nk
    h, i, j = keys // (Nq * Nk), keys // Nk % Nq, keys % Nk
    assert torch.equal(i // nq, j // nk)  # no pair crosses sequences
    counts = torch.zeros(H, nq, nk, dtype=torch.long)
    counts.index_put_((h, i % nq, j % nk), torch.ones_like(h), accumulate=True)
    expected = rate.clamp(max=1) if mode == "exact" else -torch.expm1(-rate)
    assert (expected >= 1).any() or mode == "poisson"
    assert max_binomial_z(counts, trials, expected) < z_bound(counts.numel())
    # Power: the poisson mode's probabilities are rejected in exact mode.
    if mode == "exact":
        wrong = -torch.expm1(-rate)
        assert max_binomial_z(counts, trials, wrong) > z_bound(counts.numel())


def test_included_pairs_and_empty_rows():
    # A zero SBM samples nothing: rows without an edge give 0 and no
    # gradient; the included pairs alone form the graph.
    ptr = torch.tensor([0, 4, 10])
    N = 10
    zeros = torch.zeros(H * N, K, dtype=torch.float64)
    x = [torch.randn(H * N, D, dtype=torch.float64, generator=seeded(2),
                     requires_grad=True) for _ in range(3)]
    inc_ptr = torch.tensor([0, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3])
    inc_col = torch.tensor([2, 4, 9])  # query 0 -> key 2, query 6 -> 4 and 9
    res = dense_attention(*x, zeros, zeros, ptr, ptr, heads=H, scale=1.0,
                          seed=1, included=(inc_ptr, inc_col))
    assert res.edges.tolist() == [[1, 1], [2, 2]]
    keys = mask_keys(res.mask, ptr, ptr, H) % (N * N)
    assert keys.tolist() == [2, 64, 69, 2, 64, 69]
    assert torch.equal(res.out.view(H, N, D)[:, 1:6],
                       torch.zeros(H, 5, D, dtype=torch.float64))
    # Query 0's only key is 2: its output is that value row.
    torch.testing.assert_close(res.out[0], x[2][2])
    res.out.sum().backward()
    assert torch.isfinite(x[0].grad).all()


@pytest.mark.parametrize("dropout", [(), (torch.tensor(2**40 + 3), 2**52),
                                     (None, 0, 0, 2 * (3 + 9 * 2))])
def test_opcheck(dropout):
    # With and without dropout (seed, the threshold of p = 1/2), and with
    # the mask's size given (2 heads, 3 queries of one byte and 9 of two:
    # the fake kernel's size is then that, not a dynamic one).
    ptr, q_memb, block, k_memb, x = inputs(sizes=(3, 9))
    q_block = heads_first(torch.einsum("nhu,huv->nhv", q_memb, block))
    args = [ptr, ptr, ptr.new_empty(0), ptr.new_empty(0),
            *[t.requires_grad_() for t in x], q_block.requires_grad_(),
            heads_first(k_memb).requires_grad_(), H, 0.0, True, False, torch.tensor(3),
            0.5, 1, *dropout]
    torch.library.opcheck(torch.ops.sbm_pyg.dense_attention.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))


def test_float32_matches_float64():
    ptr, q_memb, block, k_memb, x = inputs()
    ref, _ = run_dense(ptr, q_memb, block, k_memb, x, mode="exact")
    out, _ = run_dense(ptr, q_memb.float(), block.float(), k_memb.float(),
                       [t.float() for t in x], mode="exact")
    # The same mask up to rounding in p near a uniform: nearly every row.
    same = (out.mask == ref.mask).double().mean()
    assert same > 0.99
    assert math.isclose(float(out.edges.sum()), float(ref.edges.sum()),
                        rel_tol=1e-3)


@pytest.fixture
def restore_matmul_precision():
    saved = (torch.backends.cuda.matmul.fp32_precision,
             torch.backends.fp32_precision)
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision = saved


def test_matmul_precision_follows_pytorch(restore_matmul_precision):
    from sbm_pyg.ops.dense_attention import matmul_precision
    assert matmul_precision(torch.bfloat16) == "bfloat16"
    assert matmul_precision(torch.float16) == "float16"
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert matmul_precision(torch.float32) == "ieee"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert matmul_precision(torch.float32) == "tf32"
    assert matmul_precision(torch.float64) == "ieee"
    # Unset for CUDA's matmuls: the global setting decides.
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"
    assert matmul_precision(torch.float32) == "tf32"
    torch.backends.fp32_precision = "ieee"
    assert matmul_precision(torch.float32) == "ieee"


def test_precision_is_checked_and_ignored_on_the_cpu():
    # The CPU kernel computes in its inputs' dtype whatever the precision:
    # the same output for every code; an unknown code raises.
    g = seeded(5)
    H, N = 2, 9
    q, k, v = (torch.randn(H * N, 4, generator=g) for _ in range(3))
    memb = torch.rand(H * N, 3, generator=g)
    ptr = torch.tensor([0, N])
    outs = [dense_attention(q, k, v, memb, memb, ptr, ptr, heads=H, scale=0.5,
                            seed=3, precision=p).out
            for p in ("ieee", "tf32", "bfloat16", "float16")]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    with pytest.raises(ValueError, match="precision"):
        dense_attention(q, k, v, memb, memb, ptr, ptr, heads=H, scale=0.5,
                        seed=3, precision="int8")
