r"""The GPS graph-transformer layer with SBM global attention."""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Linear, MultiheadAttention, Sequential
from torch_geometric.nn.attention import PerformerAttention
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj
from torch_geometric.utils import to_dense_batch

from sbm_pyg.nn.bigbird import BigBirdAttention
from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.validation import require_tensor

__all__ = ["SBMGPSConv", "EdgeGPSConv"]

Output = Union[Tensor, Tuple[Tensor, Tensor]]


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


class _GPSLayer(torch.nn.Module):
    # GPSConv's layout around a global attention that subclasses supply
    # (_attend): local MPNN, attention and MLP, residuals, norms, dropout.
    # A subclass that exists for edge-updating convs only sets this.
    _EDGE_UPDATING = False

    def __init__(self, channels: int, conv: Optional[MessagePassing],
                 heads: int, dropout: float, act: str,
                 act_kwargs: Optional[Dict[str, Any]], norm: Optional[str],
                 norm_kwargs: Optional[Dict[str, Any]]):
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        if not isinstance(heads, int) or heads < 1 or channels % heads:
            raise ValueError(f"heads must be a positive int dividing channels "
                             f"({channels}), got {heads!r}")
        self.channels, self.conv, self.heads = channels, conv, heads
        self.dropout = dropout
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
        self._reset_attention()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()

    def _reset_attention(self) -> None:
        raise NotImplementedError

    def _attend(self, x: Tensor, edge_index: Adj, batch: Optional[Tensor],
                generator: Optional[torch.Generator],
                batch_size: Optional[int]) -> Optional[Tensor]:
        raise NotImplementedError

    def _norm(self, norm, h: Tensor, batch: Optional[Tensor]) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Adj,
                batch: Optional[Tensor] = None, *,
                generator: Optional[torch.Generator] = None,
                batch_size: Optional[int] = None,
                return_edge_attr: bool = False, **kwargs) -> Output:
        r"""Runs the layer; :obj:`kwargs` (e.g. :obj:`edge_attr`) go to the
        local :obj:`conv`, :obj:`generator` to the attention's randomness,
        :obj:`batch_size` (PyG's :obj:`Batch.num_graphs`, optional) to the
        attention, which then reads nothing off the batch vector.
        Returns the node features, as :class:`GPSConv` does; with
        :obj:`return_edge_attr=True` (an edge-updating local conv, which
        returns :obj:`(x, edge_attr)`) the pair :obj:`(x', edge_attr')`,
        so that the next layer gets the updated edge features."""
        require_tensor("x", x, 2, floating=True)
        if x.size(1) != self.channels:
            raise ValueError(f"x must have {self.channels} channels, got "
                             f"{x.size(1)}")
        if self.conv is None and kwargs:
            raise TypeError(f"{sorted(kwargs)} would go to the local conv, but "
                            f"this layer has conv=None")
        hs, edge_attr = [], None
        if self.conv is not None:  # local MPNN
            h = self.conv(x, edge_index, **kwargs)
            if isinstance(h, tuple):  # edge-updating: its own residual, dropout
                h, edge_attr = h
            elif self._EDGE_UPDATING:
                raise TypeError(f"{type(self.conv).__name__} returned a Tensor, "
                                f"not (x, edge_attr): for a conv that does not "
                                f"update edge features use "
                                f"torch_geometric.nn.GPSConv")
            else:
                h = F.dropout(h, p=self.dropout, training=self.training) + x
            hs.append(self._norm(self.norm1, h, batch))
        h = self._attend(x, edge_index, batch, generator, batch_size)
        if h is not None:
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm2, h + x, batch))
        if not hs:
            raise ValueError("a layer without a local conv needs a global attention")
        out = sum(hs)
        out = self._norm(self.norm3, out + self.mlp(out), batch)
        if not return_edge_attr:
            return out
        if edge_attr is None:
            raise ValueError("return_edge_attr=True needs a local conv that "
                             "returns (x, edge_attr), such as GatedGCNConv")
        return out, edge_attr


class SBMGPSConv(_GPSLayer):
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

    A local :obj:`conv` that returns :obj:`(x, edge_attr)`, such as
    :class:`GatedGCNConv`, updates edge features: it is taken to apply its
    own dropout and residual (as GraphGPS's GatedGCN does). The layer
    returns the node features, a Tensor, as :class:`GPSConv` does; pass
    :obj:`return_edge_attr=True` for :obj:`(x', edge_attr')`, so that the
    next layer gets the updated edge features.

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
            :obj:`mode`, :obj:`max_edges`, :obj:`init_density` (a large
            graph's start, e.g. :obj:`64 / n`).
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
        - **output:** node features :math:`(|\mathcal{V}|, C)` (and edge
          features :math:`(|\mathcal{E}|, C)` with
          :obj:`return_edge_attr=True`)

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
        super().__init__(channels, conv, heads, dropout, act, act_kwargs,
                         norm, norm_kwargs)
        self.include_input_edges = include_input_edges
        # As MultiheadAttention: per-head projections of size C / H, then an
        # output projection.
        attn_kwargs = dict(attn_kwargs or {})
        _check_attn_kwargs(attn_kwargs)
        self.attn = SBMConv(channels, channels // heads, heads, concat=True,
                            root_weight=False, **attn_kwargs)
        self.attn_out = Linear(channels, channels)

    def _reset_attention(self) -> None:
        self.attn.reset_parameters()
        self.attn_out.reset_parameters()

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

    def _attend(self, x: Tensor, edge_index: Adj, batch: Optional[Tensor],
                generator: Optional[torch.Generator],
                batch_size: Optional[int]) -> Optional[Tensor]:
        # Any structure input PyG layers take (edge_index, EdgeIndex,
        # SparseTensor or torch.sparse adj_t); fastrg reads its pairs.
        include = edge_index if self.include_input_edges else None
        return self.attn_out(self.attn(x, batch, include_edges=include,
                                       batch_size=batch_size, generator=generator))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
                f"heads={self.heads}, num_clusters={self.attn.num_clusters}, "
                f"include_input_edges={self.include_input_edges})")


ATTENTIONS = ("multihead", "performer", "bigbird")


class EdgeGPSConv(_GPSLayer):
    r"""PyG's :class:`~torch_geometric.nn.conv.GPSConv` for a local
    :obj:`conv` that updates edge features: one that returns
    :obj:`(x, edge_attr)`, such as :class:`GatedGCNConv` (GraphGPS's local
    layer on PATTERN and CLUSTER). :class:`GPSConv` needs its conv to return
    a Tensor; for such a conv use it directly. The global attention is
    GPSConv's, built from the same arguments, on the padded batch
    (:func:`~torch_geometric.utils.to_dense_batch`):
    :class:`torch.nn.MultiheadAttention` (:obj:`"multihead"`, :math:`O(N^2)`
    per graph) or PyG's :class:`~torch_geometric.nn.attention.PerformerAttention`
    (:obj:`"performer"`, linear), BigBird's fixed sparse pattern in node
    order (:class:`~sbm_pyg.nn.BigBirdAttention`, :obj:`"bigbird"`: window,
    global and random keys at :obj:`attn_kwargs["density"]` of each graph's
    pairs, on the same kernels as SBM attention), or none (:obj:`None`:
    local MPNN and MLP only, an ablation GPSConv does not offer). This is
    the baseline that :class:`SBMGPSConv` with the same local conv is
    compared with.

    .. math::
        \mathbf{h}^{L}, \mathbf{e}^{\prime} &= \mathrm{MPNN}(\mathbf{x},
        \mathbf{e}, \mathcal{E}), \qquad \mathbf{h}^{G} =
        \mathrm{norm}_2\big(\mathrm{Attn}(\mathbf{x}) + \mathbf{x}\big) \\
        \mathbf{x}^{\prime} &= \mathrm{norm}_3\big(\mathbf{h} +
        \mathrm{MLP}(\mathbf{h})\big), \qquad \mathbf{h} =
        \mathrm{norm}_1(\mathbf{h}^{L}) + \mathbf{h}^{G}

    The local conv applies its own residual and dropout (as GraphGPS's
    GatedGCN does); everything else is GPSConv's, parameter for parameter
    (the same state-dict keys).

    Args:
        channels (int): size :math:`C` of each node feature.
        conv (MessagePassing): the edge-updating local message passing layer.
        heads (int): attention heads. (default: :obj:`1`)
        dropout (float): dropout of intermediate embeddings. (default: :obj:`0.`)
        act, act_kwargs, norm, norm_kwargs: as in :class:`GPSConv`.
        attn_type (str, optional): :obj:`"multihead"`, :obj:`"performer"`,
            :obj:`"bigbird"` or :obj:`None`. (default: :obj:`"multihead"`)
        attn_kwargs (Dict[str, Any], optional): arguments of the attention
            layer, as in :class:`GPSConv` (e.g. :obj:`dropout`; the
            performer's :obj:`head_channels`; BigBird's :obj:`density`,
            required, its heads of :math:`C / H` channels).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, C)`, edge indices
          :math:`(2, |\mathcal{E}|)`, sorted batch vector :math:`(|\mathcal{V}|)`,
          :obj:`edge_attr` for the local conv
        - **output:** node features :math:`(|\mathcal{V}|, C)` (and edge
          features with :obj:`return_edge_attr=True`)

    Example:
        >>> from sbm_pyg.nn import GatedGCNConv
        >>> layer = EdgeGPSConv(16, GatedGCNConv(16), heads=2)
        >>> x, edge_attr = torch.randn(6, 16), torch.randn(5, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 0, 4, 5]])
        >>> batch = torch.tensor([0, 0, 0, 1, 1, 1])
        >>> out, edge_out = layer(x, edge_index, batch, edge_attr=edge_attr,
        ...                       return_edge_attr=True)
        >>> out.shape, edge_out.shape
        (torch.Size([6, 16]), torch.Size([5, 16]))
    """

    _EDGE_UPDATING = True

    def __init__(
        self,
        channels: int,
        conv: MessagePassing,
        heads: int = 1,
        dropout: float = 0.0,
        act: str = "relu",
        act_kwargs: Optional[Dict[str, Any]] = None,
        norm: Optional[str] = "batch_norm",
        norm_kwargs: Optional[Dict[str, Any]] = None,
        attn_type: Optional[str] = "multihead",
        attn_kwargs: Optional[Dict[str, Any]] = None,
    ):
        super().__init__(channels, conv, heads, dropout, act, act_kwargs,
                         norm, norm_kwargs)
        if conv is None:
            raise ValueError("conv must be a local conv that returns (x, "
                             "edge_attr); without one use "
                             "torch_geometric.nn.GPSConv")
        if attn_type is not None and attn_type not in ATTENTIONS:
            raise ValueError(f"attn_type must be one of {ATTENTIONS} or None, "
                             f"got {attn_type!r}")
        attn_kwargs = dict(attn_kwargs or {})
        if attn_type is None and attn_kwargs:
            raise ValueError(f"attn_kwargs {sorted(attn_kwargs)} need an attn_type")
        self.attn_type = attn_type
        self.attn: Optional[torch.nn.Module] = None
        # Built as GPSConv builds them, so that its state dict loads here.
        if attn_type == "multihead":
            self.attn = MultiheadAttention(channels, heads, batch_first=True,
                                           **attn_kwargs)
        elif attn_type == "performer":
            self.attn = PerformerAttention(channels=channels, heads=heads,
                                           **attn_kwargs)
        elif attn_type == "bigbird":
            if "density" not in attn_kwargs:
                raise ValueError("attn_type='bigbird' needs attn_kwargs['density'], "
                                 "the fraction of each graph's pairs to attend")
            self.attn = BigBirdAttention(channels, heads, channels // heads,
                                         **attn_kwargs)
        else:  # no attention branch to normalize
            self.norm2 = None
        # Drawn once more, as this layer always has: the committed runs of
        # the GPS model start from these weights (GPSConv does not redraw;
        # the distribution is the same).
        self._reset_attention()

    def _reset_attention(self) -> None:
        if isinstance(self.attn, (MultiheadAttention, PerformerAttention)):
            self.attn._reset_parameters()  # both name it so
        elif isinstance(self.attn, BigBirdAttention):
            self.attn.reset_parameters()

    def _attend(self, x: Tensor, edge_index: Adj, batch: Optional[Tensor],
                generator: Optional[torch.Generator],
                batch_size: Optional[int]) -> Optional[Tensor]:
        if self.attn is None:
            return None
        h, mask = to_dense_batch(x, batch, batch_size=batch_size)
        if isinstance(self.attn, MultiheadAttention):
            h, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
        elif isinstance(self.attn, BigBirdAttention):
            h = self.attn(h, mask=mask, generator=generator)
        else:
            h = self.attn(h, mask=mask)
        return h[mask]

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
                f"heads={self.heads}, attn_type={self.attn_type})")
