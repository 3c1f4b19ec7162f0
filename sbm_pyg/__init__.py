"""sbm_pyg: SBM-Transformer attention as PyTorch Geometric components."""
from sbm_pyg.sampling import SampledGraph, bernoulli, expected_adjacency, fastrg
from sbm_pyg.nn import (
    SBMConv,
    SBMGPSConv,
    SBMMultiheadAttention,
    StochasticBlockModel,
)
from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg import experiments, models, theory  # noqa: E402  (submodules)

__version__ = "0.1.0"

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
    "models",
    "experiments",
    "theory",
]
