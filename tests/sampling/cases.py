"""The small SBMs, repeated batches and counting helpers the sampling
tests share, and which backends they run on."""
import math

import pytest
import torch

from sbm_pyg.sampling import (
    SampledGraph,
    bernoulli,
    expected_adjacency,
)
from tests.helpers import TEST_DEVICE, max_binomial_z, seeded, z_bound
from tests.markers import needs_cpp, needs_triton

# Triton's interpreter runs each row's program in Python, about 0.1 s per
# repeated sequence here: tests marked `many_draws` skip the Triton sampler
# under it (on a GPU they run); its graphs are compared with the C++
# kernel's edge by edge in test_backends.
INTERPRETED = TEST_DEVICE.type == "cpu"
# A test that takes `sample` runs on each backend of fastrg: the
# pure-PyTorch reference, the C++ one as configured, and the C++ one with
# all rows sampled densely (one Bernoulli per key) or all by drawing, and
# the Triton one.
BACKENDS = [
    ("torch", None),
    pytest.param(("cpp", None), marks=needs_cpp),
    pytest.param(("cpp", 0.0), marks=needs_cpp, id="cpp-dense"),
    pytest.param(("cpp", math.inf), marks=needs_cpp, id="cpp-drawn"),
    pytest.param(("triton", None), marks=needs_triton),
]

NQ, NK, H, K = 6, 5, 2, 3
TRIALS = 3000


def small_sbm(dtype=torch.float64, scale=1.0, device=None):
    """A fixed SBM: the same table whatever the seed offset and the device
    (drawn once on the CPU), so that the tests' preconditions on its rates
    (all in (0.05, 0.95) at scale 1, no dense row in exact mode at scale
    0.5) hold for every draw of the sampler, which does vary."""
    g = torch.Generator("cpu").manual_seed(0)
    q = torch.rand(NQ, H, K, generator=g, dtype=dtype, device="cpu")
    k = torch.rand(NK, H, K, generator=g, dtype=dtype, device="cpu")
    b = torch.rand(H, K, K, generator=g, dtype=dtype, device="cpu") * 0.28 * scale
    device = torch.get_default_device() if device is None else device
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
