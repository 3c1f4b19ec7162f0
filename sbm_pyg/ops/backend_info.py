r"""Which kernels are built and which ones run: the one place that says so,
as :mod:`torch_geometric.typing` does for PyG.

* :data:`WITH_EXTENSION`: the compiled extension ``sbm_pyg._C`` was built
  (``setup.py``, ``csrc/``): the fastRG sampler and the fused attention
  for CPU tensors. Without a compiler, or with ``SBM_PYG_NO_EXT=1`` at
  install time, the package runs on its pure-PyTorch path.
* :data:`WITH_TRITON`: Triton imports: fused attention for CUDA tensors.
* :data:`WITH_TORCH_SCATTER`: torch-scatter imports: its segment max is
  used for the PyTorch path's softmax on the CPU.
"""
from __future__ import annotations

import importlib
import os
import warnings
from typing import Any, Dict

import torch

__all__ = ["WITH_EXTENSION", "WITH_TRITON", "WITH_TORCH_SCATTER",
           "extension", "backends"]

# The compiled module sbm_pyg._C (pybind functions of the sampler; its
# attention registers torch.ops.sbm_pyg), or None. Loaded here only.
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


def backends(device: torch.device | str = "cpu") -> Dict[str, str]:
    r"""The kernels that run by default for tensors on :obj:`device`.

    Returns:
        :obj:`{"sampler": ..., "attention": ...}`: the sampler is
        :obj:`"compiled"` (``sbm_pyg._C``) or :obj:`"torch"`; the attention
        is :obj:`"compiled"` (the fused CPU kernel), :obj:`"triton"` (CUDA)
        or :obj:`"torch"`. Attention dropout always runs on
        :obj:`"torch"`, the only path that has it.

    Example:
        >>> from sbm_pyg.ops import backends
        >>> sorted(backends("cpu"))
        ['attention', 'sampler']
    """
    device = torch.device(device)
    cpu = device.type == "cpu"
    if cpu:
        attention = "compiled" if WITH_EXTENSION else "torch"
    else:
        attention = "triton" if WITH_TRITON and device.type == "cuda" else "torch"
    return dict(sampler="compiled" if cpu and WITH_EXTENSION else "torch",
                attention=attention)
