r"""The sampler's argument checks: the SBM, the sequence pointers, the
included edges and the guard on the number of draws.

Value checks on device tensors are returned as :data:`~sbm_pyg.validation.Check`
pairs and raised together at the sampler's one host sync
(:func:`~sbm_pyg.validation.sync`); until then the tensors they guard are
clamped so that nothing indexes out of bounds.
"""
from __future__ import annotations

import math
import weakref
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from sbm_pyg.sampling.edges import edge_pairs
from sbm_pyg.validation import (
    Check,
    check_memory,
    nonnegative_finite,
    require_tensor,
)

__all__ = ["MODES", "PtrLike", "check_sampler_options", "check_sbm",
           "check_pointers", "as_ptr", "included_pairs", "check_draws"]

MODES = ("poisson", "exact")
PtrLike = Union[None, Tensor, Sequence[int]]
# The pointers that as_ptr made valid, by identity, row count and version:
# valid by construction whatever the check of the input they came from
# says, so a later check of the same tensor (a layer's sampler or dense
# kernel taking the pointers its regime choice made valid) is skipped: a
# dozen kernel launches fewer each. An in-place change bumps the version.
_VALID: weakref.WeakValueDictionary[Tuple[int, int, int], Tensor] = \
    weakref.WeakValueDictionary()


def _version_key(ptr: Tensor, num_rows: int) -> Optional[Tuple[int, int, int]]:
    # Not while torch.compile traces: a traced tensor has no identity to
    # remember (the checks are then made again, on the device).
    if torch.compiler.is_compiling():
        return None
    try:
        return id(ptr), num_rows, ptr._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _made_valid(ptr: PtrLike, num_rows: int, device: torch.device) -> bool:
    if not isinstance(ptr, Tensor) or ptr.device != device:
        return False
    key = _version_key(ptr, num_rows)
    return key is not None and _VALID.get(key) is ptr


def check_sampler_options(mode: str, exploration: float,
                          max_edges: Optional[int]) -> None:
    r"""Checks the sampler's options, naming the argument: every sampler
    and :class:`~sbm_pyg.nn.SBMAttentionOptions` check them here."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (not isinstance(exploration, (int, float)) or isinstance(exploration, bool)
            or not (math.isfinite(exploration) and exploration >= 0)):
        raise ValueError(f"exploration must be a finite number >= 0, got "
                         f"{exploration!r}")
    if max_edges is not None and (not isinstance(max_edges, int)
                                  or isinstance(max_edges, bool)
                                  or max_edges < 0):
        raise ValueError(f"max_edges must be a non-negative int or None, got "
                         f"{max_edges!r}")


def check_sbm(q_memb: Tensor, block: Tensor, k_memb: Tensor, ptr_q: PtrLike,
              ptr_k: PtrLike, self_loops: bool,
              check_memberships: bool = True) -> Tuple[Tensor, Tensor, List[Check]]:
    r"""Checks an SBM and its sequences; returns the pointers as tensors and
    the deferred value checks. :obj:`check_memberships=False` leaves the
    memberships' values to the backend, which reads them in its first pass
    anyway. The options are :func:`check_sampler_options`'s."""
    require_tensor("q_memb", q_memb, 3, floating=True)
    require_tensor("block", block, 3, floating=True)
    require_tensor("k_memb", k_memb, 3, floating=True)
    Nq, H, k = q_memb.shape
    if block.shape != (H, k, k):
        raise ValueError(f"block must have shape [H, k, k] = [{H}, {k}, {k}] "
                         f"to match q_memb {tuple(q_memb.shape)}, got "
                         f"{tuple(block.shape)}")
    if k_memb.shape[1:] != (H, k):
        raise ValueError(f"k_memb must have shape [N_k, {H}, {k}] to match "
                         f"q_memb {tuple(q_memb.shape)}, got "
                         f"{tuple(k_memb.shape)}")
    if not (q_memb.device == block.device == k_memb.device):
        raise ValueError("q_memb, block and k_memb must be on the same device")
    Nk, device = k_memb.size(0), q_memb.device
    if H * max(Nq, 1) * max(Nk, 1) >= 2**62:
        raise ValueError(f"H * N_q * N_k = {H} * {Nq} * {Nk} overflows the "
                         f"int64 edge keys")
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk, device)
    checks.append(nonnegative_finite("block", block))
    if check_memberships:
        checks += [nonnegative_finite("q_memb", q_memb),
                   nonnegative_finite("k_memb", k_memb)]
    if self_loops:
        if Nq != Nk:
            raise ValueError(f"self_loops=True needs queries and keys to be "
                             f"the same sequences, got N_q={Nq}, N_k={Nk}")
        if ptr_q is not ptr_k:  # one pointer is the same sequences
            checks.append(((ptr_q != ptr_k).any(),
                           "self_loops=True needs queries and keys to be the "
                           "same sequences: ptr_q must equal ptr_k"))
    return ptr_q, ptr_k, checks


def as_ptr(name: str, ptr: PtrLike, num_rows: int,
           device: torch.device) -> Tuple[Tensor, Optional[Check]]:
    """Returns a CSR pointer :obj:`[G + 1]` on :obj:`device` and its check
    (:obj:`None` for :obj:`ptr=None`, one sequence: valid as made)."""
    if ptr is None:
        # [0, num_rows] made on the device: a host tensor copied there syncs.
        made = torch.arange(2, device=device) * num_rows
        key = _version_key(made, num_rows)
        if key is not None:
            _VALID[key] = made
        return made, None
    if not isinstance(ptr, Tensor):
        try:
            ptr = torch.as_tensor(ptr, device=device)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a LongTensor or a sequence of "
                            f"ints, got {type(ptr).__name__}") from e
    if ptr.dtype not in (torch.int64, torch.int32) or ptr.dim() != 1:
        raise TypeError(f"{name} must be a 1-D integer tensor, got dtype "
                        f"{ptr.dtype} and shape {tuple(ptr.shape)}")
    if ptr.numel() < 1:
        raise ValueError(f"{name} must have at least one entry")
    ptr = ptr.to(device=device, dtype=torch.long)
    # The check raises only at the next sync; until then the kernels run on a
    # pointer made valid, so that a bad one cannot index out of bounds.
    # Its ends are written by concatenation: an item assignment would copy a
    # host scalar into device memory, a sync on CUDA.
    safe = torch.cummax(ptr[1:-1].clamp(0, num_rows), dim=0).values
    safe = torch.cat([ptr.new_zeros(1), safe, ptr.new_full((1,), num_rows)])
    if ptr.numel() == 1:  # no sequence: valid only as [0] over no rows
        safe = safe[1:]
        bad = (ptr != 0).any() | (num_rows != 0)
    else:
        # Valid exactly where nothing was made valid: a pointer that starts
        # at 0, ends at num_rows and never decreases is its own valid form,
        # and every other one differs from it somewhere.
        bad = (ptr != safe).any()
    key = _version_key(safe, num_rows)
    if key is not None:
        _VALID[key] = safe
    return safe, (bad, f"{name} must start at 0, end at the number of rows "
                       f"({num_rows}) and be non-decreasing")


def check_pointers(ptr_q: PtrLike, ptr_k: PtrLike, Nq: int, Nk: int,
                   device: torch.device) -> Tuple[Tensor, Tensor, List[Check]]:
    r"""Query and key pointers of the same sequences, and their checks
    (none for a pointer that :func:`as_ptr` made valid)."""
    checks: List[Check] = []
    one = ptr_q is None and ptr_k is None and Nq == Nk  # one pointer for both
    if not _made_valid(ptr_q, Nq, device):
        ptr_q, check_q = as_ptr("ptr_q", ptr_q, Nq, device)
        checks += [check_q] if check_q is not None else []
    if not _made_valid(ptr_k, Nk, device):
        ptr_k, check_k = (ptr_q, None) if one else as_ptr("ptr_k", ptr_k, Nk, device)
        checks += [check_k] if check_k is not None else []
    assert isinstance(ptr_q, Tensor) and isinstance(ptr_k, Tensor)
    if ptr_q.numel() != ptr_k.numel():
        raise ValueError(f"ptr_q and ptr_k must describe the same number of "
                         f"sequences, got {ptr_q.numel() - 1} and "
                         f"{ptr_k.numel() - 1}")
    return ptr_q, ptr_k, checks


def included_pairs(edges: object, ptr_q: Tensor, ptr_k: Tensor, Nq: int,
                   Nk: int, name: str = "include_edges"
                   ) -> Tuple[Tensor, Tensor, Check]:
    r"""Queries :math:`i` and keys :math:`j` of :obj:`include_edges` (key
    :math:`j` → query :math:`i`), and the deferred check that they are in
    range and stay within their sequence."""
    pairs = edge_pairs(name, edges)
    if pairs.device != ptr_q.device:
        raise ValueError(f"{name} is on {pairs.device}, the sequence "
                         f"pointers on {ptr_q.device}")
    j, i = pairs
    in_range = (j >= 0) & (j < Nk) & (i >= 0) & (i < Nq)
    same = (torch.searchsorted(ptr_k, j, right=True)
            == torch.searchsorted(ptr_q, i, right=True))
    bad = ~(in_range & same).all()
    # Until the check raises (at the sampler's one sync), out-of-range pairs
    # are clamped so that nothing indexes out of bounds; a mask would sync.
    i, j = i.clamp(0, max(Nq - 1, 0)), j.clamp(0, max(Nk - 1, 0))
    return i, j, (bad, f"{name} must hold pairs (key j, query i) with "
                       f"0 <= j < N_k={Nk}, 0 <= i < N_q={Nq}, within one "
                       f"sequence")


def check_draws(num_draws: float, expected: float, num_bytes: float,
                max_edges: Optional[int], device: torch.device, G: int,
                H: int, Nq: int, Nk: int) -> None:
    """The sampler's guard, before anything of the graph's size is
    allocated: raises if more than :obj:`max_edges` edges were drawn or if
    :obj:`num_bytes` would not fit on :obj:`device`."""
    what = (f"fastrg over {G} sequence(s), {H} head(s), N_q={Nq}, N_k={Nk} "
            f"drew {num_draws:.0f} edges (expected {expected:.1f})")
    if max_edges is not None and num_draws > max_edges:
        raise ValueError(f"{what}, more than max_edges={max_edges}")
    check_memory(num_bytes, device, what)
