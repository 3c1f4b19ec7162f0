r"""The key clusters' masses :math:`s_v = \sum_j Z_{jv}` and maxima
:math:`\max_j Z_{jv}` of each sequence and head on the GPU: the CUDA
sampler's plan (:mod:`~sbm_pyg.sampling.fastrg_triton`) takes both, the
masses for each row's rate, the maxima for the exact mode's row bound and
the key tables' scale. Two Triton kernels: each piece of
:data:`PIECE_KEYS` keys of one sequence summed in float64 (and its
maximum taken) in key order, then each sequence's pieces in order; the
same sums on every call. Under ``TRITON_INTERPRET=1`` they run on CPU
tensors.
"""
from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: the PyTorch path is the fallback
    triton = None

__all__ = ["key_masses", "PIECE_KEYS"]

#: Keys of one piece of the first pass; its tiles' keys and columns (a
#: 32 x 64 float64 tile: 16 values a thread of its 4 warps).
PIECE_KEYS = 256
MASS_KEYS, MASS_COLUMNS = 32, 64

if triton is not None:

    @triton.jit(do_not_specialize=["P"])
    def piece_kernel(Z, Start, End, Partial, P, HK: tl.constexpr,
                     PIECE: tl.constexpr, BLOCK_J: tl.constexpr,
                     BLOCK_C: tl.constexpr):
        # The float64 sum and the maximum (at least 0) of each column of
        # Z [N_k, H k] over the keys of piece p ([Start[p], End[p])),
        # into Partial [2, P, H k]: the keys in order, BLOCK_J at a time.
        p = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        live_c = c < HK
        j0 = tl.load(Start + p)
        n = tl.load(End + p) - j0
        total = tl.zeros([BLOCK_C], tl.float64)
        top = tl.zeros([BLOCK_C], tl.float64)
        for j in range(0, PIECE, BLOCK_J):
            rows = j + tl.arange(0, BLOCK_J)
            live = (rows < n)[:, None] & live_c[None, :]
            z = tl.load(Z + (j0 + rows)[:, None] * HK + c[None, :], mask=live,
                        other=0.0).to(tl.float64)
            total += tl.sum(z, 0)
            top = tl.maximum(top, tl.max(z, 0))
        tl.store(Partial + p * HK + c, total, mask=live_c)
        tl.store(Partial + (P + p) * HK + c, top, mask=live_c)

    @triton.jit(do_not_specialize=["G", "P"])
    def mass_kernel(Partial, Pieces, Mass, G, P, HK: tl.constexpr,
                    BLOCK_C: tl.constexpr):
        # Each sequence's masses and maxima, Mass [2, G, H k], from its
        # pieces' (Pieces [G + 1]) in order: 0 for a sequence without keys.
        g = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        live_c = c < HK
        total = tl.zeros([BLOCK_C], tl.float64)
        top = tl.zeros([BLOCK_C], tl.float64)
        for p in range(tl.load(Pieces + g), tl.load(Pieces + g + 1)):
            total += tl.load(Partial + p * HK + c, mask=live_c, other=0.0)
            top = tl.maximum(top, tl.load(Partial + (P + p) * HK + c,
                                          mask=live_c, other=0.0))
        tl.store(Mass + g * HK + c, total, mask=live_c)
        tl.store(Mass + (G + g) * HK + c, top, mask=live_c)


def key_masses(Z: Tensor, ptr_k: Tensor) -> Tensor:
    r"""Each sequence's key cluster masses :math:`s_v = \sum_j Z_{jv}`
    (summed in float64) and maxima :math:`\max_j Z_{jv}` (at least 0),
    :obj:`[2, G, H, k]` from :obj:`Z [N_k, H, k]` and its pointer
    :obj:`ptr_k [G + 1]`; 0 for a sequence without keys.

    One pass over the keys, in pieces of :data:`PIECE_KEYS` keys of one
    sequence (their bound :math:`N_k / 256 + G` known without reading the
    device), then each sequence's pieces summed in order: the same sums on
    every call, and :math:`N_k / 256` times the programs of one per
    sequence."""
    Nk, H, k = Z.shape
    G, HK, device = ptr_k.numel() - 1, H * k, Z.device
    mass = torch.zeros(2, G, H, k, dtype=torch.float64, device=device)
    if not (G and HK):
        return mass
    P = Nk // PIECE_KEYS + G  # at least sum(ceil(n_g / PIECE_KEYS))
    pieces = torch.zeros(G + 1, dtype=torch.long, device=device)
    torch.cumsum((ptr_k.diff() + PIECE_KEYS - 1) // PIECE_KEYS, 0,
                 out=pieces[1:])
    p = torch.arange(P, device=device)
    g = torch.searchsorted(pieces[1:], p, right=True).clamp(max=G - 1)
    # Piece p of sequence g starts PIECE_KEYS keys after the one before it
    # and ends there or at its sequence's end; the pieces past the last are
    # empty, at N_k.
    used = p < pieces[-1]
    start = torch.where(used, ptr_k[g] + (p - pieces[g]) * PIECE_KEYS, Nk)
    end = torch.where(used, torch.minimum(start + PIECE_KEYS, ptr_k[g + 1]), Nk)
    partial = torch.empty(2, P, HK, dtype=torch.float64, device=device)
    columns = triton.cdiv(HK, MASS_COLUMNS)
    piece_kernel[(P, columns)](Z.contiguous(), start, end, partial, P, HK=HK,
                               PIECE=PIECE_KEYS, BLOCK_J=MASS_KEYS,
                               BLOCK_C=MASS_COLUMNS)
    mass_kernel[(G, columns)](partial, pieces, mass, G, P, HK=HK,
                              BLOCK_C=MASS_COLUMNS)
    return mass
