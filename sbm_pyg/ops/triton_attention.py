r"""Fused sparse attention kernels in Triton (the CUDA path of
:func:`~sbm_pyg.nn.functional.sparse_attention`).

The PyTorch path runs SDDMM → segment softmax → SpMM as separate kernels
and keeps the :obj:`[E]` attention weights for backward. Here one program
per CSR row (a (head, query) pair) walks the row's sampled keys in blocks of
:obj:`BLOCK_E` edges with FlashAttention's online softmax: it computes the
scores, the running max and normalizer and the weighted sum of values in one
pass, and keeps only the row's log-sum-exp (:obj:`[R]`) for backward.

Backward recomputes the weights from the log-sum-exp, as FlashAttention
does, in two kernels without atomics: one program per row for
:math:`\partial L / \partial \mathbf{q}` (which also writes the
straight-through gradient of each edge's probability), one per key column
(over the transposed CSR) for :math:`\partial L / \partial \mathbf{k}` and
:math:`\partial L / \partial \mathbf{v}`. Accumulation is in float32 (float64
for float64 inputs); outputs are in the inputs' dtype.

Attention dropout is by counter (:mod:`sbm_pyg.ops.dropout`): each edge's
factor, 0 or :math:`1/(1-p)`, is a function of the seed and its (row,
column), computed where it is needed, in the forward and again in both
backward kernels, as the C++ kernel does, with the same mask.

Without a GPU the kernels run under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported), which is how
the tests check them against the PyTorch path on the CPU.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

from sbm_pyg.ops.dropout import DROPOUT_STREAM, kernel_seed
from sbm_pyg.ops.torch_attention import STE_CODES

if triton is not None:
    from sbm_pyg.ops.triton_streams import bits, stream

    # A global a compiled kernel may read must be a constexpr.
    _DROPOUT_STREAM = tl.constexpr(DROPOUT_STREAM)

__all__ = ["attention_forward", "attention_backward"]

BLOCK_E = 32


if triton is not None:

    @triton.jit
    def _rows(Ptr, index, live, cols, WIDTH: tl.constexpr, ACC: tl.constexpr):
        # The rows index[live] of a contiguous [*, WIDTH] matrix, zeros
        # elsewhere, as [BLOCK, BLOCK_WIDTH] in the accumulation dtype.
        # int64: an int32 row index times the width may pass 2^31.
        return tl.load(Ptr + index.to(tl.int64)[:, None] * WIDTH + cols[None, :],
                       mask=live[:, None] & (cols[None, :] < WIDTH),
                       other=0.0).to(ACC)

    @triton.jit
    def _row(Ptr, index, cols, WIDTH: tl.constexpr, ACC: tl.constexpr):
        # Row index of a contiguous [*, WIDTH] matrix, zero-padded.
        return tl.load(Ptr + index * WIDTH + cols, mask=cols < WIDTH,
                       other=0.0).to(ACC)

    @triton.jit
    def _keep(seed, threshold, r, c, ACC: tl.constexpr):
        # Each edge (r, c)'s dropout factor: 0, or 2^53 / (2^53 - t) where
        # the top 53 bits of row r's dropout stream at counter c + 1 reach
        # the threshold t.
        b = bits(stream(seed, r, _DROPOUT_STREAM), c.to(tl.int64) + 1)
        scale = 9007199254740992.0 / (9007199254740992 - threshold).to(tl.float64)
        return tl.where((b >> 11) >= threshold.to(tl.uint64), scale.to(ACC), 0.0)

    # The dropout's threshold changes from call to call: typed, not
    # specialized on its value. Its seed is read from the device (DSeed
    # points to it, read only under DROP), so that a captured graph can
    # draw a new one each replay.
    @triton.jit(do_not_specialize=["DThr"])
    def _forward_kernel(Q, K, V, Out, Lse, rowptr, col, Scale, DSeed, DThr: tl.int64,
                        D: tl.constexpr, DV: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                        BLOCK: tl.constexpr, ACC: tl.constexpr,
                        DROP: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        scale = tl.load(Scale)
        dseed = 0
        if DROP:  # once a row, not once an edge block
            dseed = tl.load(DSeed)
        # int64 edge offsets: an int32 block start plus arange(BLOCK) wraps
        # negative near 2^31 - 1 edges, which the int32 CSR admits. (The
        # arange is widened too: the interpreter's loop variable is a
        # Python int, which takes the arange's type.)
        start = tl.load(rowptr + r).to(tl.int64)
        end = tl.load(rowptr + r + 1).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        q = _row(Q, r, d, D, ACC)
        m = tl.full([], float("-inf"), ACC)
        norm = tl.zeros([], ACC)
        acc = tl.zeros([BLOCK_DV], ACC)
        for e0 in range(start, end, BLOCK):
            e = e0 + tl.arange(0, BLOCK).to(tl.int64)
            live = e < end
            c = tl.load(col + e, mask=live, other=0)
            k = _rows(K, c, live, d, D, ACC)
            s = tl.sum(k * q[None, :], 1) * scale
            s = tl.where(live, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            p = tl.exp(s - m_new)
            rescale = tl.exp(m - m_new)
            v = _rows(V, c, live, dv, DV, ACC)
            w = p
            if DROP:
                w = p * _keep(dseed, DThr, r, c, ACC)
            acc = acc * rescale + tl.sum(w[:, None] * v, 0)
            norm = norm * rescale + tl.sum(p, 0)
            m = m_new
        # A row without edges outputs zeros; its log-sum-exp is never read.
        has = norm > 0
        out = tl.where(has, acc / tl.where(has, norm, 1.0), 0.0)
        tl.store(Out + r * DV + dv, out.to(Out.dtype.element_ty),
                 mask=dv < DV)
        tl.store(Lse + r, tl.where(has, m + tl.log(tl.where(has, norm, 1.0)),
                                   0.0))

    @triton.jit
    def _ste(ds, s, STE: tl.constexpr):
        # dL/dp_e of either estimator from dL/ds_e and the score.
        if STE == 1:
            return ds * s
        return tl.minimum(tl.maximum(ds, -1.0), 1.0)

    # The dropout's threshold changes from call to call: typed, not
    # specialized on its value. Its seed is read from the device (DSeed
    # points to it, read only under DROP), so that a captured graph can
    # draw a new one each replay.
    @triton.jit(do_not_specialize=["DThr"])
    def _backward_query_kernel(Q, K, V, GradOut, Lse, Delta, GradQ, GradProb,
                               Km, GradQb, rowptr, col, Scale, DSeed, DThr: tl.int64,
                               D: tl.constexpr, DV: tl.constexpr,
                               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                               BLOCK: tl.constexpr, ACC: tl.constexpr,
                               STE: tl.constexpr, MEMB: tl.constexpr,
                               KM: tl.constexpr, BLOCK_K: tl.constexpr,
                               DROP: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        scale = tl.load(Scale)
        dseed = 0
        if DROP:  # once a row, not once an edge block
            dseed = tl.load(DSeed)
        start = tl.load(rowptr + r).to(tl.int64)  # int64, as in the forward kernel
        end = tl.load(rowptr + r + 1).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        kk = tl.arange(0, BLOCK_K)
        q = _row(Q, r, d, D, ACC)
        g = _row(GradOut, r, dv, DV, ACC)
        lse = tl.load(Lse + r)
        delta = tl.load(Delta + r)
        grad_q = tl.zeros([BLOCK_D], ACC)
        grad_qb = tl.zeros([BLOCK_K], ACC)
        for e0 in range(start, end, BLOCK):
            e = e0 + tl.arange(0, BLOCK).to(tl.int64)
            live = e < end
            c = tl.load(col + e, mask=live, other=0)
            k = _rows(K, c, live, d, D, ACC)
            v = _rows(V, c, live, dv, DV, ACC)
            s = tl.sum(k * q[None, :], 1) * scale
            p = tl.where(live, tl.exp(s - lse), 0.0)
            # Softmax backward: dL/ds_e = a_e (dL/da_e - sum_row a dL/da),
            # dL/da_e = keep_e <g_r, v_c> under dropout.
            t = tl.sum(v * g[None, :], 1)
            if DROP:
                t = t * _keep(dseed, DThr, r, c, ACC)
            ds = p * (t - delta)
            grad_q += tl.sum(ds[:, None] * k, 0)
            if MEMB:  # dL/dp_e summed into (Q̂Ŝ)_r through K̂_c
                km = _rows(Km, c, live, kk, KM, ACC)
                grad_qb += tl.sum(_ste(ds, s, STE)[:, None] * km, 0)
            elif STE != 0:
                tl.store(GradProb + e, _ste(ds, s, STE), mask=live)
        tl.store(GradQ + r * D + d, (grad_q * scale).to(GradQ.dtype.element_ty),
                 mask=d < D)
        if MEMB:
            tl.store(GradQb + r * KM + kk, grad_qb.to(GradQb.dtype.element_ty),
                     mask=kk < KM)

    # The dropout's threshold changes from call to call: typed, not
    # specialized on its value. Its seed is read from the device (DSeed
    # points to it, read only under DROP), so that a captured graph can
    # draw a new one each replay.
    @triton.jit(do_not_specialize=["DThr"])
    def _backward_key_kernel(Q, K, V, GradOut, Lse, Delta, GradK, GradV,
                             Qb, GradKm, colptr, row_t, Scale, DSeed, DThr: tl.int64,
                             D: tl.constexpr, DV: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                             BLOCK: tl.constexpr, ACC: tl.constexpr,
                             STE: tl.constexpr, MEMB: tl.constexpr,
                             KM: tl.constexpr, BLOCK_K: tl.constexpr,
                             DROP: tl.constexpr):
        c = tl.program_id(0).to(tl.int64)
        scale = tl.load(Scale)
        dseed = 0
        if DROP:  # once a row, not once an edge block
            dseed = tl.load(DSeed)
        start = tl.load(colptr + c).to(tl.int64)  # int64, as in the forward kernel
        end = tl.load(colptr + c + 1).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        k = _row(K, c, d, D, ACC)
        v = _row(V, c, dv, DV, ACC)
        kk = tl.arange(0, BLOCK_K)
        grad_k = tl.zeros([BLOCK_D], ACC)
        grad_v = tl.zeros([BLOCK_DV], ACC)
        grad_km = tl.zeros([BLOCK_K], ACC)
        for t0 in range(start, end, BLOCK):
            t = t0 + tl.arange(0, BLOCK).to(tl.int64)
            live = t < end
            r = tl.load(row_t + t, mask=live, other=0)
            q = _rows(Q, r, live, d, D, ACC)
            g = _rows(GradOut, r, live, dv, DV, ACC)
            lse = tl.load(Lse + r, mask=live, other=0.0)
            delta = tl.load(Delta + r, mask=live, other=0.0)
            s = tl.sum(q * k[None, :], 1) * scale
            p = tl.where(live, tl.exp(s - lse), 0.0)
            t_e = tl.sum(g * v[None, :], 1)
            if DROP:
                kept = _keep(dseed, DThr, r, c, ACC)
                grad_v += tl.sum((p * kept)[:, None] * g, 0)
                ds = p * (kept * t_e - delta)
            else:
                grad_v += tl.sum(p[:, None] * g, 0)
                ds = p * (t_e - delta)
            grad_k += tl.sum(ds[:, None] * q, 0)
            if MEMB:  # dL/dp_e summed into K̂_c through (Q̂Ŝ)_r
                qb = _rows(Qb, r, live, kk, KM, ACC)
                grad_km += tl.sum(_ste(ds, s, STE)[:, None] * qb, 0)
        tl.store(GradK + c * D + d, (grad_k * scale).to(GradK.dtype.element_ty),
                 mask=d < D)
        tl.store(GradV + c * DV + dv, grad_v.to(GradV.dtype.element_ty),
                 mask=dv < DV)
        if MEMB:
            tl.store(GradKm + c * KM + kk, grad_km.to(GradKm.dtype.element_ty),
                     mask=kk < KM)


def num_warps(D: int, DV: int, K: int = 1, fp64: bool = False) -> int:
    """Warps per (head, query) row or key column. An H100 ran the three
    kernels 2-4x faster with one warp than with four at D = 32 and D = 64
    (n = 16384, 1% density, no memberships; the CUDA benchmark's tuning
    section), as a row's tile is small; wider rows get more (not measured
    beyond D = 64), and the backward kernels that sum into K membership
    columns keep a [BLOCK_E, K] tile without spilling (four warps at
    K = 128, as before the tuning). A float64 tile takes twice the
    registers: one warp spilled the backward kernels at D = 32 (sm_90), so
    float64 spreads its tiles over four times the warps (not timed)."""
    block_d = triton.next_power_of_2(max(D, DV))
    block_k = triton.next_power_of_2(K)
    per_warp = 512 if fp64 else 2048  # tile entries one warp holds
    return max(1, min(8, BLOCK_E * block_d // per_warp),
               min(8, BLOCK_E * block_k // (per_warp // 2)))


def _meta(q: Tensor, v: Tensor, K: int = 1) -> dict:
    # K: the membership columns a backward kernel sums into (1 for none).
    D, DV = q.size(1), v.size(1)
    fp64 = q.dtype == torch.float64
    # On a GPU, products and sums contract to FMAs (enable_fp_fusion: the
    # default, named as Triton's default is to change) and float32's exp is
    # ex2.approx: within the tests' float32 tolerance (1e-5) of the PyTorch
    # path; float64 calls libdevice's exp, within 1e-12.
    return dict(D=D, DV=DV, BLOCK_D=triton.next_power_of_2(D),
                BLOCK_DV=triton.next_power_of_2(DV), BLOCK=BLOCK_E,
                ACC=tl.float64 if fp64 else tl.float32,
                num_warps=num_warps(D, DV, K, fp64), enable_fp_fusion=True)


def _acc_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _scale(scale: float, q: Tensor) -> Tensor:
    # A one-element tensor, not a Python float: a compiled kernel takes a
    # float argument as an fp32 parameter (the interpreter keeps it exact),
    # which made float64 results differ from the reference by ~1e-8.
    return torch.full((1,), scale, dtype=_acc_dtype(q), device=q.device)


def attention_forward(rowptr: Tensor, col: Tensor, q: Tensor, k: Tensor,
                      v: Tensor, scale: float,
                      dropout_seed: Optional[Tensor] = None,
                      dropout_threshold: int = 0) -> Tuple[Tensor, Tensor]:
    r"""Softmax attention over the nonzeros of each CSR row.

    Args:
        rowptr (IntTensor): :obj:`[R + 1]`.
        col (IntTensor): :obj:`[E]`.
        q (Tensor): :obj:`[R, D]`, contiguous; float16, bfloat16, float32
            or float64 (computed in float32, float64 for float64).
        k (Tensor): :obj:`[C, D]`, contiguous.
        v (Tensor): :obj:`[C, D_v]`, contiguous.
        scale (float): the scores are :math:`s \langle q_r, k_c \rangle`.
        dropout_seed (Tensor, optional): the dropout's seed, one int64 on
            the device, read by the kernel (needed with a threshold).
        dropout_threshold (int): attention dropout
            (:mod:`sbm_pyg.ops.dropout`; 0: none).

    Returns:
        :obj:`(out [R, D_v], lse [R])`: the output in :obj:`v`'s dtype and
        each row's log-sum-exp of scores (0 for empty rows) in the
        accumulation dtype.
    """
    R = rowptr.numel() - 1
    out = v.new_empty(R, v.size(1))
    lse = torch.empty(R, dtype=_acc_dtype(q), device=q.device)
    if R:
        _forward_kernel[(R,)](q, k, v, out, lse, rowptr, col,
                              _scale(scale, q),
                              kernel_seed(dropout_seed, dropout_threshold,
                                          rowptr), dropout_threshold,
                              DROP=dropout_threshold > 0, **_meta(q, v))
    return out, lse


def attention_backward(rowptr: Tensor, col: Tensor, colptr: Tensor,
                       row_t: Tensor, q: Tensor, k: Tensor, v: Tensor,
                       out: Tensor, lse: Tensor, grad_out: Tensor,
                       scale: float, ste: Optional[str],
                       q_block: Optional[Tensor] = None,
                       k_memb: Optional[Tensor] = None,
                       dropout_seed: Optional[Tensor] = None,
                       dropout_threshold: int = 0,
                       grad_lse: Optional[Tensor] = None,
                       ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor],
                                  Optional[Tensor], Optional[Tensor]]:
    r"""Gradients of :func:`attention_forward` (with its dropout).

    Args:
        colptr, row_t (IntTensor): the transposed CSR, :obj:`[C + 1]` and
            :obj:`[E]` (rows in column order).
        out, lse: what :func:`attention_forward` returned.
        grad_out (Tensor): :obj:`[R, D_v]`.
        ste (str, optional): the straight-through gradient of each edge's
            probability: :obj:`"paper"` :math:`\partial L/\partial a_e
            \cdot s_e`, :obj:`"published"` :math:`\mathrm{clip}(\partial
            L/\partial a_e, -1, 1)`; :obj:`None` for none.
        q_block (Tensor, optional): :obj:`[R, K]`, :math:`\hat{\mathbf{Q}}
            \hat{\mathbf{S}}`; with :obj:`k_memb` :obj:`[C, K]`
            (:math:`\hat{\mathbf{K}}`), the gradient of
            :math:`p_e = (\hat{\mathbf{Q}}\hat{\mathbf{S}})_r \cdot
            \hat{\mathbf{K}}_c` is summed into both inside the kernels, with
            no :obj:`[E]` tensor; with half precision rows the factors'
            rows are read in that precision, their gradients summed in the
            accumulation dtype and returned in the factors' own.
        grad_lse (Tensor, optional): :obj:`[R]`, the gradient of
            :obj:`lse` (an attention sink's): each edge's score gradient
            :math:`\alpha_e (t_e - \delta_r + \partial L / \partial
            \mathrm{lse}_r)`.

    Returns:
        :obj:`(grad_q, grad_k, grad_v, grad_prob, grad_q_block,
        grad_k_memb)`: :obj:`grad_prob` :obj:`[E]` in edge order with an
        estimator and no memberships, the membership gradients with them;
        :obj:`None` where not computed.
    """
    R, C = q.size(0), k.size(0)
    acc = _acc_dtype(q)
    grad_out = grad_out.contiguous()
    delta = (grad_out.to(acc) * out.to(acc)).sum(1)  # sum_row a dL/da
    if grad_lse is not None:
        delta = delta - grad_lse.to(acc)
    grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v))
    memb, K = False, 1
    grad_prob = grad_qb = grad_km = None
    if q_block is not None and k_memb is not None:
        if ste is None:
            raise ValueError("attention_backward: memberships need an "
                             "estimator")
        memb, K = True, q_block.size(1)
        grad_qb, grad_km = torch.empty_like(q_block), torch.empty_like(k_memb)
        if q.element_size() == 2:
            # Half precision rows (autocast): each edge gathers the other
            # side's factor row, most of the backward's bytes in float32;
            # in q's dtype they are half. The sums stay in the accumulation
            # dtype and are stored in the factors' own.
            q_block, k_memb = q_block.to(q.dtype), k_memb.to(q.dtype)
    elif ste is not None:
        grad_prob = torch.empty(col.numel(), dtype=acc, device=q.device)
    meta = dict(_meta(q, v, K), STE=STE_CODES[ste], MEMB=memb,
                KM=K, BLOCK_K=triton.next_power_of_2(K),
                DROP=dropout_threshold > 0)
    unused = grad_q  # a pointer for arguments a constexpr branch never reads
    scale_t = _scale(scale, q)
    seed = kernel_seed(dropout_seed, dropout_threshold, rowptr)
    if R:
        _backward_query_kernel[(R,)](
            q, k, v, grad_out, lse, delta, grad_q,
            unused if grad_prob is None else grad_prob,
            unused if k_memb is None else k_memb,
            unused if grad_qb is None else grad_qb,
            rowptr, col, scale_t, seed, dropout_threshold, **meta)
    if C:
        _backward_key_kernel[(C,)](
            q, k, v, grad_out, lse, delta, grad_k, grad_v,
            unused if q_block is None else q_block,
            unused if grad_km is None else grad_km,
            colptr, row_t, scale_t, seed, dropout_threshold, **meta)
    return grad_q, grad_k, grad_v, grad_prob, grad_qb, grad_km
