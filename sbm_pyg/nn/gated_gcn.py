r"""The residual gated graph convolution with edge features of GraphGPS."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import BatchNorm1d, Linear
from torch_geometric.nn.conv import MessagePassing

from sbm_pyg.validation import require_tensor

__all__ = ["GatedGCNConv"]


class GatedGCNConv(MessagePassing):
    r"""The GatedGCN layer of `"Residual Gated Graph ConvNets"
    <https://arxiv.org/abs/1711.07553>`_ as `GraphGPS
    <https://arxiv.org/abs/2205.12454>`_ runs it on PATTERN and CLUSTER:
    edge features gate the messages, the gates are normalised over each
    node's neighbours, and the edge features are updated too.

    .. math::
        \hat{\mathbf{e}}_{ij} &= \mathbf{D}\mathbf{x}_i + \mathbf{E}\mathbf{x}_j
        + \mathbf{C}\mathbf{e}_{ij}, \qquad
        \boldsymbol{\sigma}_{ij} = \mathrm{sigmoid}(\hat{\mathbf{e}}_{ij}) \\
        \hat{\mathbf{x}}_i &= \mathbf{A}\mathbf{x}_i + \frac{\sum_{j \in
        \mathcal{N}(i)} \boldsymbol{\sigma}_{ij} \odot \mathbf{B}\mathbf{x}_j}
        {\sum_{j \in \mathcal{N}(i)} \boldsymbol{\sigma}_{ij} + \epsilon} \\
        \mathbf{x}^{\prime}_i &= \mathbf{x}_i + \mathrm{dropout}\big(
        \mathrm{ReLU}(\mathrm{BN}(\hat{\mathbf{x}}_i))\big), \qquad
        \mathbf{e}^{\prime}_{ij} = \mathbf{e}_{ij} + \mathrm{dropout}\big(
        \mathrm{ReLU}(\mathrm{BN}(\hat{\mathbf{e}}_{ij}))\big)

    with :math:`\epsilon = 10^{-6}`, for messages from :math:`j` to
    :math:`i` (edge :math:`(j, i)` in :obj:`edge_index`).

    Args:
        channels (int): size of node and edge features.
        dropout (float): dropout after the activation. (default: :obj:`0.`)
        residual (bool): add the inputs to the outputs. (default: :obj:`True`)
        batch_norm (bool): batch-normalise node and edge features.
            (default: :obj:`True`)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, C)`, edge indices
          :math:`(2, |\mathcal{E}|)`, edge features :math:`(|\mathcal{E}|, C)`
        - **output:** node features :math:`(|\mathcal{V}|, C)` and edge
          features :math:`(|\mathcal{E}|, C)`

    Example:
        >>> conv = GatedGCNConv(8)
        >>> x, edge_attr = torch.randn(4, 8), torch.randn(3, 8)
        >>> edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> out, edge_out = conv(x, edge_index, edge_attr)
        >>> out.shape, edge_out.shape
        (torch.Size([4, 8]), torch.Size([3, 8]))
    """

    def __init__(self, channels: int, dropout: float = 0.0,
                 residual: bool = True, batch_norm: bool = True):
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        super().__init__(aggr="add", node_dim=0)
        self.channels, self.dropout = channels, dropout
        self.residual, self.batch_norm = residual, batch_norm
        # A, B, D, E on the nodes in one matrix; C on the edges.
        self.lin_node = Linear(channels, 4 * channels)
        self.lin_edge = Linear(channels, channels)
        self.bn_node = BatchNorm1d(channels) if batch_norm else None
        self.bn_edge = BatchNorm1d(channels) if batch_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        super().reset_parameters()
        self.lin_node.reset_parameters()
        self.lin_edge.reset_parameters()
        for bn in (self.bn_node, self.bn_edge):
            if bn is not None:
                bn.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor,
                edge_attr: Tensor) -> Tuple[Tensor, Tensor]:
        r"""The updated node features and edge features."""
        require_tensor("x", x, 2, floating=True)
        require_tensor("edge_attr", edge_attr, 2, floating=True)
        C = self.channels
        if x.size(1) != C or edge_attr.size(1) != C:
            raise ValueError(f"x and edge_attr must have {C} channels, got "
                             f"{x.size(1)} and {edge_attr.size(1)}")
        if edge_attr.size(0) != edge_index.size(1):
            raise ValueError(f"edge_attr must have one row per edge "
                             f"({edge_index.size(1)}), got {edge_attr.size(0)}")
        Ax, Bx, Dx, Ex = self.lin_node(x).split(C, dim=1)
        src, dst = edge_index[0], edge_index[1]
        # index_select, not x[index]: the latter's backward accumulates in
        # an order that varies between runs on the CPU.
        e_hat = (Dx.index_select(0, dst) + Ex.index_select(0, src)
                 + self.lin_edge(edge_attr))
        sigma = torch.sigmoid(e_hat)
        # Numerator and denominator in one aggregation.
        both = self.propagate(edge_index, value=Bx,
                              gate=sigma, size=(x.size(0), x.size(0)))
        num, den = both.split(C, dim=1)
        h, e = Ax + num / (den + 1e-6), e_hat
        if self.bn_node is not None and self.bn_edge is not None:
            h, e = self.bn_node(h), self.bn_edge(e)
        h = F.dropout(F.relu(h), self.dropout, self.training)
        e = F.dropout(F.relu(e), self.dropout, self.training)
        if self.residual:
            h, e = x + h, edge_attr + e
        return h, e

    def message(self, value_j: Tensor, gate: Tensor) -> Tensor:
        r"""Each edge's gated value and its gate, summed into the
        numerator and the denominator at once."""
        return torch.cat([gate * value_j, gate], dim=1)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.channels}, dropout={self.dropout})"
