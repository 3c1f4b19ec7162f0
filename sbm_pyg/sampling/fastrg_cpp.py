r"""The compiled backend of :func:`~sbm_pyg.sampling.fastrg` (CPU,
``csrc/sampler/fastrg.cpp`` in ``sbm_pyg._C``): query-major fastRG.

Each :math:`(h, i)` row draws its Poisson degree :math:`\mathrm{Poisson}(c
\lambda_i)`, :math:`\lambda_i = \mathbf{Y}_i \mathbf{B} \mathbf{s}^Z`, picks
each draw's key cluster from the :math:`k` weights :math:`(\mathbf{Y}_i
\mathbf{B})_v s^Z_v` (a guide table) and its key from an alias table of
:math:`(g, h, v)` (float32 probabilities), and merges duplicates within the
row. Exact mode bounds each row separately, :math:`P_i = \mathbf{Y}_i
\mathbf{B} \max_j \mathbf{Z}_j`, and thins with a squeeze (a uniform below
:math:`1/c` keeps an edge without computing :math:`p_{ij}`). A row whose
drawing would cost more than testing its keys (expected draws
:math:`\geq` :data:`DENSE_ROW_THRESHOLD` of its keys) is sampled with one
Bernoulli per key instead, so a dense head costs :math:`O(n_k)` per query in
either mode; :obj:`num_draws` then counts those tested pairs. Each row has
its own counter-based random stream, seeded from the generator, so the graph
does not depend on the number of threads.

The kernel runs in two calls: ``fastrg_plan`` (degrees, per-row
inflation, statistics and value checks) and, after the one host sync,
``fastrg_sample`` (the edges in CSR form, both orders).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from sbm_pyg.ops.backend_info import extension
from sbm_pyg.ops.graph import CSRGraph, check_index_range
from sbm_pyg.sampling.checks import check_draws
from sbm_pyg.sampling.edges import SampledEdges, keys_to_csr, sorted_unique
from sbm_pyg.validation import Check, invalid_values, sync

__all__ = ["sample", "stream_seed"]

# A row is sampled densely (one Bernoulli per key) when its expected number
# of draws, inflation included, is at least this fraction of its keys.
DENSE_ROW_THRESHOLD = 0.5
# Peak bytes per distinct edge, output included: col and perm (int32, 8 B),
# the per-chunk int32 keys while they are copied (4 B) and their growth
# slack, and the int64 radix buffer of the (sequence, head) blocks being
# sorted.
BYTES_PER_EDGE = 16
# Alias table entry: a float32 probability and an int32 alias.
BYTES_PER_ALIAS_ENTRY = 8


def stream_seed(generator: Optional[torch.Generator],
                device: torch.device) -> int:
    r"""The 62-bit seed of the row streams, drawn from :obj:`generator` (a
    generator of :obj:`device`): the C++ and Triton kernels derive every
    row's stream from it, so the same seed gives the same graph on both."""
    return int(torch.randint(2**62, (), generator=generator, device=device))


def _included_csr(i: Tensor, j: Tensor, Nq: int, Nk: int):
    # Sorted distinct included keys of each query: CSR over queries, i.e.
    # the one-head case of the samplers' own key-to-CSR conversion.
    _, col, _, ptr = keys_to_csr(sorted_unique(i * max(Nk, 1) + j), 1, Nq, Nk)
    return ptr, col


def sample(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
           ptr_k: Tensor, checks: List[Check], mode: str, exploration: float,
           self_loops: bool, included: Optional[Sequence[Tensor]],
           max_edges: Optional[int],
           generator: Optional[torch.Generator]) -> SampledEdges:
    r"""Samples the graph (arguments validated by
    :func:`~sbm_pyg.sampling.fastrg`; :obj:`included` is :obj:`None` or the
    clamped :obj:`(i, j)` pairs); raises :obj:`checks` at its one sync."""
    Nq, H, k = q_memb.shape
    Nk = k_memb.size(0)
    exact = mode == "exact"
    dtype = torch.float64 if q_memb.dtype == torch.float64 else torch.float32
    Y = q_memb.detach().to(dtype).contiguous()
    Z = k_memb.detach().to(dtype).contiguous()
    W = torch.bmm(Y.transpose(0, 1), block.detach().to(dtype)).contiguous()
    seed = stream_seed(generator, q_memb.device)
    degree, inflation, mass, stats = extension.fastrg_plan(
        Y, W, Z, ptr_q, ptr_k, float(exploration), exact, seed,
        DENSE_ROW_THRESHOLD)
    del Y
    draws, expected, edges, overflow, bad_q, bad_k = stats.unbind()
    checks = checks + [
        (bad_q > 0, invalid_values("q_memb")),
        (bad_k > 0, invalid_values("k_memb")),
        ((overflow > 0) | ~torch.isfinite(expected),
         "the SBM's edge rates overflow (q_memb, block or k_memb too large)")]
    # Invalid input raises here, before anything of the graph's size exists.
    num_draws, expected_draws, num_edges = sync(checks, draws, expected, edges)
    check_draws(num_draws, expected_draws,
                num_edges * BYTES_PER_EDGE + H * k * Nk * BYTES_PER_ALIAS_ENTRY,
                max_edges, q_memb.device, ptr_q.numel() - 1, H, Nq, Nk)
    check_index_range(int(num_edges), H * Nq, H * Nk)
    inc_ptr = inc_col = ptr_q.new_empty(0)
    if included is not None:
        i, j = included
        inc_ptr, inc_col = _included_csr(i, j, Nq, Nk)
    rowptr, col, perm, colptr = extension.fastrg_sample(
        W, Z, mass, ptr_q, ptr_k, float(exploration), exact, seed, degree,
        inflation, self_loops, inc_ptr, inc_col)
    return SampledEdges(CSRGraph(rowptr, col, colptr, perm), int(num_draws),
                        expected_draws)
