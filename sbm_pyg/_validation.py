"""Argument checks shared by the sampler and the layers.

Value checks on device tensors (NaN, negative entries, malformed pointers) are
collected as boolean tensors and resolved together with the sampled edge
count in a single host sync, instead of one sync per check.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

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
    bad = ~(torch.isfinite(x) & (x >= 0)).all()
    return bad, invalid_values(name)


def as_ptr(name: str, ptr: Union[None, Tensor, Sequence[int]], num_rows: int,
           device: torch.device) -> Tuple[Tensor, Check]:
    """Returns a CSR pointer :obj:`[G + 1]` on :obj:`device` and its check."""
    if ptr is None:
        ptr = torch.tensor([0, num_rows], device=device)
    elif not isinstance(ptr, Tensor):
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
    bad = (ptr[0] != 0) | (ptr[-1] != num_rows) | (ptr.diff() < 0).any()
    # The check raises only at the next sync; until then the kernels run on a
    # pointer made valid, so that a bad one cannot index out of bounds.
    safe = torch.cummax(ptr.clamp(0, num_rows), dim=0).values
    safe[0], safe[-1] = 0, num_rows
    return safe, (bad, f"{name} must start at 0, end at the number of rows "
                       f"({num_rows}) and be non-decreasing")


def sync(checks: Sequence[Check], *scalars: Tensor) -> List[float]:
    """Resolves all checks and reads :obj:`scalars` in one host transfer.

    Raises the :class:`ValueError` of the first failing check.
    """
    parts = [flag.reshape(1).double() for flag, _ in checks]
    parts += [s.reshape(1).double() for s in scalars]
    if not parts:
        return []
    values = torch.cat(parts).tolist()
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


def check_draws(num_draws: float, expected: float, num_bytes: float,
                max_edges: Optional[int], device: torch.device, G: int,
                H: int, Nq: int, Nk: int) -> None:
    """fastrg's guard, before anything of the graph's size is allocated:
    raises if more than :obj:`max_edges` edges were drawn or if
    :obj:`num_bytes` would not fit on :obj:`device`."""
    what = (f"fastrg over {G} sequence(s), {H} head(s), N_q={Nq}, N_k={Nk} "
            f"drew {num_draws:.0f} edges (expected {expected:.1f})")
    if max_edges is not None and num_draws > max_edges:
        raise ValueError(f"{what}, more than max_edges={max_edges}")
    check_memory(num_bytes, device, what)


def check_memory(num_bytes: float, device: torch.device, what: str) -> None:
    """Raises instead of letting an allocation of :obj:`num_bytes` kill the
    process."""
    free = available_memory(device)
    if free is not None and num_bytes > free:
        raise ValueError(f"{what} needs about {num_bytes / 2**30:.1f} GiB but "
                         f"only {free / 2**30:.1f} GiB are available on "
                         f"{device}")



def renamed_arguments(owner: str, kwargs: Dict[str, object],
                      renames: Dict[str, str]) -> Dict[str, object]:
    r"""Pops deprecated keyword arguments (:obj:`renames`: old name → new
    name) from :obj:`kwargs` with a :class:`DeprecationWarning`; returns
    their values under the new names."""
    values = {}
    for old, new in renames.items():
        if old in kwargs:
            warnings.warn(f"{owner}: '{old}' is deprecated, use '{new}'",
                          DeprecationWarning, stacklevel=3)
            values[new] = kwargs.pop(old)
    return values
