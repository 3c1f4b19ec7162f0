r"""The dense-regime SBM attention in Triton: the CUDA kernels of
``sbm_pyg::dense_attention`` and its backward, twins of the CPU kernels of
``csrc/attention/dense.cpp``.

Work is cut into tiles of :obj:`BLOCK_M` query rows of one (sequence,
head) pair, walking the pair's keys in tiles of :obj:`BLOCK_N`, as
FlashAttention does; no :obj:`[n_q, n_k]` matrix exists. Four kernels:

* **mask**: :math:`\mathbf{P} = (\hat{\mathbf{Q}}\hat{\mathbf{S}})
  \hat{\mathbf{K}}^{\top}` per tile by :func:`tl.dot` (full precision: the
  probabilities feed the draws), one Bernoulli trial per pair read from the
  row's SplitMix64 stream at the counters the CPU kernel reads
  (:mod:`~sbm_pyg.ops.triton_streams`), self-loops added, the bits
  packed eight keys to a byte in the CPU kernel's layout. Same seed, same
  uniforms: the mask is the CPU kernel's wherever the two round
  :math:`p_{ij}` alike (always, but for a uniform within rounding of
  :math:`p_{ij}`). The included pairs are then set with one
  :func:`torch.Tensor.index_add_` of distinct bits per byte.
* **forward**: the scores by :func:`tl.dot`, an online softmax over the
  mask's pairs, the output and each row's log-sum-exp and edge count.
* **backward over query tiles**: :math:`\partial L/\partial\mathbf{q}` and
  the straight-through gradient's sum :math:`\mathbf{G}\hat{\mathbf{K}}`
  into :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`.
* **backward over key tiles**: :math:`\partial L/\partial\mathbf{k}`,
  :math:`\partial L/\partial\mathbf{v}` and
  :math:`\mathbf{G}^{\top}\hat{\mathbf{Q}}\hat{\mathbf{S}}` into
  :math:`\hat{\mathbf{K}}`, without atomics.

Both backward kernels recompute the scores and weights from the mask and
the log-sum-exp. Products accumulate in the inputs' dtype (float32 or
float64). Their operands are the op's :obj:`precision`: :obj:`"ieee"`
(float32 on the FMA units, so that float32 matches the CPU kernel to
rounding: the same-graph tests' mode) or, on tensor cores, TF32, bfloat16
or float16 for the scores, outputs and gradients, and three-pass TF32 for
the mask's probabilities, which the draws compare with uniforms.

Each kernel finds its (sequence, tile) in a table built on the device with
a host-known size (:math:`\lfloor N / B \rfloor + G` tiles bound the
tiles of every batch): the only host sync is the mask's size, for its
allocation, and none where the caller passes it (``mask_bytes``, which
:func:`~sbm_pyg.nn.sbm_attention` reads with its regime's choice).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.ops.dropout import dropout_row_states, kernel_seed

try:
    import triton
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

if triton is not None:
    from sbm_pyg.ops import triton_dense_kernels as kernels
    from sbm_pyg.ops.triton_dense_kernels import (
        backward_key_kernel,
        backward_query_kernel,
        forward_kernel,
        mask_kernel,
    )

__all__ = ["dense_forward", "dense_backward"]


def _tiles(ptr: Tensor, num_rows: int, block: int) -> Tuple[Tensor, Tensor]:
    # (sequence, first row) of every tile of `block` rows of each sequence,
    # built on the device with a host-known length: sum ceil(n_g / B) <=
    # floor(N / B) + G. Padding tiles get sequence G (no work).
    G = ptr.numel() - 1
    per = (ptr.diff() + block - 1) // block
    end = per.cumsum(0)
    t = torch.arange(G + num_rows // block, device=ptr.device)
    g = torch.searchsorted(end, t, right=True)
    row = (t - (end - per)[g.clamp(max=G - 1)]) * block
    return g, row


def _mask_base(ptr_q: Tensor, ptr_k: Tensor, heads: int) -> Tensor:
    # The first byte of each sequence's mask rows, [G + 1] (the CPU
    # kernel's layout: (g, h, i) at base[g] + (h n_q + i) ceil(n_k / 8)).
    size = heads * ptr_q.diff() * ((ptr_k.diff() + 7) // 8)
    return torch.cat([size.new_zeros(1), size.cumsum(0)])


def _meta(q: Tensor, v: Tensor, K: int, precision: int) -> dict:
    D, DV = q.size(1), v.size(1)
    fp64 = q.dtype == torch.float64
    dot = 0 if fp64 else precision  # float64: every product in float64
    # Tiles and warps chosen by the ahead-of-time compile's registers and
    # stack (benchmarks/checks/triton_compile.py): the products run on FMAs
    # (input_precision="ieee"), whose operands each thread holds; with 64
    # rows (32 in float64) and 4 warps every kernel spilled at D = 64,
    # k = 128. float64 tiles are half as wide: twice the registers per
    # element. 4 warps for narrow float32 rows, where 8 left a register
    # kept on the stack across the key loop. Where float64's products are
    # elementwise sums (fp64_sums), [rows, width, keys] tensors: 4 rows (8
    # keys, a mask byte, in the mask kernel), which leaves no spill under
    # Triton 3.6 at D <= 64, k <= 128 with 8 warps (the forward 4); 8 rows
    # spilled up to 1.8 KB.
    sums = fp64_sums(q)
    block = (4 if sums else 16) if fp64 else 32
    widths = [max(16, triton.next_power_of_2(n)) for n in (D, DV, K)]
    return dict(D=D, DV=DV, KC=K, BLOCK_D=widths[0], BLOCK_DV=widths[1],
                BLOCK_KC=widths[2], BLOCK_M=block, BLOCK_N=8 if sums else block,
                num_warps=8 if fp64 or max(widths) >= 32 else 4,
                enable_fp_fusion=True, DOT=dot)


# Tiles (rows, keys, warps) of each kernel whose products run on tensor
# cores, where registers allow wider tiles than on FMA units: none spills
# at D <= 64, k <= 128 on sm_80 or sm_90 (benchmarks/checks/triton_compile.py).
# The key kernel's rows are the keys of its program (BLOCK_N) and the query
# tiles it walks (BLOCK_M).
# The key kernel without dropout: 4 warps at D <= 32 (8 left 8 stack bytes
# on sm_80), 8 at D = 64 (4 spilled 56).
TENSOR_CORE_TILES = {"mask": (32, 64, 8), "forward": (64, 32, 8),
                     "query": (64, 16, 8), "query_drop": (32, 32, 8),
                     "key": (16, 32, 8), "key_narrow": (16, 32, 4),
                     "key_drop": (16, 32, 8)}


def _tensor_core_tiles(meta: dict, kernel: str) -> dict:
    if not meta["DOT"]:
        return {k: meta[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps")}
    if kernel == "key" and meta["BLOCK_D"] <= 32 and meta["BLOCK_DV"] <= 32:
        kernel = "key_narrow"
    m, n, warps = TENSOR_CORE_TILES[kernel]
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps)


def fp64_sums(q: Tensor) -> bool:
    # Whether the kernels take float64 products as elementwise sums.
    return q.dtype == torch.float64 and kernels.FP64_SUMS


def _row_states(seed: Optional[Tensor], threshold: int, rows: int,
                unused: Tensor) -> Tensor:
    # The kernels' dropout argument: the stream states of query rows
    # 0 .. rows - 1 (every head's), computed on the device; without
    # dropout (threshold 0) unused, a pointer the kernels never read.
    seed = kernel_seed(seed, threshold, unused)
    if threshold == 0:
        return seed
    return dropout_row_states(seed, torch.arange(rows, device=unused.device))


def _scalar(x: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    # A one-element tensor, not a Python float: a compiled kernel takes a
    # float argument as fp32 (the interpreter would keep it exact).
    return torch.full((1,), x, dtype=dtype, device=device)


def dense_forward(ptr_q: Tensor, ptr_k: Tensor, inc_ptr: Tensor,
                  inc_col: Tensor, q: Tensor, k: Tensor, v: Tensor,
                  q_block: Tensor, k_memb: Tensor, heads: int, delta: float,
                  exact: bool, self_loops: bool, seed: Tensor, scale: float,
                  dropout_seed: Optional[Tensor] = None,
                  dropout_threshold: int = 0,
                  precision: int = 0, mask_bytes: int = -1
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The forward of ``sbm_pyg::dense_attention`` (arguments as there):
    :obj:`(out [R, D_v], lse [R], mask, edges [G, H])`. The mask's size is
    :obj:`mask_bytes` where the caller read it (checked on the device),
    else read here."""
    H, G = heads, ptr_q.numel() - 1
    Nq, Nk = q.size(0) // H, k.size(0) // H
    base = _mask_base(ptr_q, ptr_k, H)
    if mask_bytes < 0:  # a host sync: the mask's size, to allocate it
        mask_bytes = int(base[-1])
    else:  # on the device: an asynchronous assert on CUDA, no sync
        torch._assert_async(base[-1] == mask_bytes,
                            "sbm_pyg::dense_attention: mask_bytes does not fit ptr_q/ptr_k")
    mask = torch.zeros(mask_bytes, dtype=torch.uint8, device=q.device)
    out = torch.zeros(q.size(0), v.size(1), dtype=q.dtype, device=q.device)
    lse = torch.full((q.size(0),), float("-inf"), dtype=q.dtype,
                     device=q.device)
    count = torch.zeros(q.size(0), dtype=torch.int32, device=q.device)
    if G > 0 and Nq > 0:
        meta = _meta(q, v, q_block.size(1), precision)
        tile_seq, tile_row = _tiles(ptr_q, Nq, meta["BLOCK_M"])
        grid = (tile_seq.numel(), H)
        tiles = _tensor_core_tiles(meta, "mask")
        if tiles["BLOCK_M"] != meta["BLOCK_M"]:
            tile_seq, tile_row = _tiles(ptr_q, Nq, tiles["BLOCK_M"])
        mask_kernel[(tile_seq.numel(), H)](
            q_block, k_memb, ptr_q, ptr_k, base, tile_seq, tile_row, mask,
            seed, _scalar(delta, torch.float64, q.device), Nq, Nk, G,
            KC=meta["KC"], BLOCK_KC=meta["BLOCK_KC"],
            BLOCK_M=tiles["BLOCK_M"], BLOCK_N=tiles["BLOCK_N"], EXACT=exact,
            SELF_LOOPS=self_loops, num_warps=tiles["num_warps"],
            enable_fp_fusion=True,
            DOT=kernels.TF32X3 if meta["DOT"] else 0)
        if inc_ptr.numel() > 0:
            _include(mask, base, ptr_q, ptr_k, inc_ptr, inc_col, H)
        meta.pop("KC"), meta.pop("BLOCK_KC")
        if fp64_sums(q):
            meta["num_warps"] = 4
        if meta["DOT"]:
            meta.update(_tensor_core_tiles(meta, "forward"))
            tile_seq, tile_row = _tiles(ptr_q, Nq, meta["BLOCK_M"])
            grid = (tile_seq.numel(), H)
        forward_kernel[grid](
            q, k, v, mask, ptr_q, ptr_k, base, tile_seq, tile_row,
            _scalar(scale, q.dtype, q.device), out, lse, count, Nq, Nk, G,
            _row_states(dropout_seed, dropout_threshold, q.size(0), seed),
            dropout_threshold, DROP=dropout_threshold > 0, **meta)
    # The edges of each (sequence, head): the rows' counts summed per
    # sequence, by prefix sums (no sync).
    csum = torch.cat([count.new_zeros(H, 1, dtype=torch.long),
                      count.view(H, Nq).long().cumsum(1)], 1)
    edges = (csum[:, ptr_q[1:]] - csum[:, ptr_q[:-1]]).t().contiguous()
    return out, lse, mask, edges


def _include(mask: Tensor, base: Tensor, ptr_q: Tensor, ptr_k: Tensor,
             inc_ptr: Tensor, inc_col: Tensor, H: int) -> None:
    # Sets the included pairs' bits in every head. The pairs of a query are
    # distinct, so the bits added to a byte are distinct and their sum is
    # their OR.
    i = torch.repeat_interleave(
        torch.arange(inc_ptr.numel() - 1, device=mask.device), inc_ptr.diff(),
        output_size=inc_col.numel())
    g = torch.searchsorted(ptr_q, i, right=True) - 1
    nq, rb = ptr_q.diff()[g], (ptr_k.diff()[g] + 7) // 8
    j = inc_col - ptr_k[g]
    h = torch.arange(H, device=mask.device)[:, None]
    byte = base[g] + (h * nq + i - ptr_q[g]) * rb + (j >> 3)
    bit = (1 << (j & 7)).to(torch.uint8).expand(H, -1)
    added = torch.zeros_like(mask).index_add_(0, byte.flatten(),
                                              bit.flatten())
    mask.bitwise_or_(added)


def dense_backward(ptr_q: Tensor, ptr_k: Tensor, q: Tensor, k: Tensor,
                   v: Tensor, q_block: Tensor, k_memb: Tensor, mask: Tensor,
                   out: Tensor, lse: Tensor, grad_out: Tensor, heads: int,
                   scale: float, ste: int,
                   dropout_seed: Optional[Tensor] = None,
                   dropout_threshold: int = 0, precision: int = 0,
                   grad_lse: Optional[Tensor] = None
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""The backward of ``sbm_pyg::dense_attention`` (arguments as
    ``sbm_pyg::dense_attention_backward``): :obj:`(dq, dk, dv, d_q_block,
    d_k_memb)`, the last two empty for :obj:`ste = 0`."""
    H, G = heads, ptr_q.numel() - 1
    Nq, Nk = q.size(0) // H, k.size(0) // H
    memb = ste != 0
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    dqb = torch.zeros_like(q_block) if memb else q.new_empty(0)
    dkm = torch.zeros_like(k_memb) if memb else q.new_empty(0)
    if G == 0 or Nq == 0 or Nk == 0:
        return dq, dk, dv, dqb, dkm
    base = _mask_base(ptr_q, ptr_k, H)
    delta = (grad_out * out).sum(1)
    if grad_lse is not None:  # ds = A (dA - delta + dL/dlse): an attention sink's
        delta = delta - grad_lse
    meta = dict(_meta(q, v, q_block.size(1), precision), STE=ste)
    scale_t = _scalar(scale, q.dtype, q.device)
    # With no estimator the membership arguments are never read.
    args = (q, k, v, q_block, k_memb, grad_out, lse, delta, mask, ptr_q,
            ptr_k, base)
    # The backward kernels hold two and three accumulators across their
    # loops (dq and the memberships'; dk, dv and the memberships'): their
    # inner tiles are narrower than the forward's, and the key kernel's
    # tiles too, so that neither spills at D <= 64, k <= 128.
    narrow = min(meta["BLOCK_M"], 16)  # float64's tiles are 8 already
    meta["BLOCK_N"] = narrow
    if dropout_threshold > 0:
        # The mask's hash took the float32 query kernel past its registers
        # at 32 rows (8-16 stack bytes at D <= 64, sm_90): 16 rows.
        meta["BLOCK_M"] = narrow
    key_meta = dict(meta, BLOCK_M=narrow)
    if dropout_threshold > 0 and not meta["DOT"] and q.dtype == torch.float32:
        # Its 16 rows on 8 warps spilled 8 bytes on sm_90 at k = 128 (D = 64
        # under Triton 3.9, D = 32 under 3.8); on 4 warps none of the three
        # Tritons spills at k <= 128.
        meta["num_warps"] = 4 if meta["BLOCK_KC"] <= 128 else 8
    if meta["DOT"]:
        drop = "_drop" if dropout_threshold > 0 else ""
        meta.update(_tensor_core_tiles(meta, "query" + drop))
        key_meta.update(_tensor_core_tiles(meta, "key" + drop))
    dseed = _row_states(dropout_seed, dropout_threshold, q.size(0), ptr_q)
    tile_seq, tile_row = _tiles(ptr_q, Nq, meta["BLOCK_M"])
    backward_query_kernel[(tile_seq.numel(), H)](
        *args, tile_seq, tile_row, scale_t, dq, dqb, Nq, Nk, G, dseed,
        dropout_threshold, DROP=dropout_threshold > 0, **meta)
    meta = key_meta
    tile_seq, tile_row = _tiles(ptr_k, Nk, meta["BLOCK_N"])
    backward_key_kernel[(tile_seq.numel(), H)](
        *args, tile_seq, tile_row, scale_t, dk, dv, dkm, Nq, Nk, G,
        dseed, dropout_threshold, DROP=dropout_threshold > 0, **meta)
    return dq, dk, dv, dqb, dkm
