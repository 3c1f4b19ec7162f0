r"""The sampler's random numbers on the GPU, as Triton device functions: each
row's counter-based SplitMix64 stream (the C++ kernel's ``Rng(seed, row,
purpose)`` in ``csrc/sampler/fastrg.cpp``), uniforms with 53 random bits
read at a counter, and Poisson draws (inversion below a mean of 10,
Hörmann's PTRS above). A kernel that reads a row's stream at the C++
kernel's counters draws the C++ kernel's numbers, on any device and with
any number of threads.

Each function is called inside a kernel (the sampler's,
:mod:`~sbm_pyg.sampling.fastrg_triton_kernels`, and the attention kernels'
dropout); integers wrap as uint64. Here in :mod:`sbm_pyg.ops`, which the
sampler builds on, so that the attention kernels need not import it.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

__all__ = ["mix64", "stream", "bits", "uniform", "one_minus_exp",
           "log_factorial", "poisson"]

if triton is not None:

    @triton.jit
    def mix64(z):
        # SplitMix64's finalizer (uint64, wrapping).
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    @triton.jit
    def stream(seed, row, purpose: tl.constexpr):
        # The initial state of row's stream (the C++ Rng(seed, row, purpose)).
        return mix64(seed.to(tl.uint64) ^ mix64(row.to(tl.uint64) * 4 + purpose
                                    + 0x632BE59BD9B4E019))

    @triton.jit
    def bits(state, n):
        # The n-th (1-based) 64-bit output of the stream: counter-based.
        return mix64(state + n.to(tl.uint64) * 0x9E3779B97F4A7C15)

    @triton.jit
    def uniform(state, n):
        # Uniform in [0, 1) with 53 random bits.
        return (bits(state, n) >> 11).to(tl.float64) * 1.1102230246251565e-16

    @triton.jit
    def one_minus_exp(x):
        # 1 - exp(-x) for x >= 0, accurate for small x (expm1). No
        # division: one is a call in SASS, around which ptxas saves
        # registers on the stack.
        series = x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0))))
        return tl.where(x < 1e-3, series, 1.0 - tl.exp(-x))

    @triton.jit
    def log_factorial(k):
        # log(k!) for k >= 0: Stirling's series at k + 9 >= 9 (error below
        # 1e-14), shifted down by the product of k + 1 .. k + 8.
        y = k + 9.0
        yi = 1.0 / y
        yi2 = yi * yi
        s = ((y - 0.5) * tl.log(y) - y + 0.91893853320467274
             + yi * (1.0 / 12.0 - yi2 * (1.0 / 360.0 - yi2 * (
                 1.0 / 1260.0 - yi2 / 1680.0))))
        prod = ((k + 1.0) * (k + 2.0) * (k + 3.0) * (k + 4.0)
                * (k + 5.0) * (k + 6.0) * (k + 7.0) * (k + 8.0))
        return s - tl.log(prod)

    @triton.jit
    def poisson(state, mu, live):
        # Poisson(mu) per lane where live (else 0), reading the stream from
        # counter 1: inversion below 10, PTRS (Hoermann 1993) above.
        zero = tl.zeros_like(mu).to(tl.int64)
        one = zero + 1
        small = live & (mu < 10.0)
        u = uniform(state, one)
        p = tl.exp(-tl.where(small, mu, 0.0))
        F = p
        x = zero
        active = small & (u > F)
        while tl.max(active.to(tl.int32), 0) > 0:
            x = tl.where(active, x + 1, x)
            p = tl.where(active, p * (mu / tl.maximum(x, 1).to(tl.float64)), p)
            F = tl.where(active, F + p, F)
            active = active & (u > F) & (p > 0.0) & (x < 1000)
        large = live & (mu >= 10.0)
        m = tl.where(large, mu, 10.0)
        slam = tl.sqrt(m)
        loglam = tl.log(m)
        b = 0.931 + 2.53 * slam
        a = -0.059 + 0.02483 * b
        inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
        vr = 0.9277 - 3.6224 / (b - 2.0)
        n = one
        todo = large
        while tl.max(todo.to(tl.int32), 0) > 0:
            U = uniform(state, n) - 0.5
            V = uniform(state, n + 1)
            n = n + 2
            us = 0.5 - tl.abs(U)
            kf = tl.floor((2.0 * a / us + b) * U + m + 0.43)
            quick = (us >= 0.07) & (V <= vr)
            skip = (kf < 0.0) | ((us < 0.013) & (V > us))
            kk = tl.maximum(kf, 0.0)
            slow = (tl.log(V) + tl.log(inv_alpha) - tl.log(a / (us * us) + b)
                    <= -m + kk * loglam - log_factorial(kk))
            accept = todo & (quick | (~skip & slow))
            x = tl.where(accept, kf.to(tl.int64), x)
            todo = todo & ~accept
        return x

