"""sbm_pyg: SBM-Transformer attention as PyTorch Geometric components."""
from sbm_pyg.nn import (
    DensityBudget,
    SBMConv,
    SBMGPSConv,
    SBMMultiheadAttention,
    StochasticBlockModel,
    density_loss,
    distillation_loss,
)
from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg.sampling import SampledGraph, bernoulli, expected_adjacency, fastrg

__version__ = "0.1.0"

# Loaded on first use: the theory checks need networkx, the experiments the
# training loop; neither is needed to use the layers.
_LAZY_SUBMODULES = ("theory", "experiments", "models", "datasets")

__all__ = [
    "SampledGraph",
    "fastrg",
    "bernoulli",
    "expected_adjacency",
    "edge_probability",
    "sparse_attention",
    "StochasticBlockModel",
    "SBMConv",
    "SBMMultiheadAttention",
    "SBMGPSConv",
    "density_loss",
    "DensityBudget",
    "distillation_loss",
    "models",
    "datasets",
    "experiments",
    "theory",
]


def __getattr__(name: str) -> object:
    # (importlib imported here: the package's namespace is its API)
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"sbm_pyg.{name}")
    raise AttributeError(f"module 'sbm_pyg' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY_SUBMODULES))
