r"""The Triton kernels of the dense-regime SBM attention
(:mod:`sbm_pyg.ops.triton_dense` launches them and describes the work).
One program per tile of query rows (or of keys, for the key gradients) of
one (sequence, head), walking the other side in tiles."""
from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

__all__ = ["mask_kernel", "forward_kernel", "backward_query_kernel",
           "backward_key_kernel"]

if triton is not None:
    from sbm_pyg.ops.triton_streams import bits, one_minus_exp, stream, uniform

    # Triton before 3.9 cannot lower a float64 MMA whose operand is
    # computed in registers (3.6: "fp64 don't support largeK MMA"; 3.8 is
    # given the sums too, 3.7 not tried): there the float64 products are
    # elementwise sums, on 4-row tiles (triton_dense._meta). float64 is the
    # same-graph tests' precision, not a fast path.
    FP64_SUMS = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)
    _FP64_SUMS = tl.constexpr(FP64_SUMS)

    @triton.jit
    def _kept(States, threshold, r, live, cols):
        # Whether each (row r, column) weight of a tile is kept: the sparse
        # kernels' mask (sbm_pyg/ops/dropout.py), from the rows' stream
        # states (dropout_row_states) loaded here, each tile. A seed mixed
        # here instead held two registers across the key loop, which made
        # backward kernels at their register limit spill.
        state = tl.load(States + r, mask=live, other=0).to(tl.uint64)
        b = bits(state[:, None], cols[None, :] + 1)
        return (b >> 11) >= threshold.to(tl.uint64)

    @triton.jit
    def _keep_scale(threshold):
        # A kept weight's factor, 2^53 / (2^53 - t).
        return 9007199254740992.0 / (9007199254740992 - threshold).to(tl.float64)

    @triton.jit
    def _pair(TileSeq, TileRow, PtrA, PtrB):
        # The sequence of this program's tile, its first row, and the
        # sequence's bounds along the tiled side (A) and the other side (B).
        t = tl.program_id(0)
        g = tl.load(TileSeq + t)
        r0 = tl.load(TileRow + t)
        a0 = tl.load(PtrA + g)
        b0 = tl.load(PtrB + g)
        return (g, r0, a0, tl.load(PtrA + g + 1) - a0, b0,
                tl.load(PtrB + g + 1) - b0)

    @triton.jit
    def _load(Ptr, rows, live, cols, WIDTH: tl.constexpr):
        # Rows of a contiguous [*, WIDTH] matrix, zeros where not live.
        return tl.load(Ptr + rows[:, None] * WIDTH + cols[None, :],
                       mask=live[:, None] & (cols[None, :] < WIDTH), other=0.0)

    # The products' precision (DOT): the schema's codes (0 "ieee", 1
    # "tf32", 2 "bfloat16", 3 "float16"; sbm_pyg/ops/dense_attention.py)
    # and, for the mask's probabilities on tensor cores, 4: three-pass TF32.
    TF32X3 = 4
    # Triton's interpreter multiplies bfloat16 operands as their raw bits
    # (3.9: a product of order 1e10); there a bfloat16 product is taken as
    # the float32 product of the rounded operands, its exact value.
    _BF16_AS_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

    @triton.jit
    def _mm(a, b, DOT: tl.constexpr):
        # a [M, K] times b [K, N] in every kernel: tl.dot in float32 (or
        # float64) accumulators, its operands in the precision DOT; for
        # float64 under FP64_SUMS an elementwise sum of the products.
        # (One return after the if: Triton 3.6 compiles a statement after
        # a static branch's return too.)
        if _FP64_SUMS and a.dtype.is_fp64():
            out = tl.sum(a[:, :, None] * b[None, :, :], 1)
        elif DOT == 1:
            out = tl.dot(a, b, input_precision="tf32")
        elif DOT == 2:
            if _BF16_AS_FP32:
                out = tl.dot(a.to(tl.bfloat16).to(tl.float32),
                             b.to(tl.bfloat16).to(tl.float32),
                             input_precision="ieee")
            else:
                out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        elif DOT == 3:
            out = tl.dot(a.to(tl.float16), b.to(tl.float16))
        elif DOT == 4:
            out = tl.dot(a, b, input_precision="tf32x3")
        else:
            out = tl.dot(a, b, input_precision="ieee")
        return out

    @triton.jit
    def _bits(Mask, row_byte, j, live):
        # The mask's bits of rows (their first bytes row_byte) and keys j.
        byte = tl.load(Mask + row_byte[:, None] + (j >> 3)[None, :],
                       mask=live, other=0)
        shift = (j & 7).to(tl.int32)[None, :]
        return ((byte.to(tl.int32) >> shift) & 1) != 0

    # The sizes vary with every batch: not specialised on, so that one
    # compiled kernel serves them all.
    SIZES = ["Nq", "Nk", "G"]
    # The dropout's threshold changes from call to call. Its seed enters as
    # the query rows' stream states, computed on the device (DStates, read
    # only under DROP), so that a captured graph draws a new mask each
    # replay.
    DROPOUT = ["DThr"]

    @triton.jit(do_not_specialize=SIZES)
    def mask_kernel(QB, KM, PtrQ, PtrK, Base, TileSeq, TileRow, Mask, Seed,
                     Delta, Nq, Nk, G, KC: tl.constexpr,
                     BLOCK_KC: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
                     SELF_LOOPS: tl.constexpr, DOT: tl.constexpr):
        g, i0, qs, nq, ks, nk = _pair(TileSeq, TileRow, PtrQ, PtrK)
        if g < G:
            h = tl.program_id(1).to(tl.int64)
            il = i0 + tl.arange(0, BLOCK_M).to(tl.int64)
            live_q = il < nq
            r = h * Nq + qs + il  # the row's stream, as the CPU kernel's
            c = tl.arange(0, BLOCK_KC)
            qb = _load(QB, r, live_q, c, KC)
            state = stream(tl.load(Seed), r, 1)
            delta = tl.load(Delta)
            rb = (nk + 7) // 8
            row_byte = tl.load(Base + g) + (h * nq + il) * rb
            for j0 in range(0, nk, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N).to(tl.int64)
                live_k = j < nk
                km = _load(KM, h * Nk + ks + j, live_k, c, KC)
                p = _mm(qb, tl.trans(km), DOT)
                pj = p.to(tl.float64) + delta
                if EXACT:
                    prob = tl.minimum(pj, 1.0)
                else:
                    prob = one_minus_exp(pj)
                u = uniform(state[:, None], (j + 1)[None, :])
                on = (u < prob) & live_k[None, :]
                if SELF_LOOPS:
                    on = on | (((qs + il)[:, None] == (ks + j)[None, :])
                               & live_k[None, :])
                bit = on.to(tl.int32) << (j & 7).to(tl.int32)[None, :]
                byte = tl.sum(tl.reshape(bit, [BLOCK_M, BLOCK_N // 8, 8]), 2)
                jb = j0 // 8 + tl.arange(0, BLOCK_N // 8)
                tl.store(Mask + row_byte[:, None] + jb[None, :],
                         byte.to(tl.uint8),
                         mask=live_q[:, None] & (jb[None, :] < rb))

    @triton.jit(do_not_specialize=SIZES + DROPOUT)
    def forward_kernel(Q, K, V, Mask, PtrQ, PtrK, Base, TileSeq, TileRow,
                        Scale, Out, Lse, Count, Nq, Nk, G, DStates,
                        DThr: tl.int64, D: tl.constexpr,
                        DV: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, DROP: tl.constexpr,
                        DOT: tl.constexpr):
        g, i0, qs, nq, ks, nk = _pair(TileSeq, TileRow, PtrQ, PtrK)
        if g < G:
            h = tl.program_id(1).to(tl.int64)
            il = i0 + tl.arange(0, BLOCK_M).to(tl.int64)
            live_q = il < nq
            r = h * Nq + qs + il
            d = tl.arange(0, BLOCK_D)
            dv = tl.arange(0, BLOCK_DV)
            q = _load(Q, r, live_q, d, D)
            scale = tl.load(Scale)
            row_byte = tl.load(Base + g) + (h * nq + il) * ((nk + 7) // 8)
            m = tl.full([BLOCK_M], float("-inf"), q.dtype)
            norm = tl.zeros([BLOCK_M], q.dtype)
            acc = tl.zeros([BLOCK_M, BLOCK_DV], q.dtype)
            count = tl.zeros([BLOCK_M], tl.int32)
            for j0 in range(0, nk, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N).to(tl.int64)
                live_k = j < nk
                cols = h * Nk + ks + j
                k = _load(K, cols, live_k, d, D)
                on = _bits(Mask, row_byte, j, live_q[:, None] & live_k[None, :])
                count += tl.sum(on.to(tl.int32), 1)
                s = _mm(q, tl.trans(k), DOT) * scale
                s = tl.where(on, s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, 1))
                # A row without an edge so far keeps m = -inf: shift by 0.
                shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.exp(s - shift[:, None])
                rescale = tl.exp(m - shift)
                v = _load(V, cols, live_k, dv, DV)
                w = p
                if DROP:  # the output takes the kept weights, the norm all
                    w = tl.where(_kept(DStates, DThr, r, live_q, cols),
                                 p * _keep_scale(DThr).to(p.dtype), 0.0)
                acc = acc * rescale[:, None] + _mm(w, v, DOT)
                norm = norm * rescale + tl.sum(p, 1)
                m = m_new
            has = norm > 0
            safe = tl.where(has, norm, 1.0)
            out = tl.where(has[:, None], acc / safe[:, None], 0.0)
            tl.store(Out + r[:, None] * DV + dv[None, :], out,
                     mask=live_q[:, None] & (dv[None, :] < DV))
            tl.store(Lse + r, tl.where(has, m + tl.log(safe), float("-inf")),
                     mask=live_q)
            tl.store(Count + r, count, mask=live_q)

    @triton.jit
    def _query_rows(Q, GradOut, Lse, Delta, r, live, d, dv, D: tl.constexpr,
                    DV: tl.constexpr):
        # What backward reads of query rows r: q, the output's gradient, the
        # log-sum-exp and rowsum(dOut * out).
        return (_load(Q, r, live, d, D), _load(GradOut, r, live, dv, DV),
                tl.load(Lse + r, mask=live, other=0.0),
                tl.load(Delta + r, mask=live, other=0.0))

    @triton.jit
    def _grad_tile(q, k, v, do, lse, delta, on, scale, States, threshold, r,
                   live_q, cols, STE: tl.constexpr, DROP: tl.constexpr,
                   DOT: tl.constexpr):
        # Returns the weights dV takes (A o keep under dropout), ds and
        # the estimator's gradient.
        s = _mm(q, tl.trans(k), DOT) * scale
        a = tl.where(on, tl.exp(tl.minimum(s - lse[:, None], 0.0)), 0.0)
        da = _mm(do, tl.trans(v), DOT)
        if DROP:  # computed here, late: fewer registers live at once
            kept = _kept(States, threshold, r, live_q, cols)
            factor = _keep_scale(threshold).to(da.dtype)
            da = tl.where(kept, da * factor, 0.0)
            ds = a * (da - delta[:, None])
            a = tl.where(kept, a * factor, 0.0)
        else:
            ds = a * (da - delta[:, None])
        if STE == 1:
            gr = ds * s
        else:
            gr = tl.minimum(tl.maximum(ds, -1.0), 1.0)
        return a, ds, tl.where(on, gr, 0.0)

    @triton.jit(do_not_specialize=SIZES + DROPOUT)
    def backward_query_kernel(Q, K, V, QB, KM, GradOut, Lse, Delta, Mask,
                               PtrQ, PtrK, Base, TileSeq, TileRow, Scale,
                               GradQ, GradQB, Nq, Nk, G, DStates,
                               DThr: tl.int64, D: tl.constexpr,
                               DV: tl.constexpr, KC: tl.constexpr,
                               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                               BLOCK_KC: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, STE: tl.constexpr,
                               DROP: tl.constexpr, DOT: tl.constexpr):
        g, i0, qs, nq, ks, nk = _pair(TileSeq, TileRow, PtrQ, PtrK)
        if g < G:
            h = tl.program_id(1).to(tl.int64)
            il = i0 + tl.arange(0, BLOCK_M).to(tl.int64)
            live_q = il < nq
            r = h * Nq + qs + il
            d = tl.arange(0, BLOCK_D)
            dv = tl.arange(0, BLOCK_DV)
            c = tl.arange(0, BLOCK_KC)
            q, do, lse, delta = _query_rows(Q, GradOut, Lse, Delta, r, live_q, d,
                                              dv, D, DV)
            scale = tl.load(Scale)
            row_byte = tl.load(Base + g) + (h * nq + il) * ((nk + 7) // 8)
            dq = tl.zeros([BLOCK_M, BLOCK_D], q.dtype)
            dqb = tl.zeros([BLOCK_M, BLOCK_KC], q.dtype)
            for j0 in range(0, nk, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N).to(tl.int64)
                live_k = j < nk
                cols = h * Nk + ks + j
                on = _bits(Mask, row_byte, j, live_q[:, None] & live_k[None, :])
                k = _load(K, cols, live_k, d, D)
                a, ds, gr = _grad_tile(q, k, _load(V, cols, live_k, dv, DV),
                                       do, lse, delta, on, scale, DStates, DThr,
                                       r, live_q, cols, STE, DROP, DOT)
                dq += _mm(ds, k, DOT)
                if STE != 0:
                    dqb += _mm(gr, _load(KM, cols, live_k, c, KC), DOT)
            tl.store(GradQ + r[:, None] * D + d[None, :], dq * scale,
                     mask=live_q[:, None] & (d[None, :] < D))
            if STE != 0:
                tl.store(GradQB + r[:, None] * KC + c[None, :], dqb,
                         mask=live_q[:, None] & (c[None, :] < KC))

    @triton.jit(do_not_specialize=SIZES + DROPOUT)
    def backward_key_kernel(Q, K, V, QB, KM, GradOut, Lse, Delta, Mask,
                             PtrQ, PtrK, Base, TileSeq, TileRow, Scale,
                             GradK, GradV, GradKM, Nq, Nk, G, DStates,
                             DThr: tl.int64, D: tl.constexpr,
                             DV: tl.constexpr, KC: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                             BLOCK_KC: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, STE: tl.constexpr,
                             DROP: tl.constexpr, DOT: tl.constexpr):
        # Tiles of keys (PtrK first), walking the sequence's query tiles.
        g, j0, ks, nk, qs, nq = _pair(TileSeq, TileRow, PtrK, PtrQ)
        if g < G:
            h = tl.program_id(1).to(tl.int64)
            j = j0 + tl.arange(0, BLOCK_N).to(tl.int64)
            live_k = j < nk
            cols = h * Nk + ks + j
            d = tl.arange(0, BLOCK_D)
            dv = tl.arange(0, BLOCK_DV)
            c = tl.arange(0, BLOCK_KC)
            k = _load(K, cols, live_k, d, D)
            v = _load(V, cols, live_k, dv, DV)
            scale = tl.load(Scale)
            rb = (nk + 7) // 8
            base = tl.load(Base + g) + h * nq * rb
            dk = tl.zeros([BLOCK_N, BLOCK_D], k.dtype)
            dvv = tl.zeros([BLOCK_N, BLOCK_DV], k.dtype)
            dkm = tl.zeros([BLOCK_N, BLOCK_KC], k.dtype)
            for i0 in range(0, nq, BLOCK_M):
                il = i0 + tl.arange(0, BLOCK_M).to(tl.int64)
                live_q = il < nq
                r = h * Nq + qs + il
                q, do, lse, delta = _query_rows(Q, GradOut, Lse, Delta, r, live_q, d,
                                                  dv, D, DV)
                on = _bits(Mask, base + il * rb, j,
                           live_q[:, None] & live_k[None, :])
                a, ds, gr = _grad_tile(q, k, v, do, lse, delta, on, scale,
                                       DStates, DThr, r, live_q, cols, STE, DROP, DOT)
                dvv += _mm(tl.trans(a), do, DOT)
                dk += _mm(tl.trans(ds), q, DOT)
                if STE != 0:
                    dkm += _mm(tl.trans(gr), _load(QB, r, live_q, c, KC),
                                DOT)
            live = live_k[:, None]
            tl.store(GradK + cols[:, None] * D + d[None, :], dk * scale,
                     mask=live & (d[None, :] < D))
            tl.store(GradV + cols[:, None] * DV + dv[None, :], dvv,
                     mask=live & (dv[None, :] < DV))
            if STE != 0:
                tl.store(GradKM + cols[:, None] * KC + c[None, :], dkm,
                         mask=live & (c[None, :] < KC))
