r"""Laplacian eigenvector positional encodings as GraphGPS computes and
encodes them: the transform that stores them, and the DeepSet that embeds
them with a random sign flip."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, Module, ReLU, Sequential
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.transforms.add_positional_encoding import add_node_attr

__all__ = ["AddLaplacianPE", "LapPEEncoder"]


class AddLaplacianPE(BaseTransform):
    r"""Laplacian eigenvector positional encodings as GraphGPS computes them:
    the eigenvectors of the unnormalised Laplacian
    :math:`\mathbf{L} = \mathbf{D} - \mathbf{A}` for its :obj:`k` smallest
    eigenvalues :math:`(N, k)`, each L2-normalised, stored as
    :obj:`data[attr_name]`, and the eigenvalues, repeated per node
    :math:`(N, k)`, as :obj:`data[eigvals_attr_name]`; graphs of fewer than
    :obj:`k` nodes are padded with NaN, as GraphGPS pads them
    (:class:`LapPEEncoder` masks them).

    Where GraphGPS's encoding differs from PyG's
    :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE` (which
    to use where those semantics are wanted): the unnormalised Laplacian
    (PyG: symmetric-normalised), the first (constant) eigenvector kept (PyG
    drops it), the eigenvalues stored (PyG: none), no sign drawn here
    (:class:`LapPEEncoder` flips signs in training from the run's
    generator; PyG draws one sign per graph from the global RNG), and
    padding for small graphs (PyG needs :math:`N > k`). The attribute
    names follow PyG's :obj:`attr_name` convention. The eigendecomposition
    is dense (:math:`O(N^3)` per graph): meant for graphs of hundreds of
    nodes, as a pre-transform.

    Args:
        k (int): the number of eigenvectors (GraphGPS: 16 on PATTERN, 10 on
            CLUSTER).
        attr_name (str, optional): the attribute for the eigenvectors; with
            :obj:`None` they are concatenated to :obj:`data.x`, as PyG's
            transforms do, with zeros for the padding (:obj:`x` stays
            finite). (default: :obj:`"eigvecs"`)
        eigvals_attr_name (str, optional): the attribute for the
            eigenvalues; :obj:`None` stores none. (default: :obj:`"eigvals"`)

    Example:
        >>> from torch_geometric.data import Data
        >>> ring = torch.tensor([[0, 1, 2, 1, 2, 0], [1, 2, 0, 0, 1, 2]])
        >>> data = AddLaplacianPE(2)(Data(edge_index=ring, num_nodes=3))
        >>> data.eigvecs.shape, data.eigvals[0]
        (torch.Size([3, 2]), tensor([0., 3.]))
    """

    def __init__(self, k: int, attr_name: Optional[str] = "eigvecs",
                 eigvals_attr_name: Optional[str] = "eigvals"):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        for name, value in (("attr_name", attr_name),
                            ("eigvals_attr_name", eigvals_attr_name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty str or None, "
                                 f"got {value!r}")
        if attr_name is not None and attr_name == eigvals_attr_name:
            raise ValueError(f"attr_name and eigvals_attr_name must differ, "
                             f"both are {attr_name!r}")
        self.k, self.attr_name = k, attr_name
        self.eigvals_attr_name = eigvals_attr_name

    def forward(self, data: Data) -> Data:
        r"""Adds the eigenvectors and eigenvalues to :obj:`data`."""
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
        pad = (0, self.k - k)
        if self.attr_name is None:
            add_node_attr(data, F.pad(evecs, pad).float(), None)
        else:
            data[self.attr_name] = F.pad(evecs, pad, value=float("nan")).float()
        if self.eigvals_attr_name is not None:
            evals = F.pad(evals, pad, value=float("nan")).float()
            data[self.eigvals_attr_name] = evals.expand(N, self.k).contiguous()
        return data

    def __repr__(self) -> str:
        # The names only where not the defaults: a dataset cached with this
        # transform compares its repr (PyG warns where it differs).
        names = "".join(f", {key}={value!r}" for key, value, default in (
            ("attr_name", self.attr_name, "eigvecs"),
            ("eigvals_attr_name", self.eigvals_attr_name, "eigvals"))
            if value != default)
        return f"{self.__class__.__name__}(k={self.k}{names})"


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
