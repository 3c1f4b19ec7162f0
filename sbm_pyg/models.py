r"""The SBM-Transformer encoder of the paper's experiments, with the usual
efficient attentions as drop-in baselines, and GraphGPS's node classifier
with SBM or dense global attention."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
from torch import Tensor
from torch.nn import Embedding, LayerNorm, Linear, Module, ModuleList, ReLU, Sequential
from torch_geometric.nn.attention import PerformerAttention

from sbm_pyg.nn import (
    EdgeGPSConv,
    GatedGCNConv,
    LapPEEncoder,
    SBMGPSConv,
    SBMMultiheadAttention,
)
from sbm_pyg.nn.baselines import FullAttention, LinearAttention
from sbm_pyg.nn.bigbird import BigBirdAttention
from sbm_pyg.nn.losses import distillation_loss
from sbm_pyg.validation import require_tensor

__all__ = ["SBMTransformer", "TransformerOutput", "ShortConv", "FullAttention",
           "LinearAttention", "ATTENTIONS", "GPSNodeClassifier",
           "GPS_ATTENTIONS"]

ATTENTIONS = ("sbm", "full", "linear", "performer", "bigbird")


@dataclass
class TransformerOutput:
    r"""What :class:`SBMTransformer` returns.

    Attributes:
        token_logits (Tensor, optional): :math:`(B, N, C_{tok})`.
        seq_logits (Tensor, optional): :math:`(B, C_{seq})`, mean-pooled over
            real tokens.
        sampled_density (Tensor, optional): :math:`(L, H)`, fraction of
            pairs sampled per layer and head (``sbm`` only).
        expected_density (Tensor, optional): :math:`(L, H)`, differentiable
            expected density (``sbm`` only).
        density_loss (Tensor): the paper's regularizer :math:`L_s`, the mean
            expected density over layers and heads (0 for other attentions);
            train with ``task_loss + lam * density_loss``.
        distillation (Tensor, optional): :math:`(L, H)`, the attention
            distillation per layer and head (``sbm`` with :obj:`distill >
            0`, in training; :func:`~sbm_pyg.nn.attention_distillation`).
        distill_loss (Tensor): its mean over heads times :math:`\beta`,
            summed over layers (:func:`~sbm_pyg.nn.distillation_loss`; 0
            without it);
            train with ``task_loss + distill_loss``.
    """

    token_logits: Optional[Tensor]
    seq_logits: Optional[Tensor]
    sampled_density: Optional[Tensor]
    expected_density: Optional[Tensor]
    density_loss: Tensor
    distillation: Optional[Tensor] = None
    distill_loss: Optional[Tensor] = None


class ShortConv(Module):
    r"""A causal depthwise convolution over neighbouring tokens, as Zoology's
    models put before attention: token :math:`t` sees tokens :math:`t -
    s + 1, \dots, t`, so that attention need not learn to shift a key onto
    the value after it.

    Shapes: x :math:`(B, N, C)`, mask :math:`(B, N)` → :math:`(B, N, C)`
    (padded tokens contribute nothing).
    """

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        self.conv = torch.nn.Conv1d(channels, channels, size, groups=channels,
                                    padding=size - 1)

    def forward(self, x: Tensor, mask: Optional[Tensor]) -> Tensor:
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        return self.conv(x.transpose(1, 2))[..., :x.size(1)].transpose(1, 2)


class _Block(Module):
    # Pre-norm: x + drop(attn(LN(x))); x + drop(MLP(LN(x))); with a short
    # convolution, x + conv(LN(x)) first.
    def __init__(self, attention: Module, channels: int, mlp_channels: int,
                 dropout: float, short_conv: int = 0):
        super().__init__()
        self.short_conv = ShortConv(channels, short_conv) if short_conv else None
        self.norm0 = LayerNorm(channels) if short_conv else None
        self.attention = attention
        self.norm1, self.norm2 = LayerNorm(channels), LayerNorm(channels)
        self.mlp = torch.nn.Sequential(Linear(channels, mlp_channels), torch.nn.GELU(),
                                       Linear(mlp_channels, channels))
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Optional[Tensor],
                generator: Optional[torch.Generator]) -> Tensor:
        if self.short_conv is not None:
            assert self.norm0 is not None
            x = x + self.short_conv(self.norm0(x), mask)
        h = self.norm1(x)
        if isinstance(self.attention, (SBMMultiheadAttention, BigBirdAttention)):
            h = self.attention(h, mask=mask, generator=generator)
        else:
            h = self.attention(h, mask=mask)
        x = x + self.dropout(h)
        return x + self.dropout(self.mlp(self.norm2(x)))


def _at(x: Tensor, positions: Tensor) -> Tensor:
    # The rows of x [B, N, C] at the positions: a bool mask [B, N] (sized
    # by its count: a read on a GPU), or P indices per sequence [B, P]
    # (a gather of a known size), both as [B * P, C] in row-major order.
    if positions.dtype == torch.bool:
        return x[positions]
    index = positions[..., None].expand(-1, -1, x.size(-1))
    return x.gather(1, index).reshape(-1, x.size(-1))


class SBMTransformer(Module):
    r"""Pre-norm Transformer encoder with SBM attention (or a baseline).

    Token embedding plus learned position embedding (both
    :math:`\mathcal{N}(0, 0.02^2)`, see :meth:`reset_parameters`);
    :obj:`layers` blocks of [LayerNorm → attention → dropout + residual;
    LayerNorm → MLP (GELU) → dropout + residual]; a final LayerNorm; a
    token-level head and a sequence-level head (mean pooling over real
    tokens).

    Args:
        num_tokens (int): vocabulary size (token 0 is free for padding).
        max_len (int): longest sequence (position embeddings).
        channels (int): embedding size. (default: :obj:`32`)
        num_layers (int): number of blocks. (default: :obj:`1`)
        heads (int): attention heads. (default: :obj:`1`)
        head_channels (int, optional): size of each head (default
            :obj:`channels // heads`).
        mlp_channels (int, optional): hidden size of the MLP (default
            :obj:`2 * channels`).
        attention (str): ``"sbm"`` (:class:`SBMMultiheadAttention` on ragged
            batches), ``"full"`` (:class:`FullAttention`), ``"linear"``
            (:class:`LinearAttention`), ``"performer"`` (PyG's
            :class:`PerformerAttention`) or ``"bigbird"``
            (:class:`~sbm_pyg.nn.BigBirdAttention` at
            :obj:`bigbird_density`).
        num_clusters (int): SBM clusters per head. (default: :obj:`128`)
        token_classes (int): outputs of the token head. (default: :obj:`1`)
        seq_classes (int): outputs of the sequence head. (default: :obj:`10`)
        dropout (float): dropout after attention and MLP. (default: :obj:`0.`)
        attn_dropout (float): dropout on attention weights (sbm, full,
            bigbird).
        short_conv (int): size of a causal depthwise convolution before
            each attention (:class:`ShortConv`; 0: none). (default: :obj:`0`)
        bigbird_density (float): the pairs BigBird attends.
            (default: :obj:`0.05`)
        **sbm_kwargs: :obj:`exploration`, :obj:`self_loops`, :obj:`mode`,
            :obj:`max_edges`, :obj:`ste`, :obj:`distill`, :obj:`sbm_init`,
            :obj:`init_density`, :obj:`sbm_parametrization` of
            :class:`~sbm_pyg.nn.SBMConv`.

    Shapes:
        - **input:** tokens :math:`(B, N)` (long), mask :math:`(B, N)` (bool,
          True = real token; :obj:`None`: all real)
        - **output:** :class:`TransformerOutput`; with
          :obj:`output="token"` or :obj:`"sequence"` only that head is
          computed (an unused head would stall DistributedDataParallel);
          with :obj:`positions` (bool :math:`(B, N)`, or :math:`(B, P)`
          long, the same number of positions in every sequence: a gather
          of a known size) the token head runs only there, and
          :obj:`token_logits` is :math:`(P, C_{tok})` (:math:`(B P,
          C_{tok})`), the positions in row-major order

    Example:
        >>> model = SBMTransformer(num_tokens=10, max_len=8, channels=16,
        ...                        num_clusters=4)
        >>> out = model(torch.randint(1, 10, (2, 8)))
        >>> out.token_logits.shape, out.seq_logits.shape, out.sampled_density.shape
        (torch.Size([2, 8, 1]), torch.Size([2, 10]), torch.Size([1, 1]))
    """

    # A model's constructor: flat keyword options, as torch.nn.Transformer's.
    def __init__(self, num_tokens: int, max_len: int, channels: int = 32,  # noqa: PLR0913
                 num_layers: int = 1, heads: int = 1,
                 head_channels: Optional[int] = None,
                 mlp_channels: Optional[int] = None, attention: str = "sbm",
                 num_clusters: int = 128, token_classes: int = 1,
                 seq_classes: int = 10, dropout: float = 0.0,
                 attn_dropout: float = 0.0, short_conv: int = 0,
                 bigbird_density: float = 0.05, **sbm_kwargs):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got "
                             f"{attention!r}")
        for name, value in (("num_tokens", num_tokens), ("max_len", max_len),
                            ("channels", channels), ("num_layers", num_layers),
                            ("heads", heads)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(short_conv, int) or short_conv < 0:
            raise ValueError(f"short_conv must be an int >= 0, got {short_conv!r}")
        head_channels = head_channels or max(channels // heads, 1)
        self.attention_kind, self.max_len = attention, max_len
        self.token_embedding = torch.nn.Embedding(num_tokens, channels)
        self.position_embedding = torch.nn.Embedding(max_len, channels)
        self.blocks = ModuleList(
            _Block(self._attention(attention, channels, heads, head_channels,
                                   num_clusters, attn_dropout, sbm_kwargs,
                                   bigbird_density),
                   channels, mlp_channels or 2 * channels, dropout, short_conv)
            for _ in range(num_layers))
        self.norm = LayerNorm(channels)
        self.token_head = Linear(channels, token_classes)
        self.seq_head = Linear(channels, seq_classes)
        self._reset_embeddings()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters: the token and position
        embeddings :math:`\mathcal{N}(0, 0.02^2)`, as the published code
        (and BERT) initializes them, the rest as each module does. From
        :obj:`torch.nn.Embedding`'s own :math:`\mathcal{N}(0, 1)` an SBM
        head collapses to a sparse graph on the repeated-token task, where
        from this start it learns full attention (docs/experiments.md)."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        self._reset_embeddings()

    def _reset_embeddings(self) -> None:
        for embedding in (self.token_embedding, self.position_embedding):
            torch.nn.init.normal_(embedding.weight, std=0.02)

    @staticmethod
    def _attention(kind: str, channels: int, heads: int, head_channels: int,
                   num_clusters: int, attn_dropout: float, sbm_kwargs,
                   bigbird_density: float) -> Module:
        if kind == "sbm":
            return SBMMultiheadAttention(channels, heads, head_channels,
                                         num_clusters, dropout=attn_dropout,
                                         **sbm_kwargs)
        if sbm_kwargs:
            raise ValueError(f"{sorted(sbm_kwargs)} only apply to attention='sbm'")
        if kind == "full":
            return FullAttention(channels, heads, head_channels, attn_dropout)
        if kind == "linear":
            return LinearAttention(channels, heads, head_channels)
        if kind == "bigbird":
            return BigBirdAttention(channels, heads, head_channels,
                                    bigbird_density, attn_dropout)
        # PyG draws the projection buffer on the CPU: moved to torch's
        # default device, where every other parameter is created.
        return PerformerAttention(channels, heads, head_channels).to(
            torch.get_default_device())

    @property
    def last_backends(self) -> Optional[Dict[str, str]]:
        """The kernels of the last forward of the SBM layers, e.g.
        :obj:`{'sampler': 'cpp', 'attention': 'cpp'}` (every layer resolves
        the same configuration; where layers ran different kernels, their
        names are joined by :obj:`"+"`). :obj:`None` for the baselines or
        before the first forward."""
        ran = [b.attention.last_backends for b in self.blocks
               if isinstance(b.attention, SBMMultiheadAttention)]
        if not ran or any(r is None for r in ran):
            return None
        return {op: "+".join(sorted({r[op] for r in ran if r is not None}))
                for op in ("sampler", "attention")}

    def forward(self, tokens: Tensor, mask: Optional[Tensor] = None, *,
                generator: Optional[torch.Generator] = None,
                output: str = "both",
                positions: Optional[Tensor] = None) -> TransformerOutput:
        if output not in ("both", "token", "sequence"):
            raise ValueError(f"output must be 'both', 'token' or 'sequence', "
                             f"got {output!r}")
        require_tensor("tokens", tokens, 2)
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be a LongTensor, got {tokens.dtype}")
        B, N = tokens.shape
        if N > self.max_len:
            raise ValueError(f"tokens has length {N} > max_len={self.max_len}")
        # mask=None stays None down to the attentions: full attention then
        # runs SDPA without a mask, its fastest path.
        if mask is not None and (mask.dtype != torch.bool or mask.shape != (B, N)):
            raise ValueError(f"mask must be a bool tensor of shape [{B}, {N}], "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        if positions is not None and not (
                (positions.dtype == torch.bool and positions.shape == (B, N))
                or (positions.dtype == torch.long and positions.dim() == 2
                    and positions.size(0) == B)):
            raise ValueError(f"positions must be a bool tensor of shape "
                             f"[{B}, {N}] or a LongTensor [{B}, P] of "
                             f"positions, got {positions.dtype} "
                             f"{tuple(positions.shape)}")
        pos = torch.arange(N, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(pos)
        for block in self.blocks:
            x = block(x, mask, generator)
        x = self.norm(x)
        token_logits = seq_logits = None
        if output in ("both", "token"):
            # Only where an answer is asked: a wide token head (MQAR's
            # 8192 values) over every position is most of a step's cost.
            token_logits = self.token_head(x if positions is None else _at(x, positions))
        if output in ("both", "sequence"):
            if mask is None:
                seq_logits = self.seq_head(x.sum(1) / max(N, 1))
            else:
                weights = mask.to(x.dtype)[..., None]
                seq_logits = self.seq_head((x * weights).sum(1)
                                           / weights.sum(1).clamp(min=1))
        sampled = expected = distillation = None
        density_loss = distill_loss = x.new_zeros(())
        if self.attention_kind in ("sbm", "bigbird"):
            sampled = torch.stack([b.attention.sampled_density for b in self.blocks])
        if self.attention_kind == "sbm":
            expected = torch.stack([b.attention.expected_density for b in self.blocks])
            density_loss = expected.mean()
            distilled = [b.attention.distillation for b in self.blocks]
            if all(d is not None for d in distilled):
                distillation = torch.stack(distilled)  # type: ignore[arg-type]
                distill_loss = distillation_loss(self)
        return TransformerOutput(token_logits, seq_logits, sampled, expected,
                                 density_loss, distillation, distill_loss)


GPS_ATTENTIONS = ("none", "multihead", "performer", "bigbird", "sbm")


class GPSNodeClassifier(Module):
    r"""GraphGPS's model for node classification on PATTERN and CLUSTER
    (`"Recipe for a General, Powerful, Scalable Graph Transformer"
    <https://arxiv.org/abs/2205.12454>`_): a linear node encoder
    concatenated with Laplacian PE through a DeepSet (:class:`LapPEEncoder`),
    a learned dummy edge feature, :obj:`num_layers` GPS layers with a
    :class:`GatedGCNConv` local layer that updates the edge features, and a
    3-layer node head. Only the global attention differs between
    :obj:`attention` types: :class:`SBMGPSConv` (:obj:`"sbm"`) or
    :class:`EdgeGPSConv`, PyG's :class:`GPSConv` for an edge-updating local
    conv (:obj:`"multihead"`, :obj:`"performer"` with heads of :math:`C / H`
    channels, :obj:`"bigbird"` at :obj:`bigbird_density`, :obj:`"none"`).

    Args:
        in_channels (int): node features.
        num_classes (int): classes per node.
        channels (int): hidden width. (default: :obj:`64`)
        num_layers (int): GPS layers. (default: :obj:`6`)
        heads (int): attention heads. (default: :obj:`4`)
        attention (str): one of :obj:`GPS_ATTENTIONS`. (default: :obj:`"sbm"`)
        dropout (float): dropout of the layers. (default: :obj:`0.`)
        attn_dropout (float): dropout on the attention weights. (default: :obj:`0.5`)
        pe_channels (int): width of the positional encoding, 0 for none.
            (default: :obj:`16`)
        bigbird_density (float): the pairs of each graph BigBird attends
            (:obj:`"bigbird"` only). (default: :obj:`0.05`)
        **sbm_kwargs: :class:`~sbm_pyg.nn.SBMConv`'s arguments for
            :obj:`"sbm"` (e.g. :obj:`num_clusters`, :obj:`sbm_init`), as
            :class:`SBMTransformer` takes them.

    Shapes:
        - **input:** :obj:`x` :math:`(N, F)`, :obj:`edge_index` :math:`(2,
          E)`, sorted :obj:`batch` :math:`(N)`, :obj:`eigvecs` and
          :obj:`eigvals` :math:`(N, k)` (with :obj:`pe_channels` > 0)
        - **output:** logits :math:`(N, \text{num\_classes})`
    """

    def __init__(self, in_channels: int, num_classes: int, channels: int = 64,
                 num_layers: int = 6, heads: int = 4, attention: str = "sbm",
                 dropout: float = 0.0, attn_dropout: float = 0.5,
                 pe_channels: int = 16, bigbird_density: float = 0.05,
                 **sbm_kwargs: Any):
        super().__init__()
        if attention not in GPS_ATTENTIONS:
            raise ValueError(f"attention must be one of {GPS_ATTENTIONS}, got "
                             f"{attention!r}")
        if not isinstance(pe_channels, int) or not 0 <= pe_channels < channels:
            raise ValueError(f"pe_channels must be an int in [0, channels), "
                             f"got {pe_channels!r}")
        if "sbm_kwargs" in sbm_kwargs:  # the earlier signature
            raise TypeError("sbm_kwargs= is gone: pass SBMConv's arguments as "
                            "keywords, e.g. GPSNodeClassifier(..., num_clusters=32)")
        if sbm_kwargs and attention != "sbm":
            raise ValueError(f"{sorted(sbm_kwargs)} only apply to attention='sbm'")
        self.attention = attention
        self.node_encoder = Linear(in_channels, channels - pe_channels)
        self.pe_encoder = LapPEEncoder(pe_channels) if pe_channels else None
        self.edge_embedding = Embedding(1, channels)  # GraphGPS's DummyEdge
        layers = []
        for _ in range(num_layers):
            local = GatedGCNConv(channels, dropout=dropout)
            if attention == "sbm":
                layers.append(SBMGPSConv(
                    channels, local, heads, dropout=dropout,
                    attn_kwargs=dict(sbm_kwargs, dropout=attn_dropout)))
            elif attention == "none":
                layers.append(EdgeGPSConv(channels, local, heads,
                                          dropout=dropout, attn_type=None))
            else:
                attn_kwargs: Dict[str, Any] = dict(dropout=attn_dropout)
                if attention == "performer":
                    attn_kwargs["head_channels"] = channels // heads
                if attention == "bigbird":
                    attn_kwargs["density"] = bigbird_density
                layers.append(EdgeGPSConv(
                    channels, local, heads, dropout=dropout,
                    attn_type=attention, attn_kwargs=attn_kwargs))
        self.layers = ModuleList(layers)
        self.head = Sequential(Linear(channels, channels), ReLU(),
                               Linear(channels, channels), ReLU(),
                               Linear(channels, num_classes))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Optional[Tensor] = None,
                eigvecs: Optional[Tensor] = None, eigvals: Optional[Tensor] = None,
                generator: Optional[torch.Generator] = None,
                batch_size: Optional[int] = None) -> Tensor:
        r"""Each node's class logits; :obj:`generator` drives the sign flip
        and the SBM attention's sampling and dropout; :obj:`batch_size`
        (:obj:`Batch.num_graphs`) spares each layer's read of the number of
        graphs off :obj:`batch`."""
        h = self.node_encoder(x)
        if self.pe_encoder is not None:
            if eigvecs is None or eigvals is None:
                raise ValueError("eigvecs and eigvals are needed with "
                                 "pe_channels > 0 (AddLaplacianPE)")
            h = torch.cat([h, self.pe_encoder(eigvecs, eigvals, generator)], 1)
        edge_attr = self.edge_embedding.weight.expand(edge_index.size(1), -1)
        for layer in self.layers:
            h, edge_attr = layer(h, edge_index, batch, edge_attr=edge_attr,
                                 generator=generator, batch_size=batch_size,
                                 return_edge_attr=True)
        return self.head(h)

    def densities(self) -> Optional[Tensor]:
        r"""The sampled density of the last forward per layer and head
        :math:`(L, H)` (:obj:`"sbm"` only)."""
        if self.attention != "sbm":
            return None
        return torch.stack([layer.sampled_density for layer in self.layers])
