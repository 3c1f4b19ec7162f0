r"""The row sampler of :mod:`~sbm_pyg.sampling.fastrg_op` (the C++
kernels) into buffers of a size fixed before the call: the operator
``sbm_pyg::fastrg_capped``, the :obj:`"cpp"` backend of
:func:`~sbm_pyg.sampling.fastrg_static`.

One opaque operator runs the plan and the sample of the default route, the
sample writing its CSR straight into buffers of the static length, so that
a compiled graph sees static shapes (its fake kernel's) while the kernel
inside reads what it needs from host memory. The law, the row streams and
the graph for a seed are the default route's
(:func:`~sbm_pyg.sampling.fastrg`'s with the same stream seed) whenever
the draws fit. Each row costs its draws, or its sequence's
keys where it is sampled densely; the rows are taken in order (heads, then
queries) while their costs' running sum fits the :obj:`capacity`, and the
rows past it draw nothing: the overflow flag then says so, as
:func:`~sbm_pyg.sampling.fastrg_static`'s does.

``fastrg_capped(Y, W, Z, ptr_q, ptr_k, delta, exact, seed, self_loops,
inc_i, inc_j, capacity)`` :math:`\to` :obj:`(rowptr, col, perm, colptr,
row_t, row, stats)`: the int32 CSR padded to :obj:`capacity` plus the
forced edges (:obj:`H` per included pair :obj:`(inc_i, inc_j)`, :obj:`H
N_q` self-loops), the padding after :obj:`rowptr[-1]` (column and row 0,
:obj:`perm` the identity there, as
:func:`~sbm_pyg.sampling.fastrg_static` pads), and :obj:`stats` float64
:obj:`[6]`: the expected draws (dense rows at their keys, the capacity's
measure), the overflow, a drawn pair with :math:`p_{ij} > 1` in exact
mode, rows with a bad rate, bad entries of :obj:`Y` and of :obj:`Z`.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sbm_pyg.ops.csr import full_precision
from sbm_pyg.ops.graph import INDEX_DTYPE, CSRGraph
from sbm_pyg.ops.library import LIBRARY
from sbm_pyg.sampling.fastrg_op import (
    BYTES_PER_TABLE_ENTRY,
    DENSE_ROW_THRESHOLD,
    included_csr,
    plan_operands,
)
from sbm_pyg.validation import Check, invalid_values

__all__ = ["capped_rows", "capped_expected_draws", "table_bytes", "BYTES_PER_SLOT"]

#: Peak bytes a slot of the buffers takes, the graph included, the key
#: tables apart (table_bytes): measured (ru_maxrss, 4 M slots 90% drawn,
#: n = 16384, k = 16; docs/runs/cpu/static-bytes/) 28.1 in poisson mode
#: and 24.8 in exact mode: col, perm, row_t and row written into the
#: padded buffers (16 B) and the sampler's per-chunk keys and radix
#: buffers. The guard keeps the 40 it took when the CSR was copied into
#: padded buffers (34.8 and 35.8 then).
BYTES_PER_SLOT = 40
# The C++ plan's inflation where a row's bound reaches 1 (kMaxInflation in
# csrc/sampler/fastrg.cpp): only such rows can hold a pair with p_ij > 1.
_MAX_INFLATION = 40.0
# Edges whose p_ij the check above one computes at once: [chunk, k] floats.
_CHUNK = 1 << 16
_RATES = "the SBM's edge rates overflow (q_memb, block or k_memb too large)"

LIBRARY.define("fastrg_capped(Tensor Y, Tensor W, Tensor Z, Tensor ptr_q, "
               "Tensor ptr_k, float delta, bool exact, Tensor seed, "
               "bool self_loops, Tensor inc_i, Tensor inc_j, int capacity) -> "
               "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


def _slots(capacity: int, H: int, Nq: int, num_included: int,
           self_loops: bool) -> int:
    return capacity + H * num_included + (H * Nq if self_loops else 0)


@torch.library.register_fake("sbm_pyg::fastrg_capped", lib=LIBRARY)
def _fake(Y, W, Z, ptr_q, ptr_k, delta, exact, seed, self_loops, inc_i, inc_j,
          capacity):
    H, Nq, _ = W.shape
    S = _slots(capacity, H, Nq, inc_i.numel(), self_loops)
    index = dict(dtype=INDEX_DTYPE)
    return (W.new_empty(H * Nq + 1, **index), W.new_empty(S, **index),
            W.new_empty(S, **index), W.new_empty(H * Z.size(0) + 1, **index),
            W.new_empty(S, **index), W.new_empty(S, **index),
            W.new_empty(6, dtype=torch.float64))


def _capped(Y: Tensor, W: Tensor, Z: Tensor, ptr_q: Tensor, ptr_k: Tensor,
            delta: float, exact: bool, seed: Tensor, self_loops: bool,
            inc_i: Tensor, inc_j: Tensor, capacity: int):
    # The CPU kernel: the default route's two operators, the rows past the
    # capacity emptied between them, the result padded. Reads host memory
    # only (seed, draws, edges).
    ops = torch.ops.sbm_pyg
    H, Nq, k = W.shape
    Nk = Z.size(0)
    stream = int(seed)
    degree, inflation, mass, stats = ops.fastrg_plan(
        Y, W, Z, ptr_q, ptr_k, delta, exact, stream, DENSE_ROW_THRESHOLD)
    # Each row's cost in draws: its degree, or its sequence's keys (dense).
    seq = torch.searchsorted(ptr_q, torch.arange(Nq), right=True) - 1
    keys = (ptr_k[1:] - ptr_k[:-1])[seq.clamp(0, ptr_k.numel() - 2)].repeat(H)
    cost = torch.where(degree < 0, keys, degree)
    fits = cost.cumsum(0) <= capacity
    overflow = not bool(fits.all())
    if overflow:
        degree = torch.where(fits, degree, 0)
    inc_ptr = inc_col = ptr_q.new_empty(0)
    if inc_i.numel():
        inc_ptr, inc_col = included_csr(inc_i, inc_j, Nq, Nk)
    # The kernel writes straight into the padded buffers (copying them
    # there cost 4.7 ms at n = 4096, 5%).
    S = _slots(capacity, H, Nq, inc_i.numel(), self_loops)
    rowptr, col, perm, colptr, row_t, row = ops.fastrg_sample(
        W, Z, mass, ptr_q, ptr_k, delta, exact, stream, degree, inflation,
        self_loops, inc_ptr, inc_col, capacity, S)
    above_one = False
    if exact:
        E = int(rowptr[-1])
        above_one = _above_one(W, Z, row[:E], col[:E], inflation)
    out_stats = torch.stack([stats[1], stats.new_tensor(float(overflow)),
                             stats.new_tensor(float(above_one)), stats[3],
                             stats[4], stats[5]])
    return rowptr, col, perm, colptr, row_t, row, out_stats


def _above_one(W: Tensor, Z: Tensor, row: Tensor, col: Tensor,
               inflation: Tensor) -> bool:
    # A drawn pair with p_ij = W_i . Z_j > 1: only rows whose bound reached
    # 1 (inflation at its cap) can hold one, so only their edges are
    # computed (none at all in the usual case).
    H, Nq, k = W.shape
    capped = inflation >= _MAX_INFLATION
    if not bool(capped.any()):  # per row first: an [E] gather cost 23 ms at 5%
        return False
    at = capped[row.long()].nonzero().view(-1)
    W, Z = W.reshape(H * Nq, k), Z.transpose(0, 1).reshape(-1, k)
    # In chunks of a fixed size: no [E, k] buffer (the PyTorch backend's
    # thinning does the same).
    return any(bool((W.index_select(0, row[c].long()).mul_(Z.index_select(0, col[c].long()))
                     .sum(-1) > 1 + 1e-6).any())
               for c in at.split(_CHUNK))


LIBRARY.impl("fastrg_capped", _capped, "CPU")


def capped_rows(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
                ptr_k: Tensor, capacity: int, seed: Tensor, mode: str,
                exploration: float, self_loops: bool,
                included: Optional[Sequence[Tensor]]
                ) -> Tuple[CSRGraph, Tensor, Tensor, Tensor, List[Check]]:
    r"""Runs ``fastrg_capped`` (arguments checked by
    :func:`~sbm_pyg.sampling.fastrg_static`): the padded CSR, the expected
    draws, the overflow and above-one flags (0-dim, on the device) and the
    deferred checks of the inputs."""
    with full_precision(q_memb.device):
        Y, Z, W = plan_operands(q_memb, block, k_memb)
        inc_i, inc_j = included if included is not None else (
            ptr_q.new_empty(0), ptr_q.new_empty(0))
        rowptr, col, perm, colptr, row_t, row, stats = \
            torch.ops.sbm_pyg.fastrg_capped(
                Y, W, Z, ptr_q, ptr_k, float(exploration), mode == "exact",
                seed, self_loops, inc_i, inc_j, capacity)
    csr = CSRGraph(rowptr, col, colptr, perm)
    csr.set_row_t(row_t)
    csr.set_row(row)
    expected, overflow, above_one, bad_rate, bad_q, bad_k = stats.unbind()
    checks = [(bad_q > 0, invalid_values("q_memb")),
              (bad_k > 0, invalid_values("k_memb")), (bad_rate > 0, _RATES)]
    return csr, expected, overflow > 0, above_one > 0, checks


def capped_expected_draws(q_memb: Tensor, block: Tensor, k_memb: Tensor,
                          ptr_q: Tensor, ptr_k: Tensor, mode: str,
                          exploration: float) -> Tensor:
    r"""The expected draws of :func:`capped_rows` for these arguments (the
    C++ plan's: dense rows at their keys), 0-dim float64."""
    with full_precision(q_memb.device):
        Y, Z, W = plan_operands(q_memb, block, k_memb)
        stats = torch.ops.sbm_pyg.fastrg_plan(
            Y, W, Z, ptr_q, ptr_k, float(exploration), mode == "exact", 0,
            DENSE_ROW_THRESHOLD)[3]
    return stats[1]


def table_bytes(num_heads: int, num_clusters: int, num_keys: int) -> int:
    r"""The C++ sampler's key tables' bytes."""
    return num_heads * num_clusters * num_keys * BYTES_PER_TABLE_ENTRY
