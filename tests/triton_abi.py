r"""Triton's interpreter with the compiled kernels' argument types.

A compiled Triton kernel does not take its scalar arguments as Python
values: the JIT gives each one a type (``triton.runtime.jit.mangle_type``
and the parameter's annotation) and passes it as that type, so a Python
``float`` reaches an unannotated parameter as fp32 and an ``int`` as i32 or
i64 by its value. The interpreter hands the kernel the Python float itself,
exact, which hid fp64 results that were off by fp32's rounding on a GPU.

:func:`install` makes every interpreted launch bind its arguments with the
JIT's own binder (:func:`triton.runtime.jit.create_function_from_signature`
for a CUDA target) and pass each scalar as a one-element value of the type
that binder gives it. It changes no kernel and copies nothing of the
interpreter. ``tests/conftest.py`` installs it unless
``SBM_PYG_TRITON_ABI=plain``.

With :data:`RECORD` set (``SBM_PYG_TRITON_SIGNATURES=DIR``), each launch
with a specialisation not seen before is also written to ``DIR`` as its
arguments' descriptions (a tensor's dtype and address modulo 16, a scalar's
value, the constexprs and launch options), from which
``benchmarks/checks/triton_compile.py`` recompiles it for a GPU through the same
binder: the ahead-of-time compile then sees the signatures the JIT builds
for the launches the tests make.
"""
from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime import interpreter
from triton.runtime.jit import JITFunction, create_function_from_signature

__all__ = ["install", "jit_binding", "describe", "mock_args", "RECORD"]

# The target whose binder gives the types (the types do not depend on the
# architecture).
TARGET = GPUTarget("cuda", 90, 32)
RECORD: Optional[Path] = (Path(os.environ["SBM_PYG_TRITON_SIGNATURES"])
                          if os.environ.get("SBM_PYG_TRITON_SIGNATURES") else None)

_NUMPY = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
          "i1": np.bool_, "u1": np.bool_, "i8": np.int8, "i16": np.int16,
          "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16,
          "u32": np.uint32, "u64": np.uint64}
_JIT: Dict[Any, Tuple[JITFunction, Any]] = {}
_SEEN: Dict[str, dict] = {}


def jit_binding(fn, args: tuple, kwargs: dict, target: GPUTarget = TARGET):
    r"""The JIT's binding of a launch of the kernel :obj:`fn` (a
    :class:`JITFunction`, or an interpreted kernel, whose Python function
    and :obj:`do_not_specialize` make one) for :obj:`target`:
    :obj:`(jit, backend, bound, specialization, options)` as
    :meth:`JITFunction.run` computes them."""
    key = (fn.fn if hasattr(fn, "fn") else fn, target)
    if key not in _JIT:
        if isinstance(fn, JITFunction):
            jit = fn
        else:
            extra = getattr(fn, "kwargs", {})
            jit = JITFunction(key[0], do_not_specialize=extra.get("do_not_specialize"),
                              do_not_specialize_on_alignment=extra.get(
                                  "do_not_specialize_on_alignment"))
        backend = make_backend(target)
        _JIT[key] = (jit, backend, create_function_from_signature(
            jit.signature, jit.params, backend))
    jit, backend, binder = _JIT[key]
    bound, specialization, options = binder(*args, **kwargs)
    return jit, backend, bound, specialization, options


def _typed(value, ty: str):
    # A scalar as the compiled kernel receives it: a one-element value of
    # the JIT's type (rounded, for a float given an fp32 parameter).
    if ty not in _NUMPY or isinstance(value, tl.tensor):
        return value
    handle = interpreter.TensorHandle(np.array([value], dtype=_NUMPY[ty]),
                                      tl.str_to_ty(ty, None))
    return tl.tensor(handle, tl.str_to_ty(ty, None))


def describe(value) -> Any:
    r"""A launch argument as JSON: a tensor's dtype and address modulo 16
    (all the JIT specialises on), a dtype constexpr's name, else the
    value."""
    if hasattr(value, "data_ptr"):
        return {"tensor": str(value.dtype).removeprefix("torch."),
                "align": value.data_ptr() % 16}
    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    return value


class _Mock:
    # What the JIT's binder reads of a tensor: its dtype and address.
    def __init__(self, dtype: torch.dtype, align: int):
        self.dtype, self._ptr = dtype, align

    def data_ptr(self) -> int:
        return self._ptr


def mock_args(described: Dict[str, Any]) -> Dict[str, Any]:
    r"""The inverse of :func:`describe` over a launch's arguments: tensors
    become objects with their dtype and address, dtype names dtypes."""
    def one(value):
        if isinstance(value, dict) and "tensor" in value:
            return _Mock(getattr(torch, value["tensor"]), value["align"])
        if isinstance(value, dict) and "dtype" in value:
            return tl.dtype(value["dtype"])
        return value
    return {name: one(value) for name, value in described.items()}


def _record(fn, bound: dict, specialization: List[tuple], options: dict):
    name = f"{fn.fn.__module__}.{fn.fn.__name__}"
    launch = dict(kernel=name,
                  args={k: describe(v) for k, v in bound.items()},
                  options={k: v for k, v in options.items()
                           if isinstance(v, (bool, int, float, str))})
    # One entry per specialisation: the JIT compiles one kernel for each.
    types = [(t, v if t == "constexpr" and not isinstance(v, tl.dtype)
              else str(v)) for t, v in specialization]
    key = json.dumps([name, types, sorted(launch["options"].items())],
                     default=str)
    if key not in _SEEN:
        _SEEN[key] = launch


def _write_records() -> None:
    if RECORD is not None and _SEEN:
        RECORD.mkdir(parents=True, exist_ok=True)
        path = RECORD / f"launches-{os.getpid()}.json"
        path.write_text(json.dumps(list(_SEEN.values()), indent=0) + "\n")


_original_run = interpreter.InterpretedFunction.run


def _run(self, *args, grid, warmup, **kwargs):
    if warmup:
        return _original_run(self, *args, grid=grid, warmup=warmup, **kwargs)
    _, _, bound, specialization, options = jit_binding(self, args, kwargs)
    if RECORD is not None:
        _record(self, bound, specialization, options)
    typed = {name: _typed(value, ty) for (name, value), (ty, _) in
             zip(bound.items(), specialization)}
    return _original_run(self, grid=grid, warmup=warmup, **typed, **options)


def install() -> None:
    r"""Interpreted launches take their scalars with the compiled kernels'
    types (and are recorded if :data:`RECORD` is set), from now on."""
    if interpreter.InterpretedFunction.run is not _run:
        interpreter.InterpretedFunction.run = _run
        if RECORD is not None:
            atexit.register(_write_records)
