"""Property-based fuzzing of the sampler and the attention with hypothesis.

Random ragged batches (empty sequences, N_q != N_k, 1-4 heads, 1-16
clusters, both modes, exploration, self-loops, included edges, float32 and
float64, every sampler backend) must give a SampledGraph that keeps all its
invariants, and sparse_attention must match dense masked attention forward
and backward on it. Random bad inputs must raise a ValueError or TypeError
naming the argument.

The "ci" profile (default) is derandomized, so every run draws the same
examples; HYPOTHESIS_PROFILE=long runs many more with fresh randomness.
"""
import math
import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sbm_pyg.nn.functional import sparse_attention  # noqa: E402
from sbm_pyg.ops import WITH_EXTENSION  # noqa: E402
from sbm_pyg.sampling import SampledGraph, fastrg  # noqa: E402

settings.register_profile(
    "ci", max_examples=340, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BACKENDS = ["torch"] + (["cpp"] if WITH_EXTENSION
                        and torch.get_default_device().type == "cpu" else [])


@st.composite
def sbm_batches(draw):
    """Arguments of fastrg for a random ragged batch."""
    self_loops = draw(st.booleans())
    G = draw(st.integers(1, 4))
    nq = draw(st.lists(st.integers(0, 6), min_size=G, max_size=G))
    nk = nq if self_loops else draw(st.lists(st.integers(0, 6), min_size=G,
                                             max_size=G))
    H, k = draw(st.integers(1, 4)), draw(st.integers(1, 16))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    Nq, Nk = sum(nq), sum(nk)
    # Block scales from "almost no edge" to "every pair".
    scale = draw(st.sampled_from([0.0, 0.01, 0.3, 3.0, 100.0]))
    q = torch.rand(Nq, H, k, generator=g, dtype=dtype)
    kk = torch.rand(Nk, H, k, generator=g, dtype=dtype)
    b = torch.rand(H, k, k, generator=g, dtype=dtype) * scale
    ptr_q = [0] + list(torch.tensor(nq).cumsum(0).tolist())
    ptr_k = [0] + list(torch.tensor(nk).cumsum(0).tolist())
    include = None
    pairs = [(j, i) for s in range(G) for i in range(ptr_q[s], ptr_q[s + 1])
             for j in range(ptr_k[s], ptr_k[s + 1])]
    if pairs and draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(pairs), max_size=8))
        include = torch.tensor(chosen, dtype=torch.long).reshape(-1, 2).t()
    kwargs = dict(ptr_q=ptr_q, ptr_k=ptr_k,
                  mode=draw(st.sampled_from(["poisson", "exact"])),
                  exploration=draw(st.sampled_from([0.0, 0.05, 0.5])),
                  self_loops=self_loops, include_edges=include,
                  backend=draw(st.sampled_from(BACKENDS)),
                  generator=torch.Generator(torch.get_default_device())
                  .manual_seed(seed + 1))
    return q, b, kk, kwargs


def check_invariants(graph: SampledGraph, kwargs) -> None:
    H, Nq, Nk = graph.num_heads, graph.num_queries, graph.num_keys
    E = graph.num_edges
    j, i = graph.edge_index
    h = graph.head
    assert graph.edge_index.dtype == torch.long and graph.edge_index.shape == (2, E)
    assert ((0 <= j) & (j < Nk) & (0 <= i) & (i < Nq) & (0 <= h) & (h < H)).all()
    key = (h * Nq + i) * Nk + j
    assert (key.diff() > 0).all()  # sorted by (head, query, key), no duplicate
    ptr_q, ptr_k = graph.ptr_q, graph.ptr_k
    assert torch.equal(torch.searchsorted(ptr_q, i, right=True),
                       torch.searchsorted(ptr_k, j, right=True))  # in-sequence
    rows = h * Nq + i
    counts = torch.bincount(rows, minlength=H * Nq)
    assert graph.rowptr[0] == 0 and graph.rowptr[-1] == E
    assert torch.equal(graph.rowptr.diff(), counts)
    assert torch.equal(torch.sort(graph.perm).values, torch.arange(E))
    col = h * Nk + j
    t_key = col[graph.perm] * max(Nq, 1) + rows[graph.perm] % max(Nq, 1)
    assert (t_key.diff() > 0).all()  # perm gives (head, key, query) order
    assert torch.equal(graph.colptr.diff(),
                       torch.bincount(col, minlength=H * Nk))
    colptr, row_t = graph.colptr, graph.csr.row_t()
    assert torch.equal(row_t, rows[graph.perm]) and colptr is graph.colptr
    edges = set(zip(h.tolist(), i.tolist(), j.tolist()))
    if kwargs["self_loops"]:
        assert {(hh, n, n) for hh in range(H) for n in range(Nq)} <= edges
    if kwargs["include_edges"] is not None:
        jj, ii = kwargs["include_edges"].tolist()
        assert {(hh, a, b) for hh in range(H) for b, a in zip(jj, ii)} <= edges


@pytest.mark.slow
@given(sbm_batches())
def test_sampled_graph_invariants(batch):
    q, b, k, kwargs = batch
    check_invariants(fastrg(q, b, k, **kwargs), kwargs)


@pytest.mark.slow
@given(sbm_batches(), st.integers(1, 5), st.integers(0, 2**31 - 1),
       st.sampled_from(["paper", "published"]))
def test_attention_matches_dense_reference(batch, D, seed, ste):
    q_memb, b, k_memb, kwargs = batch
    graph = fastrg(q_memb, b, k_memb, **kwargs)
    H, Nq, Nk = graph.num_heads, graph.num_queries, graph.num_keys
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    q, k, v = (torch.randn(n, H, D, generator=g, dtype=torch.float64,
                           requires_grad=True) for n in (Nq, Nk, Nk))
    out = sparse_attention(q, k, v, graph, ste=ste)
    mask = torch.zeros(H, Nq, Nk, dtype=torch.bool)
    mask[graph.head, graph.edge_index[1], graph.edge_index[0]] = True
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    alpha = torch.softmax(scores.masked_fill(~mask, -math.inf), -1)
    ref = torch.einsum("hij,jhd->ihd", alpha.nan_to_num(0.0), v)
    assert torch.allclose(out, ref, atol=1e-10)
    if Nq and Nk:
        weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v),
                                    allow_unused=True)
        refs = torch.autograd.grad((ref * weight).sum(), (q, k, v),
                                   allow_unused=True)
        for a, r in zip(grads, refs):
            a = torch.zeros_like(r) if a is None else a
            assert torch.allclose(a, torch.zeros_like(a) if r is None else r,
                                  atol=1e-10)


def _mutate(kind: str, q, b, k, kwargs):
    """One bad argument of fastrg, and the name its error must give."""
    nan = torch.tensor(float("nan"), dtype=q.dtype)
    if kind == "nan_q" and q.numel():
        return (q.flatten().index_fill(0, torch.tensor([0]), nan).view_as(q),
                b, k, kwargs), "q_memb"
    if kind == "inf_block":
        return (q, b.flatten().index_fill(0, torch.tensor([0]), math.inf)
                .view_as(b), k, kwargs), "block"
    if kind == "negative_k" and k.numel():
        return (q, b, -k - 1, kwargs), "k_memb"
    if kind == "int_q":
        return (q.long(), b, k, kwargs), "q_memb"
    if kind == "bad_block_shape":
        return (q, b[..., :-1] if b.size(-1) > 1 else b[:, :, :0], k,
                kwargs), "block"
    if kind == "two_dim_k":
        return (q, b, k[:, 0], kwargs), "k_memb"
    if kind == "ptr_end":
        bad = dict(kwargs, ptr_q=kwargs["ptr_q"][:-1] + [kwargs["ptr_q"][-1] + 1],
                   self_loops=False)
        return (q, b, k, bad), "ptr_q"
    if kind == "ptr_order" and len(kwargs["ptr_k"]) > 2 and kwargs["ptr_k"][-1] > 0:
        p = list(kwargs["ptr_k"])
        p[1] = p[-1] + 1
        return (q, b, k, dict(kwargs, ptr_k=p, self_loops=False)), "ptr_k"
    if kind == "float_include":
        return (q, b, k, dict(kwargs, include_edges=torch.zeros(2, 1))), \
            "include_edges"
    if kind == "mode":
        return (q, b, k, dict(kwargs, mode="dense")), "mode"
    if kind == "exploration":
        return (q, b, k, dict(kwargs, exploration=-0.5)), "exploration"
    if kind == "max_edges":
        return (q, b, k, dict(kwargs, max_edges=-1)), "max_edges"
    if kind == "generator":
        return (q, b, k, dict(kwargs, generator=3)), "generator"
    return None, None


BAD = ["nan_q", "inf_block", "negative_k", "int_q", "bad_block_shape",
       "two_dim_k", "ptr_end", "ptr_order", "float_include", "mode",
       "exploration", "max_edges", "generator"]


@given(sbm_batches(), st.sampled_from(BAD))
def test_bad_input_raises_naming_the_argument(batch, kind):
    mutated, name = _mutate(kind, *batch)
    hypothesis.assume(mutated is not None)
    q, b, k, kwargs = mutated
    with pytest.raises((ValueError, TypeError), match=name):
        fastrg(q, b, k, **kwargs)
