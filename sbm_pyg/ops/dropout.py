r"""Attention dropout by counter: whether the weight of query row :math:`r`
on key column :math:`c` is kept is a function of a seed and :math:`(r,
c)`, not a drawn tensor. The fused kernels (C++ and Triton) compute it
where they need it, in the forward and again in the backward, and keep
nothing per edge; this module is the same function in PyTorch, the
reference path's mask.

The bits of pair :math:`(r, c)` are the :math:`(c + 1)`-th output of row
:math:`r`'s SplitMix64 stream of purpose 2 (``csrc/sampler/stream.h``:
purposes 0 and 1 are the sampler's), and the weight is kept when their
top 53 bits, read as an integer, reach :func:`dropout_threshold`: an
integer comparison, the same in every kernel and dtype. A kept weight is
scaled by :func:`keep_scale`, :math:`1 / (1 - p)` up to the threshold's
rounding.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = ["DROPOUT_STREAM", "as_seed", "dropout_arguments",
           "dropout_threshold", "kernel_seed", "keep_scale", "dropout_row_states",
           "dropout_keep"]

#: The purpose of the rows' dropout streams (0, 1: the sampler's degree and
#: draws).
DROPOUT_STREAM = 2

_GOLDEN = 0x9E3779B97F4A7C15
_STREAM = 0x632BE59BD9B4E019


def dropout_threshold(p: float) -> int:
    r"""The integer threshold of dropout probability :obj:`p`: a weight is
    kept when its 53 bits reach :math:`\lceil p \cdot 2^{53} \rceil`
    (0: dropout off)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    return math.ceil(p * 2.0**53)


def as_seed(name: str, seed: Union[int, Tensor], device: torch.device) -> Tensor:
    r"""A seed as the kernels take it: a one-element int64 tensor on
    :obj:`device`, which they read there (never on the host, so that a
    captured graph can draw a new one each replay). A Python int in
    :math:`[0, 2^{62})` is filled into one (no host read); anything else
    raises a :class:`TypeError` or :class:`ValueError` naming :obj:`name`."""
    if isinstance(seed, Tensor):
        if not (seed.numel() == 1 and seed.dtype == torch.int64
                and seed.device == device):
            raise TypeError(f"{name} must be a one-element int64 tensor on "
                            f"{device}, got a {seed.dtype} tensor of shape "
                            f"{tuple(seed.shape)} on {seed.device}")
        return seed.reshape(())
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"{name} must be an int or a one-element int64 "
                        f"tensor, got {type(seed).__name__}")
    if not 0 <= seed < 2**62:
        raise ValueError(f"{name} must lie in [0, 2^62), got {seed}")
    return torch.full((), seed, dtype=torch.int64, device=device)


def dropout_arguments(p: float, seed: Union[int, Tensor, None],
                      device: torch.device) -> Tuple[Optional[Tensor], int]:
    r"""The kernels' dropout arguments for probability :obj:`p`: the seed
    (:func:`as_seed`; :obj:`None` without dropout) and the threshold
    (:func:`dropout_threshold`). Dropout needs a seed: a
    :class:`ValueError` without one."""
    threshold = dropout_threshold(p)
    if not threshold:
        return None, 0
    if seed is None:
        raise ValueError("dropout > 0 needs its dropout_seed")
    return as_seed("dropout_seed", seed, device), threshold


def kernel_seed(seed: Optional[Tensor], threshold: int, unused: Tensor) -> Tensor:
    r"""The dropout seed's argument of a Triton kernel: :obj:`seed`, or,
    without dropout (:obj:`threshold` 0), :obj:`unused`, a pointer the
    kernel never reads."""
    if threshold > 0:
        if seed is None:
            raise ValueError("attention dropout needs its dropout_seed")
        return seed
    return unused


def keep_scale(threshold: int) -> float:
    r"""The factor of a kept weight, :math:`2^{53} / (2^{53} - t)`: the
    inverse of the exact probability of keeping."""
    return 2.0**53 / (2**53 - threshold)


def _signed(x: int) -> int:
    # A uint64 constant as the int64 with its bits.
    return x - 2**64 if x >= 2**63 else x


def _shr(x: Tensor, s: int) -> Tensor:
    # Logical right shift of int64 lanes holding uint64 bits.
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix64(z: Tensor) -> Tensor:
    # SplitMix64's finalizer on int64 lanes (multiplication wraps).
    z = (z ^ _shr(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _shr(z, 27)) * _signed(0x94D049BB133111EB)
    return z ^ _shr(z, 31)


def dropout_row_states(seed: Union[int, Tensor], rows: Tensor) -> Tensor:
    r"""The initial states of query rows :obj:`rows`' dropout streams under
    :obj:`seed` (the C++ kernels' ``Rng(seed, row, 2).state``), as int64
    holding their uint64 bits: the dense Triton kernels load them with each
    tile instead of mixing a seed they would hold in registers.

    Args:
        seed (int or Tensor): the forward's dropout seed, in :math:`[0,
            2^{62})` (a one-element int64 tensor: read on its device).
        rows (Tensor): integer rows, any shape.

    Returns:
        int64 Tensor of the shape of :obj:`rows`.
    """
    with torch.no_grad():
        if isinstance(seed, Tensor):
            seed = seed.reshape(())
        else:
            seed = _signed(seed)
        return _mix64(_mix64(rows.long() * 4 + _signed((DROPOUT_STREAM + _STREAM)
                                                       % 2**64)) ^ seed)


def dropout_keep(seed: Union[int, Tensor], rows: Tensor, cols: Tensor,
                 threshold: int) -> Tensor:
    r"""Whether the weights of pairs :obj:`(rows, cols)` are kept under
    dropout :obj:`seed` and :obj:`threshold` (:func:`dropout_threshold`).

    Args:
        seed (int or Tensor): the forward's dropout seed, in :math:`[0,
            2^{62})` (a one-element int64 tensor: read on its device).
        rows (Tensor): row of each pair (integer, any shape).
        cols (Tensor): column of each pair, the shape of :obj:`rows`.
        threshold (int): from :func:`dropout_threshold`.

    Returns:
        bool Tensor of the shape of :obj:`rows`.
    """
    with torch.no_grad():
        # The row's stream state, then its output at counter c + 1.
        state = dropout_row_states(seed, rows)
        bits = _mix64(state + (cols.long() + 1) * _signed(_GOLDEN))
        return _shr(bits, 11) >= threshold
