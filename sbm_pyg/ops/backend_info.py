r"""Which kernels are built and which ones run: the one place that says so,
as :mod:`torch_geometric.typing` does for PyG.

* :data:`WITH_EXTENSION`: the compiled extension ``sbm_pyg._C`` was built
  (``setup.py``, ``csrc/``): the CPU kernels of the operators
  ``sbm_pyg::fastrg_plan``, ``fastrg_sample`` and ``sparse_attention``.
  Without a compiler, or with ``SBM_PYG_NO_EXT=1`` at install time, the
  package runs on its pure-PyTorch path.
* :data:`WITH_TRITON`: Triton imports: the sampler and the fused attention
  for CUDA tensors.
* :func:`resolve_backend`: the one function that picks a kernel.
* :data:`WITH_TORCH_SCATTER`: torch-scatter imports: its segment max is
  used for the PyTorch path's softmax on the CPU.
"""
from __future__ import annotations

import functools
import importlib
import os
import warnings
from typing import Any, Dict, Optional, Tuple, Union

import torch

__all__ = ["WITH_EXTENSION", "WITH_TRITON", "WITH_TORCH_SCATTER",
           "extension", "BACKENDS", "ATTENTION_BACKENDS", "STATIC_BACKENDS",
           "DENSE_CROSSOVER",
           "DEVICE_CROSSOVERS", "dense_crossover", "TILES_MIN_EDGES",
           "DEVICE_TILES_MIN_EDGES", "tiles_min_edges",
           "resolve_backend", "backends", "triton_runs", "dense_runs"]

# The compiled module sbm_pyg._C, whose import registers the CPU kernels of
# torch.ops.sbm_pyg (sampler and attention), or None. Loaded here only.
extension: Any
try:
    extension = importlib.import_module("sbm_pyg._C")
except ImportError:  # built without the extension (no compiler, SBM_PYG_NO_EXT=1)
    extension = None
    if os.environ.get("SBM_PYG_NO_EXT", "0") != "1":
        # Said once, at import: without it the layers run several times
        # slower and nothing else would tell.
        warnings.warn(
            "sbm_pyg: the compiled kernels (sbm_pyg._C) are not built or not "
            "importable, so the sampler and the CPU attention run their "
            "pure-PyTorch path, several times slower. Install with a C++ "
            "compiler (pip install --no-build-isolation .), and run Python "
            "from outside the source tree of a non-editable install. Set "
            "SBM_PYG_NO_EXT=1 to silence this.", RuntimeWarning, stacklevel=2)

try:
    import triton  # noqa: F401
except ImportError:
    WITH_TRITON = False
else:
    WITH_TRITON = True

try:
    import torch_scatter  # noqa: F401
except ImportError:
    WITH_TORCH_SCATTER = False
else:
    WITH_TORCH_SCATTER = True

WITH_EXTENSION = extension is not None


BACKENDS = ("auto", "cpp", "triton", "torch")
# The attention also has the dense-regime kernel (ops/dense_attention.py),
# which samples its own mask: a layer runs it in place of sampler and
# sparse attention.
ATTENTION_BACKENDS = BACKENDS + ("dense",)
# The static sampler (sampling/static_fastrg.py) has no Triton kernel: a
# GPU captures its PyTorch one.
STATIC_BACKENDS = ("auto", "cpp", "torch")
OPS = ("sampler", "attention")
# The expected density (edges per query-key pair) from which "auto" runs
# the dense-regime attention: where an SBMConv forward+backward costs less
# on the dense kernel than on the sparse one. Measured on the CPU with
# python -m benchmarks --sections crossover (n = 2048, H = 2, k = 128,
# 2 threads): dense / sparse 1.46 at 20%, 0.99 at 30%, 0.54 at 50%. A GPU
# takes its own value where one was measured (DEVICE_CROSSOVERS), else this.
DENSE_CROSSOVER = 0.3
# The crossover measured on each GPU, by torch.cuda.get_device_name():
# python -m benchmarks --device cuda --sections crossover (docs/performance.md).
# NVIDIA H200 (torch 2.11, Triton 3.6; docs/runs/gpu/gpu-h200-tensor-cores/):
# float32 layer, the dense kernel's products in IEEE float32, dense /
# sparse at n = 8192: 1.56 at 10%, 1.10 at 20%, 0.86 at 30% (0.24 between,
# linearly); at n = 2048 both are launch-bound and the dense kernel was the
# faster at every density from 0.5% (0.70-0.84).
DEVICE_CROSSOVERS: Dict[str, float] = {"NVIDIA H200": 0.24}


def dense_crossover(device: Union[torch.device, str]) -> Tuple[float, str]:
    r"""The expected density from which :obj:`"auto"` runs the dense-regime
    attention on :obj:`device`, and where the value comes from: the GPU's
    own measured value (:data:`DEVICE_CROSSOVERS`), else the CPU's
    :data:`DENSE_CROSSOVER`.

    Example:
        >>> dense_crossover("cpu")
        (0.3, 'cpu')
    """
    device = torch.device(device)
    if device.type == "cuda":
        name = _device_name(device.index)
        if name in DEVICE_CROSSOVERS:
            return DEVICE_CROSSOVERS[name], name
        return DENSE_CROSSOVER, f"cpu (not measured on {name})"
    return DENSE_CROSSOVER, "cpu"


# The least expected edges that a call's tiles must hold for "auto" to take
# the tiled regime (beside nn._regimes.TILES_MIN_SHARE): none on the CPU,
# where the tiled regime paid from n = 4096 (docs/performance.md). On a GPU
# it has a fixed cost the edge path has not (its plan, sorts and five
# reads). NVIDIA H200 (torch 2.11, Triton 3.6; python -m benchmarks
# --device cuda --sections sharp --sharp-dtype bfloat16, 5%,
# docs/runs/gpu/gpu-h200-key-masses/bench-b.json): the edge path 17.1 /
# 67.0 ms, the tiled regime 33.9 / 38.3 ms at n = 4096 / 16384 (1.7 M /
# 26.9 M expected edges in the tiles): linear in the edges, level at about
# 1.1e7. A GPU not measured takes the H200's figure.
TILES_MIN_EDGES = 0.0
DEVICE_TILES_MIN_EDGES: Dict[str, float] = {"NVIDIA H200": 1.1e7}


def tiles_min_edges(device: Union[torch.device, str]) -> Tuple[float, str]:
    r"""The least expected edges in the tiles from which :obj:`"auto"` takes
    the tiled regime on :obj:`device`, and where the value comes from: the
    GPU's own (:data:`DEVICE_TILES_MIN_EDGES`), else the first measured
    GPU's (else the CPU's); on the CPU :data:`TILES_MIN_EDGES`.

    Example:
        >>> tiles_min_edges("cpu")
        (0.0, 'cpu')
    """
    device = torch.device(device)
    if device.type != "cuda":
        return TILES_MIN_EDGES, "cpu"
    name = _device_name(device.index)
    if name in DEVICE_TILES_MIN_EDGES:
        return DEVICE_TILES_MIN_EDGES[name], name
    for measured, value in DEVICE_TILES_MIN_EDGES.items():
        return value, f"{measured} (not measured on {name})"
    return TILES_MIN_EDGES, f"cpu (not measured on {name})"


@functools.cache
def _device_name(index: Optional[int]) -> str:
    return torch.cuda.get_device_name(index)


def triton_runs(device: torch.device) -> bool:
    """Whether Triton kernels can run on :obj:`device`: Triton is installed
    and the device is a GPU, or its interpreter is on (CPU tensors,
    ``TRITON_INTERPRET=1``)."""
    if not WITH_TRITON:
        return False
    if device.type == "cuda":
        return True
    import triton
    return device.type == "cpu" and bool(triton.knobs.runtime.interpret)


def dense_runs(device: torch.device) -> bool:
    """Whether the dense-regime kernel runs on :obj:`device`: the compiled
    extension's on the CPU, the Triton one on CUDA."""
    if device.type == "cpu":
        return WITH_EXTENSION
    return device.type == "cuda" and WITH_TRITON


_WARNED: Dict[str, bool] = {}


def _warn_no_triton() -> None:
    # Said once, as the missing extension is: without it nothing would tell
    # that CUDA tensors run the reference path.
    if not _WARNED.get("triton"):
        _WARNED["triton"] = True
        warnings.warn(
            "sbm_pyg: triton is not installed, so on CUDA the sampler and the "
            "attention run their pure-PyTorch path, several times slower. "
            "Install triton (pip install triton) for the CUDA kernels.",
            RuntimeWarning, stacklevel=3)


def resolve_backend(op: str, backend: Optional[str],
                    device: Union[torch.device, str], static: bool = False) -> str:
    r"""The kernel that runs :obj:`op` for tensors on :obj:`device`: the one
    place where a backend is chosen, for the sampler and the attention
    alike (as FlexAttention validates its kernel options in one place).

    * :obj:`"auto"` (or :obj:`None`): :obj:`"cpp"` on the CPU where the
      compiled extension is built, :obj:`"triton"` on CUDA where Triton is
      installed, else :obj:`"torch"` (on CUDA with a warning, once: the
      PyTorch path is several times slower); every one of them has
      attention dropout. (The dense regime by expected density, from
      :func:`dense_crossover` on, is :func:`~sbm_pyg.nn.sbm_attention`'s
      choice per (sequence, head).)
    * :obj:`"cpp"`: the compiled extension ``sbm_pyg._C`` (CPU tensors).
    * :obj:`"triton"`: the Triton kernels (CUDA tensors, or CPU tensors
      under ``TRITON_INTERPRET=1``).
    * :obj:`"torch"`: pure PyTorch, any device: the reference.
    * :obj:`"dense"` (attention only): the dense-regime kernel, which
      samples the mask itself: the compiled extension's on CPU tensors, the
      Triton one on CUDA.

    With :obj:`static=True` (the sampler only) the choice is the static
    sampler's (:func:`~sbm_pyg.sampling.fastrg_static`, one of
    :data:`STATIC_BACKENDS`): :obj:`"auto"` takes :obj:`"cpp"` on the CPU
    where the extension is built, else :obj:`"torch"` (on a GPU the one a
    captured graph replays); it has no :obj:`"triton"`.

    Args:
        op (str): :obj:`"sampler"` or :obj:`"attention"`.
        backend (str, optional): one of :data:`BACKENDS` (for the
            attention :data:`ATTENTION_BACKENDS`) or :obj:`None`.
        device (torch.device or str): where the tensors are.
        static (bool): the static sampler's backend. (default: :obj:`False`)

    Returns:
        :obj:`"cpp"`, :obj:`"triton"`, :obj:`"torch"` or :obj:`"dense"`.

    Raises:
        ValueError: an unknown name, or a backend that cannot run here
            (not built, another device).

    Example:
        >>> resolve_backend("attention", "torch", "cpu")
        'torch'
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if static and op != "sampler":
        raise ValueError(f"static=True chooses the sampler's backend, not the {op}'s")
    choices = (ATTENTION_BACKENDS if op == "attention"
               else STATIC_BACKENDS if static else BACKENDS)
    if backend is not None and backend not in choices:
        raise ValueError(f"{op} backend must be one of {choices}, got "
                         f"{backend!r}")
    device = torch.device(device)
    if backend is None or backend == "auto":
        if device.type == "cpu" and WITH_EXTENSION:
            return "cpp"
        if static:
            return "torch"
        if device.type == "cuda" and WITH_TRITON:
            return "triton"
        if device.type == "cuda":
            _warn_no_triton()
        return "torch"
    if backend == "dense" and device.type == "cuda":
        if not WITH_TRITON:
            raise ValueError(f"{op} backend 'dense' needs triton on CUDA")
    elif backend in ("cpp", "dense"):
        if not WITH_EXTENSION:
            raise ValueError(f"{op} backend {backend!r} needs the compiled "
                             f"extension (sbm_pyg._C), which is not built; "
                             f"reinstall with a C++ compiler: pip install "
                             f"--no-build-isolation .")
        if device.type != "cpu":
            raise ValueError(f"{op} backend {backend!r} runs on the CPU"
                             + (" and CUDA" if backend == "dense" else "")
                             + f"; the tensors are on {device}")
    if backend == "triton" and not triton_runs(device):
        raise ValueError(f"{op} backend 'triton' needs triton and CUDA "
                         f"tensors (or TRITON_INTERPRET=1 on the CPU); the "
                         f"tensors are on {device}")
    return backend


def backends(device: Union[torch.device, str] = "cpu") -> Dict[str, str]:
    r"""The kernels that :obj:`"auto"` runs for tensors on :obj:`device`
    (:func:`resolve_backend`).

    Returns:
        :obj:`{"sampler": ..., "attention": ...}`, each :obj:`"cpp"`,
        :obj:`"triton"` or :obj:`"torch"`.

    Example:
        >>> from sbm_pyg.ops import backends
        >>> sorted(backends("cpu"))
        ['attention', 'sampler']
    """
    return {op: resolve_backend(op, "auto", device) for op in OPS}
