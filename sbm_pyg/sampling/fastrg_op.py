r"""fastRG as torch operators with a kernel per device:
``sbm_pyg::fastrg_plan`` and ``sbm_pyg::fastrg_sample``, the
:obj:`"cpp"` (CPU) and :obj:`"triton"` (CUDA) backends of
:func:`~sbm_pyg.sampling.fastrg`.

Each :math:`(h, i)` row draws its Poisson degree :math:`\mathrm{Poisson}(c
\lambda_i)`, :math:`\lambda_i = \mathbf{Y}_i \mathbf{B} \mathbf{s}^Z`, picks
each draw's key cluster from the :math:`k` weights :math:`(\mathbf{Y}_i
\mathbf{B})_v s^Z_v` (a guide table) and its key from the cumulative weights
of :math:`(g, h, v)`, quantised to integers so that both kernels build the
same table in any summation order (a guide over equal buckets starts the
search), and merges duplicates within the row. Exact mode bounds each row
separately, :math:`P_i = \mathbf{Y}_i \mathbf{B} \max_j \mathbf{Z}_j`, and
thins with a squeeze (a uniform below :math:`1/c` keeps an edge without
computing :math:`p_{ij}`). A row whose drawing would cost more than testing
its keys (expected draws :math:`\geq` :data:`DENSE_ROW_THRESHOLD` of its
keys) is sampled with one Bernoulli per key instead, so a dense head costs
:math:`O(n_k)` per query in either mode; :obj:`num_draws` then counts those
tested pairs. Each row has its own counter-based random stream (SplitMix64),
seeded from the generator, so the graph depends neither on the number of
threads nor on the device: both kernels read every row's stream at the same
counters.

The sampler runs as two operators, so that the caller checks the draw count
against its memory guard between them, at its one host sync, before
anything of the graph's size exists (the CUDA kernel of the second reads
one more value, the graph's edge count, to allocate it):

* ``fastrg_plan(Y, W, Z, ptr_q, ptr_k, delta, exact, seed, threshold)``
  :math:`\to` :obj:`(degree [R], inflation [R], mass [2, G, H, k],
  stats [6])`: each row's degree (:obj:`-1` for a dense row), its
  inflation :math:`c`, the key clusters' masses and maxima (the maxima
  scale the sample's key tables: computed once, here) and the statistics (draws, expected draws,
  distinct edges expected, rows with an overflowing rate, invalid entries
  of :obj:`Y` and of :obj:`Z`).
* ``fastrg_sample(W, Z, mass, ptr_q, ptr_k, delta, exact, seed, degree,
  inflation, self_loops, inc_ptr, inc_col, capacity, slots=0)``
  :math:`\to` :obj:`(rowptr, col, perm, colptr, row_t, row)`, the int32
  CSR of :class:`~sbm_pyg.ops.graph.CSRGraph`, its rows in column order
  (:meth:`~sbm_pyg.ops.graph.CSRGraph.row_t`, written by the column sort)
  and, for :obj:`slots > 0`, the row of each edge; :obj:`capacity` is the
  CUDA kernel's draw buffer
  (:func:`~sbm_pyg.sampling.fastrg_triton.buffer_slots` summed, read at
  the memory guard's sync), which the CPU kernel, merging each row in
  buffers of its own, does not read. :obj:`slots > 0` (at least the edge
  count) writes :obj:`col`, :obj:`perm`, :obj:`row_t` and :obj:`row` into
  buffers of that length, padded as
  :func:`~sbm_pyg.sampling.fastrg_static` pads (column and row 0,
  :obj:`perm` the identity): the static route's buffers, with no copy;
  :obj:`0` sizes them by the edge count and leaves :obj:`row` empty.

Here :obj:`W = Y B` is :obj:`[H, N_q, k]`, :obj:`Y` :obj:`[N_q, H, k]` and
:obj:`Z` :obj:`[N_k, H, k]` (float32 or float64), :obj:`R = H N_q`, and
:obj:`inc_ptr`/:obj:`inc_col` the CSR over queries of the included pairs
(both empty for none). The schemas and fake kernels are defined here, once;
the CPU kernels are the compiled extension's (``csrc/sampler/fastrg.cpp``),
the CUDA kernels the Triton ones of :mod:`~sbm_pyg.sampling.fastrg_triton`.
Under ``TRITON_INTERPRET=1`` (tests without a GPU) the Triton kernels are
also registered for CPU tensors as the twin operators
``sbm_pyg::triton_fastrg_plan`` and ``sbm_pyg::triton_fastrg_sample``.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sbm_pyg.ops.graph import INDEX_DTYPE, CSRGraph, check_index_range
from sbm_pyg.ops.library import TWIN, OpSpec, define_ops
from sbm_pyg.sampling import fastrg_triton
from sbm_pyg.sampling.checks import check_draws
from sbm_pyg.sampling.edges import SampledEdges, keys_to_csr, sorted_unique
from sbm_pyg.validation import Check, invalid_values

__all__ = ["Plan", "plan_operands", "plan", "draw", "stream_seed", "included_csr",
           "DENSE_ROW_THRESHOLD"]

# A row is sampled densely (one Bernoulli per key) when its expected number
# of draws, inflation included, is at least this fraction of its keys.
DENSE_ROW_THRESHOLD = 0.5
# Peak bytes per slot of the draw buffer and per distinct edge, output
# included, of each kernel. C++: col, perm and row_t (int32, 12 B), the
# per-chunk int32 keys while they are copied (4 B) and their growth slack,
# and the radix buffers of the (sequence, head) blocks being sorted;
# duplicates are merged row by row as they are drawn, so it has no draw
# buffer. Triton: the int32 draw buffer (a slot per draw, forced key, dense
# trial and bitmap word: fastrg_triton.buffer_slots), merged in place row by
# row; then col (4 B) and the column sort (its int32 keys, int64 indices,
# int32 perm: 16 B) beside it; row_t (and the row index it is gathered
# from) after the sort's buffers are freed.
PEAK_BYTES = {"cpp": (0, 20), "triton": (4, 24)}
# Key table entry: an int64 cumulative weight and an int32 guide.
BYTES_PER_TABLE_ENTRY = 12

_SCHEMAS = {
    "_plan": ("(Tensor Y, Tensor W, Tensor Z, Tensor ptr_q, Tensor ptr_k, "
              "float delta, bool exact, int seed, float threshold) -> "
              "(Tensor, Tensor, Tensor, Tensor)"),
    "_sample": ("(Tensor W, Tensor Z, Tensor mass, Tensor ptr_q, "
                "Tensor ptr_k, float delta, bool exact, int seed, "
                "Tensor degree, Tensor inflation, bool self_loops, "
                "Tensor inc_ptr, Tensor inc_col, int capacity, "
                "int slots=0) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
                "Tensor)"),
}


def stream_seed(generator: Optional[torch.Generator],
                device: torch.device) -> int:
    r"""The 62-bit seed of the row streams, drawn from :obj:`generator` (a
    generator of :obj:`device`): the C++ and Triton kernels derive every
    row's stream from it, so the same seed gives the same graph on both.

    A CUDA generator is a seed and a Philox offset: the stream seed is mixed
    from both on the host and the offset advanced as a kernel that drew
    four numbers would, so that no kernel runs and nothing is read back
    from the GPU."""
    if device.type == "cuda":
        if generator is None:
            index = device.index if device.index is not None else \
                torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
        offset = generator.get_offset()
        generator.set_offset(offset + 4)
        return _mix64(_mix64(generator.initial_seed()) ^ offset) >> 2
    return int(torch.randint(2**62, (), generator=generator, device=device))


def _mix64(z: int) -> int:
    # SplitMix64's finalizer on Python ints (the kernels' mix64).
    mask = 2**64 - 1
    z &= mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def included_csr(i: Tensor, j: Tensor, Nq: int, Nk: int
                 ) -> Tuple[Tensor, Tensor]:
    r"""The included pairs :obj:`(i, j)` as the kernels take them: the
    sorted distinct keys of each query, :obj:`(inc_ptr [N_q + 1],
    inc_col)`."""
    # The one-head case of the samplers' own key-to-CSR conversion.
    _, col, _, ptr = keys_to_csr(sorted_unique(i * max(Nk, 1) + j), 1, Nq, Nk)
    return ptr, col


class Plan(NamedTuple):
    r"""The first operator's result, waiting for the caller's host sync:
    :obj:`checks` to raise there and :obj:`scalars` to read with them (the
    rate check's flag, then the draws, expected draws, expected distinct
    edges and the draw buffer's capacity), which :func:`draw` takes."""

    checks: List[Check]
    scalars: Tuple[Tensor, ...]
    W: Tensor
    Z: Tensor
    mass: Tensor
    degree: Tensor
    inflation: Tensor
    seed: int
    inc_ptr: Tensor
    inc_col: Tensor
    ptr_q: Tensor
    ptr_k: Tensor
    num_queries: int
    options: Tuple[float, bool, bool, Optional[int], str]


# Raised at draw(), not at the sync: a rate too large to sample is an error
# only where the graph is drawn (the dense regime takes such an SBM).
_OVERFLOW = "the SBM's edge rates overflow (q_memb, block or k_memb too large)"


def plan_operands(q_memb: Tensor, block: Tensor, k_memb: Tensor
                  ) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The plan's operands, detached and contiguous in float32 (float64
    for float64 memberships): the query memberships :obj:`Y`
    :obj:`[N_q, H, k]`, the key memberships :obj:`Z` :obj:`[N_k, H, k]`
    and :obj:`W = Y B` heads first, :obj:`[H, N_q, k]`."""
    dtype = torch.float64 if q_memb.dtype == torch.float64 else torch.float32
    Y = q_memb.detach().to(dtype).contiguous()
    Z = k_memb.detach().to(dtype).contiguous()
    W = torch.bmm(Y.transpose(0, 1), block.detach().to(dtype)).contiguous()
    return Y, Z, W


def plan(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: Tensor,
         ptr_k: Tensor, checks: List[Check], mode: str, exploration: float,
         self_loops: bool, included: Optional[Sequence[Tensor]],
         max_edges: Optional[int], generator: Optional[torch.Generator],
         backend: str, seed: Optional[int] = None) -> Plan:
    r"""Runs ``fastrg_plan`` (arguments validated by
    :func:`~sbm_pyg.sampling.fastrg`; :obj:`included` is :obj:`None` or the
    clamped :obj:`(i, j)` pairs; :obj:`backend` is :obj:`"cpp"` or
    :obj:`"triton"`; :obj:`seed` the row streams' seed, drawn from
    :obj:`generator` if :obj:`None`). Reads nothing to the host: the
    caller resolves :obj:`checks` (its own and the plan's) and reads the
    plan's :obj:`scalars` in its one sync, then calls :func:`draw`."""
    Nq, H, k = q_memb.shape
    Nk = k_memb.size(0)
    exact = mode == "exact"
    ops = torch.ops.sbm_pyg
    plan_op = ops.fastrg_plan
    if backend == "triton" and q_memb.device.type == "cpu":
        plan_op = ops.triton_fastrg_plan
    Y, Z, W = plan_operands(q_memb, block, k_memb)
    if seed is None:
        seed = stream_seed(generator, q_memb.device)
    degree, inflation, mass, stats = plan_op(Y, W, Z, ptr_q, ptr_k,
                                             float(exploration), exact, seed,
                                             DENSE_ROW_THRESHOLD)
    del Y
    draws, expected, edges, overflow, bad_q, bad_k = stats.unbind()
    checks = checks + [(bad_q > 0, invalid_values("q_memb")),
                       (bad_k > 0, invalid_values("k_memb"))]
    inc_ptr = inc_col = ptr_q.new_empty(0)
    if included is not None:
        i, j = included
        inc_ptr, inc_col = included_csr(i, j, Nq, Nk)
    capacity = draws
    if backend == "triton":
        capacity = fastrg_triton.buffer_slots(degree, ptr_q, ptr_k, H, inc_ptr,
                                              self_loops).sum()
    overflowed = (overflow > 0) | ~torch.isfinite(expected)
    return Plan(checks, (overflowed, draws, expected, edges, capacity), W, Z,
                mass, degree, inflation, seed, inc_ptr, inc_col, ptr_q, ptr_k,
                Nq, (float(exploration), exact, self_loops, max_edges,
                     backend))


def draw(plan: Plan, values: Sequence[float]) -> SampledEdges:
    r"""Runs ``fastrg_sample`` for :obj:`plan`, with :obj:`values` its
    :obj:`scalars` as the caller's sync read them; raises if the rates
    overflow, more than :obj:`max_edges` were drawn or the graph would not
    fit into memory, before anything of its size exists."""
    exploration, exact, self_loops, max_edges, backend = plan.options
    overflowed, num_draws, expected_draws, num_edges, capacity = values
    if overflowed:
        raise ValueError(_OVERFLOW)
    H, Nq, k = plan.W.shape
    Nk = plan.Z.size(0)
    draw_op = torch.ops.sbm_pyg.fastrg_sample
    if backend == "triton" and plan.W.device.type == "cpu":
        draw_op = torch.ops.sbm_pyg.triton_fastrg_sample
    per_slot, per_edge = PEAK_BYTES[backend]
    check_draws(num_draws, expected_draws,
                capacity * per_slot + num_edges * per_edge
                + H * k * Nk * BYTES_PER_TABLE_ENTRY,
                max_edges, plan.W.device, plan.ptr_q.numel() - 1, H, Nq, Nk)
    check_index_range(int(num_edges), H * Nq, H * Nk)
    rowptr, col, perm, colptr, row_t, _ = draw_op(
        plan.W, plan.Z, plan.mass, plan.ptr_q, plan.ptr_k, exploration, exact,
        plan.seed, plan.degree, plan.inflation, self_loops, plan.inc_ptr,
        plan.inc_col, int(capacity))
    csr = CSRGraph(rowptr, col, colptr, perm)
    csr.set_row_t(row_t)
    return SampledEdges(csr, int(num_draws), expected_draws)


def _fake_plan(Y, W, Z, ptr_q, ptr_k, delta, exact, seed, threshold):
    H, Nq, k = W.shape
    double = dict(dtype=torch.float64)
    return (ptr_q.new_empty(H * Nq), W.new_empty(H * Nq, **double),
            W.new_empty(2, ptr_q.size(0) - 1, H, k, **double),
            W.new_empty(6, **double))


def _fake_sample(W, Z, mass, ptr_q, ptr_k, delta, exact, seed, degree,
                 inflation, self_loops, inc_ptr, inc_col, capacity, slots=0):
    H, Nq, _ = W.shape
    S = slots if slots > 0 else torch.library.get_ctx().new_dynamic_size()
    index = dict(dtype=INDEX_DTYPE)
    return (W.new_empty(H * Nq + 1, **index), W.new_empty(S, **index),
            W.new_empty(S, **index), W.new_empty(H * Z.size(0) + 1, **index),
            W.new_empty(S, **index), W.new_empty(S if slots > 0 else 0, **index))


# The CPU kernels come from the extension (TORCH_LIBRARY_IMPL in
# csrc/bindings.cpp).
_OPS: OpSpec = {
    "fastrg_plan": (_SCHEMAS["_plan"], _fake_plan, fastrg_triton.plan),
    "fastrg_sample": (_SCHEMAS["_sample"], _fake_sample, fastrg_triton.sample),
}
define_ops(_OPS)
if TWIN:
    define_ops(_OPS, TWIN)
