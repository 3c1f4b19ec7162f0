r"""Laplacian eigenvector positional encodings as GraphGPS computes and
encodes them: the transform that stores them, and the DeepSet that embeds
them with a random sign flip."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.nn import Linear, Module, ReLU, Sequential
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = ["AddLaplacianPE", "LapPEEncoder"]


class AddLaplacianPE(BaseTransform):
    r"""Stores the eigenvectors of the unnormalised Laplacian
    :math:`\mathbf{L} = \mathbf{D} - \mathbf{A}` for its :obj:`k` smallest
    eigenvalues as :obj:`data.eigvecs` :math:`(N, k)` (each L2-normalised)
    and the eigenvalues, repeated per node, as :obj:`data.eigvals`
    :math:`(N, k)`; graphs of fewer than :obj:`k` nodes are padded with NaN,
    as GraphGPS pads them (:class:`LapPEEncoder` masks them).

    Unlike PyG's :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE`
    it keeps the first (constant) eigenvector and the eigenvalues, and
    draws no sign: :class:`LapPEEncoder` flips signs in training from the
    run's generator. The eigendecomposition is dense (:math:`O(N^3)` per
    graph): meant for graphs of hundreds of nodes, as a pre-transform.

    Args:
        k (int): the number of eigenvectors (GraphGPS: 16 on PATTERN, 10 on
            CLUSTER).
    """

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k

    def forward(self, data: Data) -> Data:
        r"""Adds :obj:`eigvecs` and :obj:`eigvals` to :obj:`data`."""
        N = data.num_nodes
        if N is None or N < 1:
            raise ValueError("data must have at least one node")
        ei = data.edge_index
        adj = torch.zeros(N, N, dtype=torch.float64)
        adj.index_put_((ei[0], ei[1]), torch.ones(ei.size(1), dtype=torch.float64),
                       accumulate=True)
        laplacian = torch.diag(adj.sum(1)) - adj
        evals, evecs = torch.linalg.eigh(laplacian)  # ascending
        k = min(self.k, N)
        evals, evecs = evals[:k].clamp_min(0), evecs[:, :k]
        evecs = evecs / evecs.norm(dim=0, keepdim=True).clamp_min(1e-12)
        pad = self.k - k
        evecs = torch.nn.functional.pad(evecs, (0, pad), value=float("nan"))
        evals = torch.nn.functional.pad(evals, (0, pad), value=float("nan"))
        data.eigvecs = evecs.float()
        data.eigvals = evals.float().expand(N, self.k).contiguous()
        return data

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(k={self.k})"


class LapPEEncoder(Module):
    r"""GraphGPS's DeepSet over Laplacian eigenpairs: each pair
    :math:`(\mathbf{u}_{i,m}, \lambda_m)` through
    :math:`\mathrm{Linear}(2, 2D) \to \mathrm{ReLU} \to \mathrm{Linear}(2D,
    D) \to \mathrm{ReLU}`, summed over the :math:`k` pairs (NaN padding
    counts as nothing). In training each eigenvector's sign is flipped with
    probability 1/2, one draw per eigenvector and batch, from
    :obj:`generator` (the eigenvectors' signs are arbitrary).

    Args:
        out_channels (int): :math:`D`. (default: :obj:`16`)

    Shapes:
        - **input:** :obj:`eigvecs`, :obj:`eigvals` :math:`(N, k)`
        - **output:** :math:`(N, D)`
    """

    def __init__(self, out_channels: int = 16):
        super().__init__()
        if not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"out_channels must be a positive int, got "
                             f"{out_channels!r}")
        self.out_channels = out_channels
        self.lin = Linear(2, 2 * out_channels)
        self.deepset = Sequential(ReLU(), Linear(2 * out_channels, out_channels),
                                  ReLU())

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        self.lin.reset_parameters()
        for layer in self.deepset:
            if isinstance(layer, Linear):
                layer.reset_parameters()

    def forward(self, eigvecs: Tensor, eigvals: Tensor,
                generator: Optional[torch.Generator] = None) -> Tensor:
        r"""The encoding of each node, :math:`(N, D)`."""
        if eigvecs.dim() != 2 or eigvecs.shape != eigvals.shape:
            raise ValueError(f"eigvecs and eigvals must both be (N, k), got "
                             f"{tuple(eigvecs.shape)} and {tuple(eigvals.shape)}")
        if self.training:
            flip = torch.rand(eigvecs.size(1), generator=generator,
                              device=eigvecs.device) < 0.5
            eigvecs = torch.where(flip, -eigvecs, eigvecs)
        pairs = torch.stack([eigvecs, eigvals], dim=2)  # [N, k, 2]
        empty = torch.isnan(pairs).any(2, keepdim=True)
        out = self.deepset(self.lin(pairs.masked_fill(empty, 0.0)))
        return out.masked_fill(empty, 0.0).sum(1)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.out_channels})"
