r"""The torch operator namespace ``sbm_pyg``: every operator of the package
(the sampler's two passes, the fused attention and its backward) is
defined here, through one :class:`torch.library.Library` fragment, with one
schema and one fake kernel, and gets its kernel per device: the compiled
extension registers the CPU kernels (``TORCH_LIBRARY_IMPL`` in
``csrc/bindings.cpp``), :func:`define_ops` the Triton ones for CUDA.

Under ``TRITON_INTERPRET=1`` (tests without a GPU) an operator set can also
be defined as a twin, ``sbm_pyg::triton_<name>``, whose CPU kernel is the
Triton one run by the interpreter.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, Dict, Optional, Tuple

import torch

from sbm_pyg.ops.backend_info import WITH_TRITON

__all__ = ["LIBRARY", "TWIN", "define_ops", "define_autograd_ops", "device_guard"]

LIBRARY = torch.library.Library("sbm_pyg", "FRAGMENT")
# The twin operators' prefix, or None where they are not defined.
TWIN: Optional[str] = ("triton_" if WITH_TRITON
                       and os.environ.get("TRITON_INTERPRET") == "1" else None)

# name -> (schema after the name, fake kernel, Triton kernel or None)
OpSpec = Dict[str, Tuple[str, Callable, Optional[Callable]]]


def device_guard(kernel: Callable) -> Callable:
    r""":obj:`kernel` run with its first tensor argument's CUDA device as
    the current device. A Triton launch, and every allocation without a
    device, goes to the current device, not to the inputs': tensors on
    :obj:`cuda:1` while device 0 is current would be read at addresses of
    the wrong device. :class:`torch.library.Library` adds no such guard
    to the kernels registered through it."""
    @functools.wraps(kernel)
    def guarded(*args, **kwargs):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        with torch.cuda.device(device):
            return kernel(*args, **kwargs)
    return guarded


def define_ops(ops: OpSpec, prefix: str = "") -> None:
    r"""Defines each operator ``sbm_pyg::<prefix><name>`` of :obj:`ops` with
    its schema and fake kernel, and registers its Triton kernel, if it has
    one: for CUDA (no prefix, where Triton imports), or for the CPU (the
    twin, :obj:`prefix=TWIN`)."""
    for name, (schema, fake, triton_kernel) in ops.items():
        LIBRARY.define(prefix + name + schema)
        torch.library.register_fake(f"sbm_pyg::{prefix}{name}", fake,
                                    lib=LIBRARY)
        if triton_kernel is None:
            continue
        if prefix:
            LIBRARY.impl(prefix + name, triton_kernel, "CPU")
        elif WITH_TRITON:
            LIBRARY.impl(name, device_guard(triton_kernel), "CUDA")


def define_autograd_ops(ops: OpSpec, name: str,
                        backward: Callable[[Callable], Callable],
                        setup_context: Callable) -> None:
    r"""Defines :obj:`ops`, an operator :obj:`name` and its
    :obj:`name_backward` (and their twins where :data:`TWIN` is set), with
    the autograd formula :obj:`backward(backward_op)` of each."""
    for prefix in ("",) + ((TWIN,) if TWIN else ()):
        define_ops(ops, prefix)
        op = prefix + name
        torch.library.register_autograd(
            f"sbm_pyg::{op}", backward(getattr(torch.ops.sbm_pyg,
                                               op + "_backward")),
            setup_context=setup_context, lib=LIBRARY)
