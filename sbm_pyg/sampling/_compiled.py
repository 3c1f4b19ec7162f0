r"""The Python side of the compiled fastRG backend (``sbm_pyg._C``, CPU).

The kernel samples query-major: each (head, query) row draws its Poisson
degree, picks key clusters from the row :math:`\mathbf{Y}_i \mathbf{B}
\operatorname{diag}(\mathbf{s}^Z)` through a guide table and keys from
per-(sequence, head, cluster) alias tables, and merges duplicates within the
row; rows whose drawing would cost more than testing every key
(:data:`DENSE_ROW_THRESHOLD`) take one Bernoulli per key instead. See
``csrc/sampler/fastrg.cpp``.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from sbm_pyg._validation import Check, check_draws, invalid_values, sync
from sbm_pyg.ops.backend_info import _C

# A row is sampled densely (one Bernoulli per key) when its expected number
# of draws, inflation included, is at least this fraction of its keys.
DENSE_ROW_THRESHOLD = 0.5
# Peak bytes per distinct edge, output included: edge_index, head and perm
# (int64, 32 B), the per-chunk int32 keys while they are copied (4 B) and
# their growth slack.
BYTES_PER_EDGE = 40
# Alias table entry: a float32 probability and an int32 alias.
BYTES_PER_ALIAS_ENTRY = 8


def available() -> bool:
    """Whether the compiled kernels were built and import."""
    return _C is not None


def _included_csr(i: Tensor, j: Tensor, Nq: int, Nk: int):
    # Sorted distinct included keys of each query: CSR over queries.
    key = torch.unique(i * max(Nk, 1) + j)
    count = torch.bincount(key // max(Nk, 1), minlength=Nq)
    ptr = torch.cat([count.new_zeros(1), count.cumsum(0)])
    return ptr, key % max(Nk, 1)


def sample(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
           ptr_k: Tensor, checks: List[Check], mode: str, exploration: float,
           self_loops: bool,
           included: Optional[Sequence[Tensor]], max_edges: Optional[int],
           generator: Optional[torch.Generator]):
    """Returns the fields of a :class:`~sbm_pyg.sampling.SampledGraph`
    (arguments already validated by :func:`~sbm_pyg.sampling.fastrg`;
    ``included`` is ``None`` or the clamped ``(i, j)`` pairs)."""
    Nq, H, k = q_memb.shape
    Nk = k_memb.size(0)
    exact = mode == "exact"
    dtype = torch.float64 if q_memb.dtype == torch.float64 else torch.float32
    Y = q_memb.detach().to(dtype).contiguous()
    Z = k_memb.detach().to(dtype).contiguous()
    W = torch.bmm(Y.transpose(0, 1), block.detach().to(dtype)).contiguous()
    seed = int(torch.randint(2**62, (), generator=generator,
                             device=q_memb.device))
    degree, inflation, mass, stats = _C.fastrg_plan(
        Y, W, Z, ptr_q, ptr_k, float(exploration), exact, seed,
        DENSE_ROW_THRESHOLD)
    del Y
    checks = checks + [
        (stats[4] > 0, invalid_values("q_memb")),
        (stats[5] > 0, invalid_values("k_memb")),
        ((stats[3] > 0) | ~torch.isfinite(stats[1]),
         "the SBM's edge rates overflow (q_memb, block or k_memb too large)")]
    # Invalid input raises here, before anything of the graph's size exists.
    num_draws, expected, edges = sync(checks, stats[0], stats[1], stats[2])
    check_draws(num_draws, expected,
                edges * BYTES_PER_EDGE + H * k * Nk * BYTES_PER_ALIAS_ENTRY,
                max_edges, q_memb.device, ptr_q.numel() - 1, H, Nq, Nk)
    inc_ptr = inc_col = ptr_q.new_empty(0)
    if included is not None:
        i, j = included
        inc_ptr, inc_col = _included_csr(i, j, Nq, Nk)
    rowptr, edge_index, head, perm, colptr = _C.fastrg_sample(
        W, Z, mass, ptr_q, ptr_k, float(exploration), exact, seed, degree,
        inflation, self_loops, inc_ptr, inc_col)
    return dict(edge_index=edge_index, head=head, rowptr=rowptr, perm=perm,
                colptr=colptr, num_draws=int(num_draws),
                expected_draws=expected)
