r"""The GPS graph-transformer layer with SBM global attention."""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Linear, Sequential
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj

from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.validation import require_tensor

__all__ = ["SBMGPSConv"]


# SBMConv's own arguments that SBMGPSConv sets itself.
_FIXED_ATTN_ARGS = ("self", "in_channels", "out_channels", "heads", "concat",
                    "root_weight", "kwargs")


def _check_attn_kwargs(attn_kwargs: Dict[str, Any]) -> None:
    # A misspelt key would otherwise reach MessagePassing.__init__, whose
    # error names the wrong class.
    allowed = {name for cls in (SBMConv, MessagePassing)
               for name in inspect.signature(cls.__init__).parameters
               if name not in _FIXED_ATTN_ARGS + ("node_dim",)}
    unknown = sorted(set(attn_kwargs) - allowed)
    if unknown:
        hints = {key: difflib.get_close_matches(key, allowed, n=1)
                 for key in unknown}
        hint = "; ".join(f"{key!r}: did you mean {match[0]!r}?"
                         for key, match in hints.items() if match)
        raise TypeError(f"attn_kwargs has keys SBMConv does not take: "
                        f"{unknown}" + (f" ({hint})" if hint else "")
                        + f"; it takes {sorted(allowed)}")


class SBMGPSConv(torch.nn.Module):
    r"""The GPS layer of `"Recipe for a General, Powerful, Scalable Graph
    Transformer" <https://arxiv.org/abs/2205.12454>`_ (PyG's
    :class:`~torch_geometric.nn.conv.GPSConv`) whose global attention is SBM
    attention (:class:`SBMConv`) run directly on the PyG batch: ragged, no
    :func:`~torch_geometric.utils.to_dense_batch`, no padding, no attention
    edge between graphs.

    .. math::
        \mathbf{h}^{L} &= \mathrm{norm}_1\big(\mathrm{MPNN}(\mathbf{x},
        \mathcal{E}) + \mathbf{x}\big) \\
        \mathbf{h}^{G} &= \mathrm{norm}_2\big(\mathbf{W}^O \big\Vert_{h=1}^{H}
        \mathrm{SBMAttn}_h(\mathbf{x}) + \mathbf{x}\big) \\
        \mathbf{x}^{\prime} &= \mathrm{norm}_3\big(\mathbf{h} +
        \mathrm{MLP}(\mathbf{h})\big), \qquad \mathbf{h} = \mathbf{h}^{L} +
        \mathbf{h}^{G}

    Each head attends over the graph :math:`\mathcal{N}_h(i)` it samples from
    its SBM within :math:`i`'s graph, optionally united with the input
    edges :math:`\mathcal{E}` (:obj:`include_input_edges`). Dropout follows
    the MPNN, the attention and each MLP layer, as in GPSConv.

    Args:
        channels (int): size :math:`C` of each node feature.
        conv (MessagePassing, optional): the local message passing layer
            (:obj:`None`: attention and MLP only).
        heads (int): attention heads; must divide :obj:`channels`.
            (default: :obj:`1`)
        dropout (float): dropout of intermediate embeddings. (default:
            :obj:`0.`)
        act (str or Callable): activation of the MLP. (default: :obj:`"relu"`)
        act_kwargs (Dict[str, Any], optional): its arguments.
        norm (str or Callable, optional): normalization. (default:
            :obj:`"batch_norm"`)
        norm_kwargs (Dict[str, Any], optional): its arguments.
        attn_kwargs (Dict[str, Any], optional): arguments of
            :class:`SBMConv`: :obj:`num_clusters`, :obj:`dropout` (on the
            attention weights), :obj:`exploration`, :obj:`self_loops`,
            :obj:`mode`, :obj:`max_edges`.
        include_input_edges (bool): add the input :obj:`edge_index` to every
            head's attention graph, without duplicates (structure-aware
            attention). (default: :obj:`False`)

    After each forward, :obj:`sampled_density` and :obj:`expected_density`
    :math:`[H]` hold the attention's densities (the latter differentiable:
    add :math:`\lambda` times its mean to the loss to penalize edges).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, C)`, edge indices
          :math:`(2, |\mathcal{E}|)`, batch vector :math:`(|\mathcal{V}|)`
          (sorted, as PyG's loaders make it; :obj:`None`: one graph)
        - **output:** node features :math:`(|\mathcal{V}|, C)`

    Example:
        >>> from torch_geometric.nn import GINConv
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
        ...                           torch.nn.Linear(16, 16))
        >>> layer = SBMGPSConv(16, GINConv(mlp), heads=2,
        ...                    attn_kwargs=dict(num_clusters=4))
        >>> x = torch.randn(6, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 0, 4, 5]])
        >>> batch = torch.tensor([0, 0, 0, 1, 1, 1])
        >>> layer(x, edge_index, batch).shape
        torch.Size([6, 16])
    """

    def __init__(
        self,
        channels: int,
        conv: Optional[MessagePassing],
        heads: int = 1,
        dropout: float = 0.0,
        act: str = "relu",
        act_kwargs: Optional[Dict[str, Any]] = None,
        norm: Optional[str] = "batch_norm",
        norm_kwargs: Optional[Dict[str, Any]] = None,
        attn_kwargs: Optional[Dict[str, Any]] = None,
        include_input_edges: bool = False,
    ):
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        if not isinstance(heads, int) or heads < 1 or channels % heads:
            raise ValueError(f"heads must be a positive int dividing channels "
                             f"({channels}), got {heads!r}")
        self.channels, self.conv, self.heads = channels, conv, heads
        self.dropout = dropout
        self.include_input_edges = include_input_edges
        # As MultiheadAttention: per-head projections of size C / H, then an
        # output projection.
        attn_kwargs = dict(attn_kwargs or {})
        _check_attn_kwargs(attn_kwargs)
        self.attn = SBMConv(channels, channels // heads, heads, concat=True,
                            root_weight=False, **attn_kwargs)
        self.attn_out = Linear(channels, channels)
        self.mlp = Sequential(
            Linear(channels, channels * 2),
            activation_resolver(act, **(act_kwargs or {})),
            Dropout(dropout),
            Linear(channels * 2, channels),
            Dropout(dropout),
        )
        norm_kwargs = norm_kwargs or {}
        self.norm1 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm2 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm3 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm_with_batch = self.norm1 is not None and "batch" in (
            inspect.signature(self.norm1.forward).parameters)

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        if self.conv is not None:
            self.conv.reset_parameters()
        self.attn.reset_parameters()
        self.attn_out.reset_parameters()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()

    @property
    def sampled_density(self) -> Optional[Tensor]:
        """Per-head sampled density of the last forward, :obj:`[H]`."""
        return self.attn.sampled_density

    @property
    def last_backends(self) -> Optional[Dict[str, str]]:
        """The kernels of the last forward, e.g. :obj:`{'sampler': 'cpp',
        'attention': 'cpp'}` (:attr:`SBMConv.last_backends`)."""
        return self.attn.last_backends

    @property
    def expected_density(self) -> Optional[Tensor]:
        """Per-head expected density of the last forward (differentiable)."""
        return self.attn.expected_density

    def _norm(self, norm, h: Tensor, batch: Optional[Tensor]) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Adj,
                batch: Optional[Tensor] = None, *,
                generator: Optional[torch.Generator] = None,
                **kwargs) -> Tensor:
        r"""Runs the layer; :obj:`kwargs` go to the local :obj:`conv`,
        :obj:`generator` to the sampler and attention dropout."""
        require_tensor("x", x, 2, floating=True)
        if x.size(1) != self.channels:
            raise ValueError(f"x must have {self.channels} channels, got "
                             f"{x.size(1)}")
        # Any structure input PyG layers take (edge_index, EdgeIndex,
        # SparseTensor or torch.sparse adj_t); fastrg reads its pairs.
        include = edge_index if self.include_input_edges else None
        hs = []
        if self.conv is None and kwargs:
            raise TypeError(f"{sorted(kwargs)} would go to the local conv, but "
                            f"this layer has conv=None")
        if self.conv is not None:  # local MPNN
            h = self.conv(x, edge_index, **kwargs)
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))

        h = self.attn(x, batch, include_edges=include, generator=generator)
        h = F.dropout(self.attn_out(h), p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))

        out = sum(hs)
        return self._norm(self.norm3, out + self.mlp(out), batch)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
                f"heads={self.heads}, num_clusters={self.attn.num_clusters}, "
                f"include_input_edges={self.include_input_edges})")
