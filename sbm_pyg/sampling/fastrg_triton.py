r"""The CUDA kernels of the sampler operators ``sbm_pyg::fastrg_plan`` and
``sbm_pyg::fastrg_sample`` (:mod:`~sbm_pyg.sampling.fastrg_op`), in Triton:
the C++ kernel's query-major algorithm on the GPU, with the same random
stream.

Each :math:`(h, i)` row draws its Poisson degree :math:`\mathrm{Poisson}(c
\lambda_i)` (inversion below a mean of 10, Hörmann's PTRS above), picks each
draw's key cluster from the weights :math:`(\mathbf{Y}_i \mathbf{B})_v s^Z_v`
and its key from the alias table of :math:`(g, h, v)`, and the duplicates
of a row are merged; exact mode thins the distinct keys with the row's own
bound and squeeze, and a row whose expected draws reach
:data:`~sbm_pyg.sampling.fastrg_op.DENSE_ROW_THRESHOLD` (shared) of its keys
tests every key with one Bernoulli. Every row reads the C++ kernel's SplitMix64
stream at the same counters, and the alias tables are built by the same
sweep with the same floating-point operations, so one seed gives the same
graph on both backends up to floating-point ties (sums in another order,
another :math:`\exp`: a draw that falls within an ulp of a boundary).

Where the GPU asks for another shape of work, the result is the same:

* a draw's cluster is found by comparing its uniform with all :math:`k`
  cumulative weights (the C++ kernel starts from a guide table and walks);
* duplicates are merged by one sort of all rows' keys (the C++ kernel sorts
  or marks a bitmap per row); the thinning then reads each distinct key's
  rank in its row, which fixes its counter in the stream;
* each alias table is built by one program (the sweep is sequential).

Four kernels: plan (degrees, inflation), alias tables, draws (sparse and
dense rows), thinning; :func:`plan` launches the first, :func:`sample` the
others. Without a GPU they run under Triton's interpreter
(``TRITON_INTERPRET=1``) on CPU tensors, as the twin operators
``sbm_pyg::triton_fastrg_*``, which is how the tests compare them with the
C++ kernel edge by edge.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

from sbm_pyg.sampling.edges import csr_from_keys, sorted_unique
from sbm_pyg.sampling.fastrg_torch import sequence_max, with_forced_keys

__all__ = ["plan", "sample"]

# Block sizes that keep the [block, k] float64 tiles in registers at k = 128
# (benchmarks/triton_compile.py reports registers and spills).
BLOCK_ROWS = 8
BLOCK_DRAWS = 16
BLOCK_EDGES = 16
# No fused multiply-adds: the C++ kernel's floating-point operations are
# rounded one by one, and the same graph needs the same roundings.
NO_FUSION = dict(enable_fp_fusion=False)


if triton is not None:
    from sbm_pyg.sampling.triton_streams import (
        bits,
        one_minus_exp,
        poisson,
        stream,
        uniform,
    )

    # The scalar arguments' types are fixed where their values vary: a
    # compiled kernel takes a Python float as fp32 unless it is annotated
    # (the interpreter keeps it exact), and an int as i32 or i64 by its
    # value. The seed, the sizes and the edge count change from call to
    # call and are not specialised (on divisibility by 16 or a value of 1),
    # which would compile a variant of the kernel for some calls only.

    @triton.jit(do_not_specialize=["seed", "R", "Nq"])
    def _plan_kernel(W, Mass, MaxK, Seq, PtrK, Degree, Inflation, Mu,
                     seed: tl.int64, delta: tl.float64, threshold: tl.float64,
                     R, Nq,
                     H: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_R: tl.constexpr, EXACT: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        live = r < R
        h = r // Nq
        i = r % Nq
        g = tl.load(Seq + i, mask=live, other=0).to(tl.int64)
        nk = (tl.load(PtrK + g + 1, mask=live, other=0)
              - tl.load(PtrK + g, mask=live, other=0))
        v = tl.arange(0, BLOCK_K)
        cell = live[:, None] & (v[None, :] < K)
        w = tl.load(W + r[:, None] * K + v[None, :], mask=cell,
                    other=0.0).to(tl.float64)
        gh = (g * H + h)[:, None] * K + v[None, :]
        s = tl.load(Mass + gh, mask=cell, other=0.0)
        lam = delta * nk.to(tl.float64) + tl.sum(w * s, 1)
        c = tl.full([BLOCK_R], 1.0, tl.float64)
        if EXACT:
            bound = delta + tl.sum(w * tl.load(MaxK + gh, mask=cell, other=0.0), 1)
            # c = -log1p(-P) / P, log1p by Goldberg's exact-rounding trick.
            P = tl.where((bound > 0.0) & (bound < 1.0), bound, 0.5)
            one_minus = 1.0 - P
            log1p = tl.where(one_minus == 1.0, -P,
                             tl.log(one_minus) * (-P)
                             / tl.where(one_minus == 1.0, 1.0, one_minus - 1.0))
            # 40: the C++ kernel's kMaxInflation.
            c = tl.where(bound >= 1.0, 40.0,
                         tl.where(bound > 0.0,
                                  tl.minimum(-log1p / P, 40.0), 1.0))
        mu = c * lam
        ok = live & (mu >= 0.0) & (mu < 1e300) & (nk > 0)
        dense = ok & (mu > 0.0) & (mu >= threshold * nk.to(tl.float64))
        state = stream(seed, r, 0)
        d = poisson(state, mu, ok & ~dense)
        d = tl.where(dense, -1, tl.where(ok, d, 0))
        tl.store(Degree + r, d, mask=live)
        tl.store(Inflation + r, c, mask=live)
        tl.store(Mu + r, mu, mask=live)

    @triton.jit
    def _load_q(Z, j, n, z_base, z_stride, scale):
        # q_j = Z_j * n / total, 0 past the end.
        return tl.load(Z + z_base + j * z_stride, mask=j < n,
                       other=0.0).to(tl.float64) * scale

    @triton.jit(do_not_specialize=["Nk"])
    def _alias_kernel(Z, PtrK, Prob, Alias, Nk,
                      H: tl.constexpr, K: tl.constexpr):
        # One (sequence, head, cluster) table per program: the C++ kernel's
        # sweep (sweep_alias in csrc/sampler/fastrg.cpp), operation for
        # operation.
        t = tl.program_id(0).to(tl.int64)
        g = t // (H * K)
        h = t // K % H
        v = t % K
        ks = tl.load(PtrK + g)
        n = tl.load(PtrK + g + 1) - ks
        z_base = (ks * H + h) * K + v
        z_stride = H * K
        out = (h * K + v) * Nk + ks
        total = tl.zeros([], tl.float64)
        j = tl.zeros([], tl.int64)
        while j < n:
            total += tl.load(Z + z_base + j * z_stride).to(tl.float64)
            j += 1
        if total > 0.0:
            scale = n.to(tl.float64) / total
            i = tl.zeros([], tl.int64)
            while (i < n) & (_load_q(Z, i, n, z_base, z_stride, scale) >= 1.0):
                i += 1
            j = tl.zeros([], tl.int64)
            while (j < n) & (_load_q(Z, j, n, z_base, z_stride, scale) < 1.0):
                j += 1
            w = _load_q(Z, j, n, z_base, z_stride, scale)
            while j < n:
                if w < 1.0:
                    nxt = j + 1
                    while (nxt < n) & (_load_q(Z, nxt, n, z_base, z_stride,
                                               scale) < 1.0):
                        nxt += 1
                    if nxt < n:
                        tl.store(Prob + out + j, w.to(tl.float32))
                        tl.store(Alias + out + j, (ks + nxt).to(tl.int32))
                        w = _load_q(Z, nxt, n, z_base, z_stride, scale) - (1.0 - w)
                    j = nxt
                else:
                    if i < n:
                        qi = _load_q(Z, i, n, z_base, z_stride, scale)
                        tl.store(Prob + out + i, qi.to(tl.float32))
                        tl.store(Alias + out + i, (ks + j).to(tl.int32))
                        w -= 1.0 - qi
                        i += 1
                        while (i < n) & (_load_q(Z, i, n, z_base, z_stride,
                                                 scale) >= 1.0):
                            i += 1
                    else:
                        j = n

    @triton.jit(do_not_specialize=["seed", "Nq", "Nk"])
    def _draw_kernel(W, Z, Mass, Seq, PtrK, Degree, Offset, Prob, Alias, Out,
                     seed: tl.int64, delta: tl.float64, Nq, Nk,
                     H: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_D: tl.constexpr, EXACT: tl.constexpr,
                     EXPLORE: tl.constexpr):
        # One (head, query) row per program: its draws' local keys, or for a
        # dense row each key's local index if kept and -1 if not, written
        # at Out[Offset[r]:].
        r = tl.program_id(0).to(tl.int64)
        d = tl.load(Degree + r)
        if d != 0:
            h = r // Nq
            i = r % Nq
            g = tl.load(Seq + i).to(tl.int64)
            ks = tl.load(PtrK + g)
            nk = tl.load(PtrK + g + 1) - ks
            base = tl.load(Offset + r)
            state = stream(seed, r, 1)
            v = tl.arange(0, BLOCK_K)
            w = tl.load(W + r * K + v, mask=v < K, other=0.0)
            t = tl.arange(0, BLOCK_D).to(tl.int64)
            if d < 0:  # dense: one Bernoulli per key
                for j0 in range(0, nk, BLOCK_D):
                    j = j0 + t
                    m = j < nk
                    z = tl.load(Z + ((ks + j) * H + h)[:, None] * K + v[None, :],
                                mask=m[:, None] & (v[None, :] < K), other=0.0)
                    p = tl.sum(z * w[None, :], 1).to(tl.float64) + delta
                    if EXACT:
                        prob = tl.minimum(p, 1.0)
                    else:
                        prob = one_minus_exp(p)
                    u = uniform(state, j + 1)
                    tl.store(Out + base + j, tl.where(u < prob, j, -1).to(tl.int32),
                             mask=m)
            else:
                s = tl.load(Mass + (g * H + h) * K + v, mask=v < K, other=0.0)
                x = w.to(tl.float64) * s
                cum = tl.cumsum(x, 0)
                last = tl.max(tl.where(x > 0.0, v, 0), 0)
                total = tl.sum(x, 0)
                if EXPLORE:
                    total = total + delta * nk.to(tl.float64)
                    last = K
                table = (h * K) * Nk + ks
                for t0 in range(0, d, BLOCK_D):
                    tt = t0 + t
                    m = tt < d
                    u = uniform(state, 2 * tt + 1)
                    below = (cum[None, :] <= (u * total)[:, None]) & (v[None, :] < K)
                    c = tl.minimum(tl.sum(below.to(tl.int64), 1), last)
                    word = bits(state, 2 * tt + 2)
                    nk64 = nk.to(tl.uint64)
                    slot = tl.umulhi(word, nk64).to(tl.int64)
                    frac = ((word * nk64) >> 11).to(tl.float64) * 1.1102230246251565e-16
                    drawn = m & (c < K)
                    entry = table + c * Nk + slot
                    prob = tl.load(Prob + entry, mask=drawn, other=1.0)
                    alias = tl.load(Alias + entry, mask=drawn, other=0).to(tl.int64)
                    key = tl.where(frac < prob.to(tl.float64), slot, alias - ks)
                    tl.store(Out + base + tt, key.to(tl.int32), mask=m)

    @triton.jit(do_not_specialize=["seed", "E", "Nq", "Nk"])
    def _thin_kernel(Key, RowStart, W, Z, Degree, Inflation, Keep,
                     seed: tl.int64, delta: tl.float64, E, Nq, Nk,
                     H: tl.constexpr, K: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
        # Exact mode: keeps each distinct drawn key of a sparse row with
        # probability min(p, 1) / (1 - exp(-c p)); a uniform below 1 / c
        # keeps it without computing p (the C++ kernel's squeeze). The
        # t-th distinct key of a row reads counter 2 d + 1 + t.
        e = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
        live = e < E
        key = tl.load(Key + e, mask=live, other=0)
        r = key // Nk
        j = key % Nk
        d = tl.load(Degree + r, mask=live, other=0)
        sparse = live & (d > 0)
        rank = e - tl.load(RowStart + r, mask=live, other=0)
        c = tl.load(Inflation + r, mask=sparse, other=1.0)
        u = uniform(stream(seed, r, 1), 2 * d + 1 + rank)
        squeezed = u < 1.0 / c
        test = sparse & ~squeezed
        h = r // Nq
        v = tl.arange(0, BLOCK_K)
        cell = test[:, None] & (v[None, :] < K)
        w = tl.load(W + r[:, None] * K + v[None, :], mask=cell, other=0.0)
        z = tl.load(Z + (j * H + h)[:, None] * K + v[None, :], mask=cell,
                    other=0.0)
        p = tl.sum(w * z, 1).to(tl.float64) + delta
        cp = tl.where(test, c * p, 1.0)
        accept = (p > 0.0) & (u < tl.minimum(p, 1.0) / one_minus_exp(cp))
        keep = ~sparse | squeezed | accept
        tl.store(Keep + e, keep.to(tl.int8), mask=live)


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
    Zd = Z.double()
    mass = torch.segment_reduce(Zd, "sum", offsets=ptr_k, axis=0,
                                unsafe=True).contiguous()  # [G, H, k]
    max_k = sequence_max(Zd, ptr_k).contiguous()
    del Zd
    degree = torch.empty(R, dtype=torch.long, device=device)
    inflation = torch.empty(R, dtype=torch.float64, device=device)
    mu = torch.empty(R, dtype=torch.float64, device=device)
    if R:
        _plan_kernel[(triton.cdiv(R, BLOCK_ROWS),)](
            W, mass, max_k, seq, ptr_k, degree, inflation, mu, seed,
            float(delta), float(threshold), R, Nq, H=H, K=k,
            BLOCK_K=triton.next_power_of_2(max(k, 1)), BLOCK_R=BLOCK_ROWS,
            EXACT=exact, **NO_FUSION)
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


def sample(W: Tensor, Z: Tensor, mass: Tensor, ptr_q: Tensor, ptr_k: Tensor,
           delta: float, exact: bool, seed: int, degree: Tensor,
           inflation: Tensor, self_loops: bool, inc_ptr: Tensor,
           inc_col: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The CUDA kernel of ``sbm_pyg::fastrg_sample``
    (:mod:`~sbm_pyg.sampling.fastrg_op` gives the contract): the graph's
    int32 CSR :obj:`(rowptr, col, perm, colptr)`."""
    H, Nq, k = W.shape
    Nk, device = Z.size(0), W.device
    G, R = ptr_q.numel() - 1, H * Nq
    seq, nk = _rows(ptr_q, ptr_k, H, Nq)
    slots = torch.where(degree < 0, nk, degree)
    offset = torch.cumsum(slots, 0)
    # The draw buffer's size (the caller's memory guard has checked it).
    num_draws = int(offset[-1]) if R else 0
    offset -= slots
    prob = torch.ones(H * k * Nk, dtype=torch.float32, device=device)
    alias = torch.arange(Nk, dtype=torch.int32, device=device).repeat(H * k)
    if G * H * k and bool((degree > 0).any()):
        _alias_kernel[(G * H * k,)](Z, ptr_k, prob, alias, Nk, H=H, K=k,
                                    **NO_FUSION)
    block_k = triton.next_power_of_2(max(k, 1))
    drawn = torch.empty(num_draws, dtype=torch.int32, device=device)
    if num_draws:
        _draw_kernel[(R,)](
            W, Z, mass, seq, ptr_k, degree, offset, prob, alias, drawn, seed,
            float(delta), Nq, Nk, H=H, K=k, BLOCK_K=block_k,
            BLOCK_D=BLOCK_DRAWS, EXACT=exact, EXPLORE=delta > 0, **NO_FUSION)
    del prob, alias, offset
    row = torch.repeat_interleave(torch.arange(R, device=device), slots,
                                  output_size=num_draws)
    ks = ptr_k[seq].repeat(H)  # [R]
    kept = drawn >= 0
    key = sorted_unique((row * Nk + ks[row] + drawn)[kept])
    del row, drawn, kept
    if exact and key.numel():
        row_start = torch.searchsorted(key, torch.arange(R, device=device) * Nk)
        keep = torch.empty(key.numel(), dtype=torch.int8, device=device)
        _thin_kernel[(triton.cdiv(key.numel(), BLOCK_EDGES),)](
            key, row_start, W, Z, degree, inflation, keep, seed,
            float(delta), key.numel(), Nq, Nk, H=H, K=k,
            BLOCK_K=block_k, BLOCK_E=BLOCK_EDGES, **NO_FUSION)
        key = key[keep.bool()]
    included = None
    if inc_ptr.numel():
        i = torch.repeat_interleave(torch.arange(Nq, device=device),
                                    inc_ptr.diff(), output_size=inc_col.numel())
        included = (i, inc_col)
    csr = csr_from_keys(with_forced_keys(key, included, self_loops, H, Nq, Nk),
                        H, Nq, Nk)
    return csr.rowptr, csr.col, csr.perm, csr.colptr
