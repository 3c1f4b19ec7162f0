"""Argument checks shared by the sampler, the kernels and the layers.

Value checks on device tensors (NaN, negative entries, malformed pointers) are
collected as boolean tensors and resolved together with the sampled edge
count in a single host sync, instead of one sync per check.
"""
from __future__ import annotations

import math
import os
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["Check", "require_tensor", "check_generator", "invalid_values",
           "nonnegative_finite", "sync", "available_memory", "check_memory"]

# A deferred value check: a boolean tensor (True: failed) and its message.
Check = Tuple[Tensor, str]


def require_tensor(name: str, x: object, ndim: Optional[int] = None,
                   floating: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape "
                         f"{tuple(x.shape)}")
    return x


def check_generator(generator: object, device: torch.device) -> None:
    """A generator must be a :class:`torch.Generator` on the device of the
    tensors it draws for (torch's kernels refuse any other)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device} but the tensors "
                         f"are on {device}; pass torch.Generator("
                         f"device='{device.type}')")


def invalid_values(name: str) -> str:
    """The message of a failed :func:`nonnegative_finite` check."""
    return f"{name} must be finite and non-negative (found NaN, inf or < 0)"


def nonnegative_finite(name: str, x: Tensor) -> Check:
    # NaN fails x >= 0 and inf fails x < inf: four kernels (isfinite is a
    # composite of four on its own).
    bad = ~((x >= 0) & (x < math.inf)).all()
    return bad, invalid_values(name)


def sync(checks: Sequence[Check], *scalars: Tensor) -> List[float]:
    """Resolves all checks and reads :obj:`scalars` in one host transfer.

    Raises the :class:`ValueError` of the first failing check.
    """
    # One kernel for the whole read where it can be (a view per scalar, the
    # concatenation, its conversion): cat promotes integers and flags
    # exactly, a float below float64 is widened alone (with an integer it
    # would promote to its own precision).
    parts = [x.reshape(1) if x.dtype == torch.float64 or not x.is_floating_point()
             else x.reshape(1).double()
             for x in [flag for flag, _ in checks] + list(scalars)]
    if not parts:
        return []
    values = torch.cat(parts).double().tolist()
    for (_, message), failed in zip(checks, values):
        if failed:
            raise ValueError(message)
    return values[len(checks):]


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes that can still be allocated on :obj:`device`, or :obj:`None`."""
    if device.type == "cuda":
        # mem_get_info counts only what the driver has left; blocks that the
        # caching allocator holds but no tensor uses can be allocated too.
        free = torch.cuda.mem_get_info(device)[0]
        return free + (torch.cuda.memory_reserved(device)
                       - torch.cuda.memory_allocated(device))
    if device.type == "cpu" and os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def check_memory(num_bytes: float, device: torch.device, what: str) -> None:
    """Raises instead of letting an allocation of :obj:`num_bytes` kill the
    process."""
    free = available_memory(device)
    if free is not None and num_bytes > free:
        raise ValueError(f"{what} needs about {num_bytes / 2**30:.1f} GiB but "
                         f"only {free / 2**30:.1f} GiB are available on "
                         f"{device}")
