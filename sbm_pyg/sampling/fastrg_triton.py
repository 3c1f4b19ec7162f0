r"""The CUDA implementation of the sampler operators ``sbm_pyg::fastrg_plan``
and ``sbm_pyg::fastrg_sample`` (:mod:`~sbm_pyg.sampling.fastrg_op`): the
C++ kernel's query-major algorithm on the GPU, with the same random stream
and the same graph for the same seed. This module plans the work and
launches the Triton kernels of
:mod:`~sbm_pyg.sampling.fastrg_triton_kernels`.

Each :math:`(h, i)` row draws its Poisson degree :math:`\mathrm{Poisson}(c
\lambda_i)` (inversion below a mean of 10, Hörmann's PTRS above), picks each
draw's key cluster from the weights :math:`(\mathbf{Y}_i \mathbf{B})_v s^Z_v`
and its key from the cumulative quantised weights of :math:`(g, h, v)`, and
the duplicates of a row are merged; exact mode thins the distinct keys with
the row's own bound and squeeze, and a row whose expected draws reach
:data:`~sbm_pyg.sampling.fastrg_op.DENSE_ROW_THRESHOLD` (shared) of its keys
tests every key with one Bernoulli. Every row reads the C++ kernel's
SplitMix64 stream at the same counters, and a draw's key is an exact
integer function of its 64 random bits, so one seed gives the same graph on
both backends up to floating-point ties (sums in another order, another
:math:`\exp`: a draw that falls within an ulp of a cluster boundary or of a
thinning threshold).

Every pass is parallel over rows, table entries or draws:

* **plan**: the key clusters' float64 masses and maxima per sequence in
  one pass over the keys (:func:`key_masses`: pieces of
  :data:`PIECE_KEYS` keys, then each sequence's pieces in order); then one
  row per thread, :math:`\lambda_i` and the row bound summed over the
  clusters in the C++ kernel's order, and the Poisson draw. The maxima go
  with the masses to the sample, whose key tables they scale.
* **key tables**: each key's weight :math:`Z_{jv}` quantised to an integer
  (:math:`\lfloor Z_{jv} 2^M / \max_j Z_{jv} \rfloor`, :math:`M = 61 -
  \lceil \log_2 (N_k + 1) \rceil`, the maximum the plan's), so that one integer prefix sum over all
  tables (exact in any order) gives the C++ kernel's cumulative weights;
  a guide over :math:`n` equal buckets of each table's total, one binary
  search per bucket. A draw's 64 bits pick its bucket and its target; the
  walk from the guide takes two expected steps whatever the weights.
* **draws**: one row per program, its draws across the lanes.
* **merge**: one row per program: rows of at most
  :data:`SORT_BLOCK` draws and forced keys are sorted in registers (each
  forced key tagged so that it is kept but not thinned), larger rows mark a
  bitmap of their keys, dense rows compact their trials; exact mode thins
  each distinct key there, at its rank in the row.
* **graph**: the rows' counts summed, the edge count read (the sample's
  one host sync; the memory guard's read of the plan's statistics and the
  draw buffer's length, :func:`buffer_slots`, comes before it, in the
  caller), the rows copied into the CSR and its column order sorted.

Without a GPU they run under Triton's interpreter (``TRITON_INTERPRET=1``)
on CPU tensors, as the twin operators ``sbm_pyg::triton_fastrg_*``, which is
how the tests compare them with the C++ kernel edge by edge.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

try:
    import triton
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

from sbm_pyg.ops.graph import CSRGraph, check_index_range
from sbm_pyg.sampling.edges import column_order
from sbm_pyg.sampling.key_masses import key_masses

__all__ = ["plan", "sample", "buffer_slots", "weight_bits"]

# Rows per plan program: one per thread of its 4 warps.
BLOCK_ROWS = 128
# Lanes of the draw kernel, of the table kernels and of a merge step.
BLOCK_DRAWS = 16
BLOCK_ENTRIES = 256
BLOCK_MERGE = 256
# Bitmap words a merge step reads (32 keys each).
BLOCK_WORDS = 8
# Clusters summed per step of the thinning's p_ij.
BLOCK_CLUSTERS = 4
# Register sorts of a row's draws and forced keys, by size; a row above the
# largest marks a bitmap of its keys instead (ceil(n_k / 32) words after
# its slots, at most n_k / (8 SORT_BLOCK) bytes per draw).
SORT_SIZES = (64, 256, 1024)
SORT_BLOCK = SORT_SIZES[-1]
# No fused multiply-adds: the C++ kernel's floating-point operations are
# rounded one by one, and the same graph needs the same roundings.
NO_FUSION = dict(enable_fp_fusion=False)


def weight_bits(Nk: int) -> int:
    r"""Bits :math:`M` of a key's quantised weight: a table's largest key
    weighs :math:`2^M`, so that :math:`N_k` keys sum below :math:`2^{61}`
    (the C++ kernel's ``weight_bits``)."""
    return 61 - max(int(Nk), 0).bit_length()


if triton is not None:
    from sbm_pyg.sampling.fastrg_triton_kernels import (
        draw_kernel,
        graph_kernel,
        guide_kernel,
        merge_kernel,
        plan_kernel,
        weight_kernel,
    )


def _rows(ptr_q: Tensor, ptr_k: Tensor, H: int, Nq: int):
    # Each query's sequence [N_q] and each (head, query) row's key count [R].
    G = ptr_q.numel() - 1
    seq = torch.repeat_interleave(torch.arange(G, device=ptr_q.device),
                                  ptr_q.diff(), output_size=Nq)
    return seq, ptr_k.diff()[seq].repeat(H)


def _invalid(x: Tensor) -> Tensor:
    # 1.0 if an entry is negative, NaN or infinite, else 0.0 (the C++ flag).
    return (~((x >= 0) & torch.isfinite(x))).any().double()


def plan(Y: Tensor, W: Tensor, Z: Tensor, ptr_q: Tensor, ptr_k: Tensor,
         delta: float, exact: bool, seed: int, threshold: float
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The CUDA kernel of ``sbm_pyg::fastrg_plan``
    (:mod:`~sbm_pyg.sampling.fastrg_op` gives the contract): each row's
    degree, inflation, the key clusters' masses and the statistics."""
    H, Nq, k = W.shape
    R, device = H * Nq, W.device
    seq, nk = _rows(ptr_q, ptr_k, H, Nq)
    mass = key_masses(Z, ptr_k)  # [2, G, H, k]: the sums, the maxima
    padded = triton.cdiv(R, BLOCK_ROWS) * BLOCK_ROWS
    degree = torch.empty(padded, dtype=torch.long, device=device)[:R]
    inflation = torch.empty(padded, dtype=torch.float64, device=device)[:R]
    mu = torch.empty(padded, dtype=torch.float64, device=device)[:R]
    if R:
        plan_kernel[(triton.cdiv(R, BLOCK_ROWS),)](
            W, mass[0], mass[1], seq, ptr_k, degree, inflation, mu, seed,
            float(delta), float(threshold), R, Nq, H=H, K=k,
            BLOCK_R=BLOCK_ROWS, EXACT=exact, num_warps=BLOCK_ROWS // 32,
            **NO_FUSION)
    # The C++ kernel's statistics: a dense row counts its keys as draws and
    # its expected degree (at most its keys) as edges; a row whose rate is
    # not finite and non-negative draws nothing and is counted.
    dense = degree < 0
    nkd = nk.double()
    ok = (mu >= 0) & (mu < 1e300) & (nk > 0)
    zero = torch.zeros_like(mu)
    stats = torch.stack([
        torch.where(dense, nkd, degree.double()).sum(),
        torch.where(dense, nkd, torch.where(ok, mu, zero)).sum(),
        torch.where(dense, torch.minimum(mu / inflation, nkd),
                    degree.double()).sum(),
        (~ok & (nk > 0)).sum().double(), _invalid(Y), _invalid(Z)])
    return degree, inflation, mass, stats


def buffer_slots(degree: Tensor, ptr_q: Tensor, ptr_k: Tensor, H: int,
                 inc_ptr: Tensor, self_loops: bool) -> Tensor:
    r"""Each row's slots in :func:`sample`'s draw buffer :obj:`[R]`: a
    dense row's trials (:math:`n_k`), a sparse row's draws and forced keys,
    and for a row above :data:`SORT_BLOCK` the bitmap of its keys
    (:math:`\lceil n_k / 32 \rceil` words). Their sum is the
    :obj:`capacity` that :func:`sample` takes, read at the memory guard's
    sync."""
    seq, nk = _rows(ptr_q, ptr_k, H, degree.numel() // max(H, 1))
    forced = int(self_loops) + (inc_ptr.diff().repeat(H) if inc_ptr.numel()
                                else 0)
    n = degree + forced
    words = torch.where(n > SORT_BLOCK, (nk + 31) // 32, 0)
    return torch.where(nk == 0, 0, torch.where(degree < 0, nk, n + words))


def sample(W: Tensor, Z: Tensor, mass: Tensor, ptr_q: Tensor, ptr_k: Tensor,
           delta: float, exact: bool, seed: int, degree: Tensor,
           inflation: Tensor, self_loops: bool, inc_ptr: Tensor,
           inc_col: Tensor, capacity: int, slots: int = 0
           ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""The CUDA kernel of ``sbm_pyg::fastrg_sample``
    (:mod:`~sbm_pyg.sampling.fastrg_op` gives the contract): the graph's
    int32 CSR :obj:`(rowptr, col, perm, colptr)`, its rows in column
    order :obj:`row_t` (gathered through :obj:`perm`) and, for
    :obj:`slots > 0`, the row of each edge, padded to :obj:`slots` (copied
    into the padded buffers: the static route takes the C++ kernel).
    :obj:`capacity` is the draw buffer's length, :func:`buffer_slots`
    summed; the one host sync reads the graph's edge count."""
    H, Nq, k = W.shape
    Nk, device = Z.size(0), W.device
    R = H * Nq
    seq, _ = _rows(ptr_q, ptr_k, H, Nq)
    if not inc_ptr.numel():
        inc_ptr = torch.zeros(Nq + 1, dtype=torch.long, device=device)
        inc_col = inc_ptr[:1]
    row_slots = buffer_slots(degree, ptr_q, ptr_k, H, inc_ptr, self_loops)
    offset = torch.cumsum(row_slots, 0) - row_slots
    # A capacity short of the slots would write past the buffer: checked on
    # the device (an asynchronous assert on CUDA, no host sync).
    torch._assert_async(row_slots.sum() <= capacity,
                        "fastrg_sample: capacity is below the draw buffer's slots")
    buf = torch.zeros(capacity, dtype=torch.int32, device=device)
    count = torch.zeros(R, dtype=torch.long, device=device)
    if R:
        table, guide = key_tables(Z, mass[1], ptr_k, H, k)
        draw_kernel[(R,)](
            W, Z, mass[0], seq, ptr_k, degree, offset, table, guide, buf, seed,
            float(delta), Nq, Nk, H=H, K=k,
            BLOCK_K=triton.next_power_of_2(max(k, 1)),
            BLOCK_D=BLOCK_DRAWS, EXACT=exact, EXPLORE=delta > 0,
            # At k = 256 four warps made ptxas keep a predicate on the stack.
            num_warps=8 if k > 128 else 4, **NO_FUSION)
        del table, guide
        # The register sorts by size (two entries per thread), then the
        # dense and bitmap rows.
        passes = [(low, size, False) for low, size
                  in zip((0,) + tuple(SORT_SIZES[:-1]), SORT_SIZES)]
        for low, size, others in passes + [(0, SORT_BLOCK, True)]:
            merge_kernel[(R,)](
                buf, offset, count, degree, inflation, W, Z, seq, ptr_k,
                inc_ptr, inc_col, seed, float(delta), Nq, Nk, H=H, K=k,
                KC=BLOCK_CLUSTERS, LOW=low, SORT=size, OTHERS=others,
                SELF_LOOPS=self_loops, EXACT=exact, BLOCK=BLOCK_MERGE,
                BLOCK_W=BLOCK_WORDS,
                # Two entries per thread (with 8 warps for the dense and
                # bitmap rows, ptxas kept a pointer on the stack at k = 3).
                num_warps=BLOCK_MERGE // 64 if others else max(1, size // 64),
                **NO_FUSION)
    rowptr = torch.zeros(R + 1, dtype=torch.long, device=device)
    torch.cumsum(count, 0, out=rowptr[1:])
    E = int(rowptr[-1])  # the one host sync: the graph's size
    check_index_range(E, R, H * Nk)
    col = torch.empty(E, dtype=torch.int32, device=device)
    if E:
        graph_kernel[(R,)](buf, offset, rowptr, seq, ptr_k, col, Nq, Nk,
                            BLOCK=BLOCK_MERGE)
    del buf
    perm, colptr = column_order(col, H * Nk)
    rowptr = rowptr.to(torch.int32)
    graph = CSRGraph(rowptr, col, colptr, perm)
    row_t, row = graph.row_t(), col.new_empty(0)
    if slots > 0:
        if E > slots:
            raise ValueError(f"fastrg_sample: {E} edges do not fit into "
                             f"{slots} slots")
        row = torch.zeros(slots, dtype=torch.int32, device=device)
        row[:E] = graph.row()
        zeros = col.new_zeros(slots - E)
        col, row_t = torch.cat([col, zeros]), torch.cat([row_t, zeros])
        perm = torch.cat([perm, torch.arange(E, slots, dtype=perm.dtype,
                                             device=device)])
    return rowptr, col, perm, colptr, row_t, row


def key_tables(Z: Tensor, max_z: Tensor, ptr_k: Tensor, H: int, k: int
               ) -> Tuple[Tensor, Tensor]:
    r"""The cumulative quantised key weights :obj:`[H k, N_k]` (int64,
    running over the whole batch: a sequence's entries are relative to the
    entry before it) and their guide (int32) of every (sequence, head,
    cluster), scaled by the maxima :obj:`max_z [G, H, k]` (the plan's,
    :func:`key_masses`); the C++ kernel's tables, whose sums run per
    sequence."""
    Nk, device = Z.size(0), Z.device
    N = H * k * Nk
    table = torch.empty(H * k, Nk, dtype=torch.long, device=device)
    guide = torch.empty(H * k, Nk, dtype=torch.int32, device=device)
    if not N:
        return table, guide
    scale = torch.where(max_z > 0, 2.0 ** weight_bits(Nk) / max_z, 0.0)
    seq_k = torch.repeat_interleave(
        torch.arange(ptr_k.numel() - 1, device=device), ptr_k.diff(),
        output_size=Nk)
    grid = (triton.cdiv(N, BLOCK_ENTRIES),)
    weight_kernel[grid](Z, scale.contiguous(), seq_k, table, Nk, N, H=H, K=k,
                         BLOCK=BLOCK_ENTRIES, **NO_FUSION)
    # One scan of every table: exact integers, so the same sums as the C++
    # kernel's per-sequence loop, in any order.
    table.cumsum_(1)
    guide_kernel[grid](table, seq_k, ptr_k, guide, Nk, N,
                        BLOCK=BLOCK_ENTRIES, **NO_FUSION)
    return table, guide
