r"""The capacity of a layer's static calls kept without waiting for the
device (:class:`~sbm_pyg.nn.SBMConv`'s :obj:`capacity="auto"`).

A static call samples into buffers of a size fixed before it runs
(:func:`~sbm_pyg.sampling.fastrg_static`), so the size must come from
somewhere other than this call's draws. :class:`AutoCapacity` takes it
from the calls before: after each call it starts a non-blocking copy of
the call's expected draws and overflow flag to host memory (pinned, with
an event, on an accelerator), and before the next call it reads that copy
if the event says it has landed, which costs no wait; if it has not, the
capacity stays as it was and the copy is read a call later. The capacity
is :func:`~sbm_pyg.sampling.round_capacity` of the expected draws (their
mean plus 8 standard deviations plus 64, in steps of a quarter power of
two). It grows at once and shrinks only when the need has halved, so that
a slowly moving density changes the buffers' shapes (and a compiled
graph's) rarely. With a :obj:`max_edges`, the capacity is at most it,
and expected draws above it raise a :class:`ValueError` naming it (read
with the copy: one call late), as the default route raises on draws above
it.

An overflow is never silent: the call's :obj:`overflow` flag is on the
device at once, and the copy's read warns (:class:`RuntimeWarning`),
counts it in :attr:`AutoCapacity.overflows` and makes the next capacity at
least twice the one that overflowed. Only the first call, with nothing
copied yet, reads once (:func:`~sbm_pyg.sampling.expected_draws`).
"""
from __future__ import annotations

import math
import warnings
from collections import deque
from typing import Callable, Deque, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.sampling.checks import PtrLike, check_sbm
from sbm_pyg.sampling.static_fastrg import expected_draws, round_capacity
from sbm_pyg.validation import sync

__all__ = ["AutoCapacity", "next_capacity"]


class AutoCapacity:
    r"""A capacity sized from earlier calls' expected draws, read one call
    late from an asynchronous copy (see the module).

    Example:
        >>> keeper = AutoCapacity()
        >>> keeper.capacity_for(lambda: torch.tensor(1000.0))  # reads once
        1536
        >>> keeper.record(torch.tensor(3000.0), torch.tensor(False))
        >>> keeper.capacity_for(lambda: torch.tensor(0.0))  # grown, no read
        3584
    """

    def __init__(self) -> None:
        #: The capacity of the next call (:obj:`None` before the first).
        self.capacity: Optional[int] = None
        #: The overflows read so far.
        self.overflows = 0
        #: The most draws a capacity may hold (a layer's :obj:`max_edges`;
        #: :obj:`None`: no bound).
        self.limit: Optional[int] = None
        # The copies not read yet, oldest first: none is dropped unread, so
        # that no overflow goes unseen.
        self._copies: Deque[Tuple[Tensor, Optional[torch.Event]]] = deque()
        self._last: Optional[Tensor] = None  # the call recorded last

    def __getstate__(self) -> dict:
        # A copy in flight (an event) neither pickles nor deep-copies.
        return dict(self.__dict__, _copies=deque(), _last=None)

    def record(self, expected_draws: Tensor, overflow: Tensor) -> None:
        r"""Starts the copy of a call's :obj:`expected_draws` and
        :obj:`overflow` (0-dim tensors on the device) to the host, without
        waiting for it (once per call: the same tensors again are
        ignored)."""
        if expected_draws is self._last:
            return
        self._last = expected_draws
        values = torch.stack([expected_draws.detach().double(),
                              overflow.detach().double()])
        if values.device.type == "cpu":
            self._copies.append((values, None))
            return
        host = torch.empty(2, dtype=torch.float64, pin_memory=values.is_cuda)
        host.copy_(values, non_blocking=True)
        event = torch.Event(device=values.device)
        event.record()
        self._copies.append((host, event))

    def refresh(self) -> Optional[int]:
        r"""Reads the copies that have landed (no wait) and returns the
        next call's capacity (:obj:`None` before a first)."""
        while self._copies and (self._copies[0][1] is None or self._copies[0][1].query()):
            expected, overflow = self._copies.popleft()[0].tolist()
            self._resize(expected, bool(overflow))
        return self.capacity

    def capacity_for(self, first: Callable[[], Tensor]) -> int:
        r"""The next call's capacity: :meth:`refresh`'s, or before any,
        from :obj:`first()` (the expected draws, read)."""
        if self.refresh() is None:
            self._resize(float(first()), False)
        assert self.capacity is not None
        return self.capacity

    def _resize(self, expected: float, overflow: bool) -> None:
        limit = math.inf if self.limit is None else self.limit
        if expected > limit:
            raise ValueError(
                f"max_edges={self.limit}: a call's expected draws ({expected:.0f}) "
                f"exceed it, and capacity='auto' sizes the buffers by them: raise "
                f"max_edges or hold the density down (DensityBudget, the density "
                f"penalty)")
        need = round_capacity(expected)
        old = self.capacity
        if overflow and old is not None:
            self.overflows += 1
            need = max(need, 2 * old)
        need = int(min(need, limit))
        if overflow and old is not None:
            warnings.warn(
                f"a static call's draws overflowed its capacity ({old}): its "
                f"graph lacked some; the next call's capacity is {need}"
                + (" (max_edges)" if need == limit else ""),
                RuntimeWarning, stacklevel=4)
        if old is None or need > old or 2 * need <= old or old > limit:
            self.capacity = need


def next_capacity(keeper: AutoCapacity, sbm: Tuple[Tensor, Tensor, Tensor],
                  ptr_q: PtrLike, ptr_k: PtrLike, options: SBMAttentionOptions) -> int:
    r"""A layer's capacity for a call of its SBM :obj:`sbm` (query
    memberships, block, key memberships) over the sequences of
    :obj:`ptr_q` and :obj:`ptr_k` with :obj:`options`' mode and
    exploration: :obj:`keeper`'s. Traced by :func:`torch.compile`, the
    capacity is a constant of the graph (a new one retraces it), and the
    keeper is updated between calls by
    :meth:`~sbm_pyg.nn.SBMConv.update_capacity`."""
    keeper.limit = options.max_edges
    if torch.compiler.is_compiling():
        if keeper.capacity is None:
            raise ValueError("capacity='auto' sizes its first call's buffers by "
                             "one read: call the layer once before compiling it, "
                             "or give capacity an int")
        return keeper.capacity

    def first() -> Tensor:
        # This call reads anyway: bad input raises its ValueError here, before
        # the sums run over it.
        q_memb, block, k_memb = sbm
        pq, pk, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k, options.self_loops)
        sync(checks)
        return expected_draws(q_memb, block, k_memb, pq, pk, mode=options.mode,
                              exploration=options.exploration,
                              backend=options.sampler_backend)

    return keeper.capacity_for(first)
