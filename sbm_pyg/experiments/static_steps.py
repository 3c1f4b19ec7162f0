r"""Training steps of static shapes for ``python -m sbm_pyg train``: the
options (``--capacity``: every SBM layer samples into buffers of a fixed
size and reads nothing from the device; ``--compile``: the model's forward
and loss traced by :func:`torch.compile` as one graph), the layers'
overflow and expected draws read with a step's record, and the capacity
grown where they overflowed."""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Union

import torch
from torch import Tensor

from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.sampling.static_fastrg import round_capacity

__all__ = ["add_static_arguments", "validate_static", "static_stats", "grow_capacity",
           "compiled", "unsized", "streams_kept"]


def add_static_arguments(add: Callable[..., object]) -> None:
    r"""Adds the static steps' options with :obj:`add` (a parser's
    :obj:`add_argument`)."""
    add("--capacity", type=_capacity, default=None,
        help="static shapes: each SBM layer samples into buffers of this many "
             "draws a step (sbm_pyg.sampling.fastrg_static) and reads nothing "
             "from the device; a step whose draws overflow it is logged "
             "(overflow) and the capacity grown for the next "
             "(sbm_pyg.sampling.round_capacity); 'auto': each layer sizes its "
             "own from its earlier steps (sbm_pyg.nn.capacity)")
    add("--compile", action="store_true",
        help="the model's forward and loss compiled by torch.compile "
             "(fullgraph=True, dynamic=False); needs --attention sbm, whose "
             "layers it gives static shapes (--capacity, 'auto' by default), "
             "and a task without padding (repeat, mqar); with --capacity auto the layers "
             "are sized before a compiled step by one eager forward of its "
             "batch, without gradients")


def _capacity(value: str) -> Union[int, str]:
    # "auto" or an int (argparse reports a ValueError as a bad value).
    return value if value == "auto" else int(value)


def validate_static(args) -> None:
    r"""Raises a :class:`ValueError` naming a bad static-step option."""
    capacity = getattr(args, "capacity", None)
    compiling = getattr(args, "compile", False)
    if compiling and capacity is None and args.attention == "sbm":
        # Compiled SBM layers need static shapes: sized by the layers.
        args.capacity = capacity = "auto"
    if capacity is not None and ((capacity != "auto" and capacity < 1)
                                 or args.attention != "sbm"):
        raise ValueError("--capacity must be >= 1 or 'auto' and needs --attention sbm")
    if compiling and (capacity is None or args.task == "listops"):
        raise ValueError("--compile needs --attention sbm (its layers at static "
                         "shapes, --capacity, 'auto' by default) and a task "
                         "without padding (repeat, mqar): a mask is read")


def _layers(model: torch.nn.Module) -> List[SBMConv]:
    return [m for m in model.modules()
            if isinstance(m, SBMConv) and m.capacity is not None]


def static_stats(model: torch.nn.Module) -> Dict[str, Tensor]:
    r"""The last forward's static layers, as 0-dim tensors for a step's
    one read: how many overflowed their capacity (:obj:`overflow`) and the
    largest expected draws (:obj:`expected_draws`); empty without a
    capacity (or before a static forward)."""
    layers = [m for m in _layers(model) if m.overflow is not None]
    if not layers:
        return {}
    return dict(overflow=torch.stack([m.overflow for m in layers]).sum(),
                expected_draws=torch.stack([m.expected_draws for m in layers]).max())


def grow_capacity(model: torch.nn.Module, record: Dict[str, float]) -> Dict[str, int]:
    r"""Where a step's record (:func:`static_stats` read) says that a layer
    overflowed, every static layer's capacity made at least
    :func:`~sbm_pyg.sampling.round_capacity` of the largest expected
    draws; layers of :obj:`capacity="auto"` updated by their own
    :meth:`~sbm_pyg.nn.SBMConv.update_capacity` (a compiled step's need
    this between steps). The new capacity by name (empty where nothing
    changed), or the automatic layers' next (their largest) at every step."""
    auto = [c for m in _layers(model) if m.capacity == "auto"
            for c in [m.update_capacity()] if c is not None]  # they keep their own
    if auto:
        return dict(capacity=max(auto))
    if not record.get("overflow"):
        return {}
    need = round_capacity(float(record["expected_draws"]))
    layers = [m for m in _layers(model) if m.capacity != "auto" and m.capacity < need]
    for m in layers:
        m.capacity = need
    return dict(capacity=need) if layers else {}


def unsized(model: torch.nn.Module) -> bool:
    r"""Whether a layer of :obj:`capacity="auto"` that samples in a
    training step (not attending to every pair) has no capacity yet: its
    first call would size its buffers by a read, which a compiled step
    cannot make. Reads and changes nothing."""
    return any(m.capacity == "auto" and not m.attend_all and m.kept_capacity() is None
               for m in _layers(model))


@contextlib.contextmanager
def streams_kept(generator: torch.Generator, device: torch.device) -> Iterator[None]:
    r"""Runs its block with the random streams restored after it: torch's,
    :obj:`device`'s (CUDA) and :obj:`generator`'s (a task's batches), so
    that an eager forward that sizes the layers (:func:`unsized`) draws
    the next step's batch and leaves the run as it was."""
    state = generator.get_state()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield
    generator.set_state(state)


def compiled(net: torch.nn.Module) -> torch.nn.Module:
    r""":obj:`net` compiled as one graph (``fullgraph=True``, static
    shapes): a new capacity, a switch of regime or of mode retraces it."""
    return torch.compile(net, fullgraph=True, dynamic=False)
