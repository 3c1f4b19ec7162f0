r"""The paper's sparsity regularizer over a whole model."""
from __future__ import annotations

import torch
from torch import Tensor

from sbm_pyg.nn.conv import SBMConv

__all__ = ["density_loss"]


def density_loss(model: torch.nn.Module) -> Tensor:
    r"""The density penalty :math:`L_s` of the paper: the mean expected
    density, over every SBM attention layer and head in :obj:`model`, of
    their last forward pass,

    .. math::
        L_s = \frac{1}{L H} \sum_{l, h} \frac{1}{n_q n_k}
        \sum_{i, j} p^{(l, h)}_{ij},

    differentiable in the SBMs' parameters. Train with
    :obj:`task_loss + lam * density_loss(model)` after the forward pass.

    Args:
        model (torch.nn.Module): any module holding :class:`SBMConv` layers
            (directly, or in :class:`SBMMultiheadAttention` or
            :class:`SBMGPSConv`).

    Returns:
        A scalar tensor.

    Example:
        >>> from sbm_pyg.nn import SBMMultiheadAttention
        >>> model = torch.nn.Sequential(SBMMultiheadAttention(16, heads=2, head_channels=8))
        >>> out = model(torch.randn(2, 5, 16))
        >>> density_loss(model).shape
        torch.Size([])
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    convs = [m for m in model.modules() if isinstance(m, SBMConv)]
    if not convs:
        raise ValueError("model has no SBM attention layer (SBMConv, "
                         "SBMMultiheadAttention or SBMGPSConv)")
    densities = [conv.expected_density for conv in convs]
    if any(d is None for d in densities):
        raise ValueError("density_loss reads the expected density of the "
                         "last forward pass: run the model first")
    return torch.cat([d.reshape(-1) for d in densities if d is not None]).mean()
