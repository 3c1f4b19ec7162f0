r"""The Triton kernels of the CUDA sampler
(:mod:`~sbm_pyg.sampling.fastrg_triton` launches them and describes the
work): the plan's per-row degrees, the key tables (quantised weights and
their guide), the draws, the merge (sort or bitmap, thinning, forced keys)
and the CSR's columns (the key masses' are
:mod:`~sbm_pyg.sampling.key_masses`'). Every kernel draws from the rows'
counter-based streams (:mod:`~sbm_pyg.ops.triton_streams`) at the C++
kernel's counters."""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

__all__ = ["plan_kernel", "weight_kernel", "guide_kernel", "draw_kernel",
           "merge_kernel", "graph_kernel"]

if triton is not None:
    from sbm_pyg.ops.triton_streams import (
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

    @triton.jit
    def _lanes(N, width, BLOCK: tl.constexpr):
        # This program's lanes e and whether e < N, with e split as
        # (e // width, e % width).
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        return e, e < N, e // width, e % width

    @triton.jit
    def _row(r, Nq, Seq, PtrK):
        # Row r = (h, i): its head, query, sequence, the sequence's first
        # key and its number of keys.
        i = r % Nq
        g = tl.load(Seq + i).to(tl.int64)
        ks = tl.load(PtrK + g)
        return r // Nq, i, g, ks, tl.load(PtrK + g + 1) - ks

    @triton.jit(do_not_specialize=["seed", "R", "Nq"])
    def plan_kernel(W, Mass, MaxK, Seq, PtrK, Degree, Inflation, Mu,
                     seed: tl.int64, delta: tl.float64, threshold: tl.float64,
                     R, Nq, H: tl.constexpr, K: tl.constexpr,
                     BLOCK_R: tl.constexpr, EXACT: tl.constexpr):
        # One row per thread: each sums its k clusters in order (the C++
        # kernel's order) and draws its own degree; nothing is replicated.
        r, live, h, i = _lanes(R, Nq, BLOCK_R)
        g = tl.load(Seq + i, mask=live, other=0).to(tl.int64)
        nk = (tl.load(PtrK + g + 1, mask=live, other=0)
              - tl.load(PtrK + g, mask=live, other=0))
        gh = (g * H + h) * K
        lam = delta * nk.to(tl.float64)
        bound = tl.zeros([BLOCK_R], tl.float64) + delta
        for v in range(K):
            w = tl.load(W + r * K + v, mask=live, other=0.0).to(tl.float64)
            lam += w * tl.load(Mass + gh + v, mask=live, other=0.0)
            if EXACT:
                bound += w * tl.load(MaxK + gh + v, mask=live, other=0.0)
        c = tl.full([BLOCK_R], 1.0, tl.float64)
        if EXACT:
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
        # The outputs are padded to whole blocks: unmasked stores keep the
        # row mask from living across poisson's division calls (ptxas
        # saved it on the stack).
        tl.store(Degree + r, d)
        tl.store(Inflation + r, c)
        tl.store(Mu + r, mu)

    @triton.jit(do_not_specialize=["Nk", "N"])
    def weight_kernel(Z, Scale, SeqK, Table, Nk, N, H: tl.constexpr,
                       K: tl.constexpr, BLOCK: tl.constexpr):
        # Table[(h K + v) Nk + j] = floor(Z[j, h, v] * Scale[g(j), h, v]),
        # one entry per lane (the C++ kernel's key_weight).
        e, live, t, j = _lanes(N, Nk, BLOCK)
        g = tl.load(SeqK + j, mask=live, other=0).to(tl.int64)
        z = tl.load(Z + j * (H * K) + t, mask=live, other=0.0).to(tl.float64)
        scale = tl.load(Scale + g * (H * K) + t, mask=live, other=0.0)
        tl.store(Table + e, tl.floor(z * scale).to(tl.int64), mask=live)

    @triton.jit
    def _cum_at(Table, row, j, first, mask):
        # A table's cumulative weight at global key j, relative to its
        # sequence (the entry before it, `first`, is subtracted).
        return tl.load(Table + row + j, mask=mask, other=0) - first

    @triton.jit(do_not_specialize=["Nk", "N"])
    def guide_kernel(Table, SeqK, PtrK, Guide, Nk, N, BLOCK: tl.constexpr):
        # Guide[e] for bucket b = j - ks of its table: the first key whose
        # cumulative weight exceeds a lower bound of floor(b T / n), by a
        # binary search over the sequence's keys (lanes are entries).
        e, live, t, j = _lanes(N, Nk, BLOCK)
        row = t * Nk
        g = tl.load(SeqK + j, mask=live, other=0).to(tl.int64)
        ks = tl.load(PtrK + g, mask=live, other=0)
        n = tl.load(PtrK + g + 1, mask=live, other=1) - ks
        first = tl.load(Table + row + ks - 1, mask=live & (ks > 0), other=0)
        total = _cum_at(Table, row, ks + n - 1, first, live)
        b = j - ks
        # A lower bound with a margin, as the C++ kernel's bucket_floor.
        y = b.to(tl.float64) * total.to(tl.float64) / n.to(tl.float64)
        bound = tl.maximum((y * (1.0 - 1e-12)).to(tl.int64) - 1, 0)
        lo = ks
        hi = ks + n - 1
        todo = live & (total > 0) & (lo < hi)
        while tl.max(todo.to(tl.int32), 0) > 0:
            mid = (lo + hi) // 2
            above = _cum_at(Table, row, mid, first, todo) > bound
            hi = tl.where(todo & above, mid, hi)
            lo = tl.where(todo & ~above, mid + 1, lo)
            todo = todo & (lo < hi)
        tl.store(Guide + e, lo.to(tl.int32), mask=live)

    @triton.jit(do_not_specialize=["seed", "Nq", "Nk"])
    def draw_kernel(W, Z, Mass, Seq, PtrK, Degree, Offset, Table, Guide, Out,
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
            h, i, g, ks, nk = _row(r, Nq, Seq, PtrK)
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
                nk64 = nk.to(tl.uint64)
                for t0 in range(0, d, BLOCK_D):
                    tt = t0 + t
                    m = tt < d
                    u = uniform(state, 2 * tt + 1)
                    below = (cum[None, :] <= (u * total)[:, None]) & (v[None, :] < K)
                    c = tl.minimum(tl.sum(below.to(tl.int64), 1), last)
                    # The word's high bits pick the bucket (and the
                    # exploration's key), its product with the table's total
                    # the target weight.
                    word = bits(state, 2 * tt + 2)
                    bucket = tl.umulhi(word, nk64).to(tl.int64)
                    drawn = m & (c < K)
                    row = (h * K + c) * Nk
                    first = tl.load(Table + row + ks - 1,
                                    mask=drawn & (row * 0 + ks > 0), other=0)
                    total_c = _cum_at(Table, row, ks + nk - 1, first, drawn)
                    target = tl.umulhi(word, total_c.to(tl.uint64)).to(tl.int64)
                    j = tl.load(Guide + row + ks + bucket, mask=drawn,
                                other=0).to(tl.int64)
                    walk = drawn & (_cum_at(Table, row, j, first, drawn) <= target)
                    while tl.max(walk.to(tl.int32), 0) > 0:
                        j = tl.where(walk, j + 1, j)
                        walk = walk & (_cum_at(Table, row, j, first, walk) <= target)
                    key = tl.where(c < K, j - ks, bucket)
                    tl.store(Out + base + tt, key.to(tl.int32), mask=m)

    @triton.jit
    def _accept(key, rank, live, state, d, c, W, Z, r, h, ks, delta,
                H: tl.constexpr, K: tl.constexpr, KC: tl.constexpr):
        # Exact mode: keeps the distinct drawn key of rank t in its row with
        # probability min(p, 1) / (1 - exp(-c p)) at counter 2 d + 1 + t; a
        # uniform below 1 / c keeps it without computing p (the C++
        # kernel's squeeze).
        # By products, as the C++ kernel compares: a division is a call
        # around which ptxas saved registers on the stack.
        u = uniform(state, 2 * d + 1 + rank)
        squeezed = u * c < 1.0
        test = live & ~squeezed
        p = tl.zeros(key.shape, tl.float64)
        zrow = ((ks + key) * H + h) * K
        for v0 in range(0, K, KC):
            v = v0 + tl.arange(0, KC)
            w = tl.load(W + r * K + v, mask=v < K, other=0.0)
            z = tl.load(Z + zrow[:, None] + v[None, :],
                        mask=test[:, None] & (v[None, :] < K), other=0.0)
            p += tl.sum(z * w[None, :], 1).to(tl.float64)
        p = p + delta
        cp = tl.where(test, c * p, 1.0)
        accept = (p > 0.0) & (u * one_minus_exp(cp) < tl.minimum(p, 1.0))
        return live & (squeezed | accept)

    @triton.jit
    def _bitmap_keys(Buf, at, w0, words, BLOCK_W: tl.constexpr):
        # The keys of BLOCK_W bitmap words from word w0, in order, and
        # whether each is set.
        wi = w0 + tl.arange(0, BLOCK_W)
        word = tl.load(Buf + at + wi, mask=wi < words, other=0)
        bit = tl.arange(0, 32)
        present = ((word[:, None] >> bit[None, :]) & 1) == 1
        key = wi[:, None] * 32 + bit[None, :]
        return (tl.reshape(key, [BLOCK_W * 32]),
                tl.reshape(present, [BLOCK_W * 32]))

    @triton.jit
    def _forced_key(IncCol, i0, f, nf, ks, selfkey):
        # The row's f-th forced key (local): its included keys, then the
        # self-loop (lanes f >= nf), as one list.
        inc = tl.load(IncCol + i0 + f, mask=(f >= 0) & (f < nf), other=0) - ks
        return tl.where(f < nf, inc, selfkey)

    @triton.jit(do_not_specialize=["seed", "Nq", "Nk"])
    def merge_kernel(Buf, Offset, Count, Degree, Inflation, W, Z, Seq, PtrK,
                      IncPtr, IncCol, seed: tl.int64, delta: tl.float64, Nq,
                      Nk, H: tl.constexpr, K: tl.constexpr, KC: tl.constexpr,
                      LOW: tl.constexpr, SORT: tl.constexpr,
                      OTHERS: tl.constexpr, SELF_LOOPS: tl.constexpr,
                      EXACT: tl.constexpr, BLOCK: tl.constexpr,
                      BLOCK_W: tl.constexpr):
        # One row per program: its sorted distinct kept keys (drawn, then
        # thinned, with the forced ones) at Buf[Offset[r]:], their number
        # at Count[r]. Rows with LOW < draws + forced <= SORT are sorted in
        # registers; with OTHERS, the dense rows and the rows above SORT
        # instead (a launch of its own: their registers would spill beside
        # the largest sort's).
        r = tl.program_id(0).to(tl.int64)
        d = tl.load(Degree + r)
        h, i, _, ks, nk = _row(r, Nq, Seq, PtrK)
        i0 = tl.load(IncPtr + i)
        nf = tl.load(IncPtr + i + 1) - i0
        nforced = nf + (1 if SELF_LOOPS else 0)
        n = d + nforced
        selfkey = i - ks
        base = tl.load(Offset + r)
        state = stream(seed, r, 1)
        c = tl.load(Inflation + r)
        if (not OTHERS) and (nk > 0) & (d >= 0) & (n > LOW) & (n <= SORT):
            # Draws tagged odd (2j + 1), forced keys even (2j): sorted, a
            # key's forced copies come first and its draws after.
            t = tl.arange(0, SORT).to(tl.int64)
            drawn = t < d
            forced = (t >= d) & (t < n)
            x = tl.load(Buf + base + t, mask=drawn, other=0).to(tl.int64)
            y = _forced_key(IncCol, i0, t - d, nf, ks, selfkey)
            val = tl.where(drawn, 2 * x + 1, tl.where(forced, 2 * y, 2 * nk + 2))
            val = tl.sort(val)
            prev = tl.gather(val, tl.maximum(t - 1, 0), 0)
            nxt = tl.gather(val, tl.minimum(t + 1, SORT - 1), 0)
            valid = val < 2 * nk
            first = valid & ((val & 1) == 1) & ((t == 0) | (prev != val))
            keep = first
            if EXACT:
                forced = (t > 0) & (prev == val - 1)  # a forced copy
                rank = tl.cumsum(first.to(tl.int64), 0) - 1
                keep = first & (forced | _accept(val // 2, rank, first, state, d,
                                                 c, W, Z, r, h, ks, delta,
                                                 H, K, KC))
            alone = (valid & ((val & 1) == 0)
                     & ((t == SORT - 1) | (nxt // 2 != val // 2)))
            out = keep | alone
            pos = tl.cumsum(out.to(tl.int64), 0) - out.to(tl.int64)
            tl.debug_barrier()
            tl.store(Buf + base + pos, (val // 2).to(tl.int32), mask=out)
            tl.store(Count + r, tl.sum(out.to(tl.int64), 0))
        if OTHERS:
            # Both kinds of row in one pass, each loop running zero times
            # for the other kind: no barrier sits in a branch (ptxas saved
            # registers on the stack around barriers in branches).
            lanes = tl.arange(0, BLOCK).to(tl.int64)
            dense = (nk > 0) & (d < 0)
            bitmap = (nk > 0) & (d >= 0) & (n > SORT)
            # Dense: the trials are j or -1 in key order; the forced keys
            # are marked, then the row is compacted in place.
            nd = tl.where(dense, nk, 0)
            for f0 in range(0, tl.where(dense, nforced, 0), BLOCK):
                f = f0 + lanes
                j = _forced_key(IncCol, i0, f, nf, ks, selfkey)
                tl.store(Buf + base + j, j.to(tl.int32), mask=f < nforced)
            tl.debug_barrier()
            kept = tl.zeros([], tl.int64)
            for j0 in range(0, nd, BLOCK):
                j = j0 + lanes
                x = tl.load(Buf + base + j, mask=j < nd, other=-1)
                on = (x >= 0).to(tl.int64)
                pos = kept + tl.cumsum(on, 0) - on
                tl.debug_barrier()
                tl.store(Buf + base + pos, x, mask=on > 0)
                kept += tl.sum(on, 0)
            # Bitmap: the row's keys after its output slots; the draws set
            # bits, exact mode clears the rejected ones, the forced keys
            # set theirs, and the set bits are written out in key order.
            at = base + n
            words = tl.where(bitmap, (nk + 31) // 32, 0)
            for t0 in range(0, tl.where(bitmap, d, 0), BLOCK):
                t = t0 + lanes
                x = tl.load(Buf + base + t, mask=t < d, other=0)
                tl.atomic_or(Buf + at + x // 32, 1 << (x % 32), mask=t < d)
            tl.debug_barrier()
            if EXACT:
                seen = tl.zeros([], tl.int64)
                for w0 in range(0, words, BLOCK_W):
                    key, on = _bitmap_keys(Buf, at, w0, words, BLOCK_W)
                    on64 = on.to(tl.int64)
                    rank = seen + tl.cumsum(on64, 0) - on64
                    keep = _accept(key.to(tl.int64), rank, on, state, d, c,
                                   W, Z, r, h, ks, delta, H, K, KC)
                    bit = tl.reshape(keep.to(tl.int64), [BLOCK_W, 32]) << \
                        tl.arange(0, 32)[None, :].to(tl.int64)
                    wi = w0 + tl.arange(0, BLOCK_W)
                    tl.store(Buf + at + wi, tl.sum(bit, 1).to(tl.uint32)
                             .to(tl.int32, bitcast=True), mask=wi < words)
                    seen += tl.sum(on64, 0)
                tl.debug_barrier()
            for f0 in range(0, tl.where(bitmap, nforced, 0), BLOCK):
                f = f0 + lanes
                j = _forced_key(IncCol, i0, f, nf, ks, selfkey)
                tl.atomic_or(Buf + at + j // 32, (1 << (j % 32)).to(tl.int32),
                             mask=f < nforced)
            tl.debug_barrier()
            for w0 in range(0, words, BLOCK_W):
                key, on = _bitmap_keys(Buf, at, w0, words, BLOCK_W)
                on64 = on.to(tl.int64)
                pos = kept + tl.cumsum(on64, 0) - on64
                tl.store(Buf + base + pos, key, mask=on)
                kept += tl.sum(on64, 0)
            tl.store(Count + r, kept, mask=dense | bitmap)

    @triton.jit(do_not_specialize=["Nq", "Nk"])
    def graph_kernel(Buf, Offset, RowPtr, Seq, PtrK, Col, Nq, Nk,
                      BLOCK: tl.constexpr):
        # Row r's keys as the graph's columns h N_k + j at RowPtr[r].
        r = tl.program_id(0).to(tl.int64)
        start = tl.load(RowPtr + r)
        n = tl.load(RowPtr + r + 1) - start
        col0 = r // Nq * Nk + tl.load(PtrK + tl.load(Seq + r % Nq))
        base = tl.load(Offset + r)
        for t0 in range(0, n, BLOCK):
            t = t0 + tl.arange(0, BLOCK)
            key = tl.load(Buf + base + t, mask=t < n, other=0)
            tl.store(Col + start + t, (key + col0).to(tl.int32), mask=t < n)
