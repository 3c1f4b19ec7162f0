r"""SBM attention for padded batches, with the interface of PyG's
:class:`~torch_geometric.nn.attention.PerformerAttention`."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor

from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.validation import require_tensor

__all__ = ["SBMMultiheadAttention"]

_EMPTY = ("mask leaves a sequence without a real token (mask: True = real "
          "token; key_padding_mask: True = padding)")


class SBMMultiheadAttention(torch.nn.Module):
    r"""Multi-head SBM attention on a padded batch :obj:`[B, N, C]`.

    .. math::
        \mathrm{out} = \mathbf{W}^O \big\Vert_{h=1}^{H}
        \mathrm{SBMAttn}_h(\mathbf{X})

    where each head samples its attention graph from its SBM (see
    :class:`SBMConv`). Padded positions neither send nor receive edges: the
    real tokens are gathered into a ragged batch, attended with
    :class:`SBMConv`, and scattered back; padded outputs are zero. With a
    :obj:`capacity` (static shapes) nothing is gathered by the mask: each
    row's real tokens move to its front (a stable sort), and its padded
    queries and padded keys form two sequences without a pair, so that a
    new mask keeps every shape and reads nothing.

    Args:
        channels (int): embedding size :math:`C`.
        heads (int): number of heads.
        head_channels (int): size of each head. (default: :obj:`64`)
        num_clusters (int): SBM clusters per head. (default: :obj:`128`)
        qkv_bias (bool): bias in the query/key/value projections.
            (default: :obj:`False`)
        attn_out_bias (bool): bias in the output projection.
            (default: :obj:`True`)
        dropout (float): dropout on the attention weights. (default: :obj:`0.`)
        **kwargs: :obj:`exploration`, :obj:`self_loops`, :obj:`mode`,
            :obj:`max_edges`, :obj:`ste`, :obj:`distill`, :obj:`sbm_init`,
            :obj:`init_density`, :obj:`sbm_parametrization`,
            :obj:`eval_seed`, :obj:`capacity` of :class:`SBMConv`.

    Shapes:
        - **input:** x :math:`(B, N, C)`, mask :math:`(B, N)` (bool, True =
          real token; :obj:`None`: all real) or key_padding_mask
          :math:`(B, N)` (True = padding, as in
          :class:`torch.nn.MultiheadAttention`)
        - **output:** :math:`(B, N, C)`

    Example:
        >>> attn = SBMMultiheadAttention(16, heads=2, head_channels=8, num_clusters=4)
        >>> x = torch.randn(2, 5, 16)
        >>> mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
        >>> out = attn(x, mask=mask)
        >>> out.shape, bool(out[1, 3:].eq(0).all())  # padding stays zero
        (torch.Size([2, 5, 16]), True)
    """

    def __init__(self, channels: int, heads: int, head_channels: int = 64,
                 num_clusters: int = 128, qkv_bias: bool = False,
                 attn_out_bias: bool = True, dropout: float = 0.0, **kwargs):
        super().__init__()
        self.channels, self.heads, self.head_channels = channels, heads, head_channels
        self.conv = SBMConv(channels, head_channels, heads, concat=True,
                            num_clusters=num_clusters, dropout=dropout,
                            bias=qkv_bias, root_weight=False, **kwargs)
        self.out = torch.nn.Linear(heads * head_channels, channels,
                                   bias=attn_out_bias)

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        self.conv.reset_parameters()
        self.out.reset_parameters()

    @property
    def sampled_density(self) -> Optional[Tensor]:
        """Per-head sampled density of the last forward, :obj:`[H]`."""
        return self.conv.sampled_density

    @property
    def last_backends(self) -> Optional[Dict[str, str]]:
        """The kernels of the last forward, e.g. :obj:`{'sampler': 'cpp',
        'attention': 'cpp'}` (:attr:`SBMConv.last_backends`)."""
        return self.conv.last_backends

    @property
    def distillation(self) -> Optional[Tensor]:
        """Per-head attention distillation of the last training forward
        (differentiable; with :obj:`distill > 0`), :obj:`[H]`."""
        return self.conv.distillation

    @property
    def expected_density(self) -> Optional[Tensor]:
        """Per-head expected density of the last forward (differentiable)."""
        return self.conv.expected_density

    def forward(self, x: Tensor, *args: Any, mask: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                generator: Optional[torch.Generator] = None) -> Tensor:
        r"""Attends each sequence's real tokens to each other.

        Args:
            x (Tensor): :obj:`[B, N, C]`.
            mask (BoolTensor, optional): :obj:`[B, N]`, True = real token
                (PyG's convention; :obj:`None`: every token is real). By
                keyword only, as both masks: the two conventions are
                opposite, and a mask passed by position could be either.
            key_padding_mask (BoolTensor, optional): :obj:`[B, N]`, True =
                padding (:class:`torch.nn.MultiheadAttention`'s
                convention), in place of :obj:`mask`.
            generator (torch.Generator, optional): for the sampled graphs.

        Returns:
            :obj:`[B, N, C]`, zero at padded positions.

        Raises:
            TypeError: a mask passed by position.
            ValueError: both masks given, a mask of another shape or dtype,
                or a sequence left without a real token.
            RuntimeError: with a :obj:`capacity`, a sequence left without a
                real token (raised on the device, as a static call's checks
                are).
        """
        if args:
            raise TypeError(
                "SBMMultiheadAttention.forward takes its masks by keyword: "
                "mask= (True = real token, PyG's PerformerAttention) or "
                "key_padding_mask= (True = padding, torch.nn."
                "MultiheadAttention); a mask by position could be either")
        require_tensor("x", x, 3, floating=True)
        B, N, C = x.shape
        if C != self.channels:
            raise ValueError(f"x must have {self.channels} channels, got {C}")
        if key_padding_mask is not None:
            if mask is not None:
                raise ValueError("give mask (True = real token) or "
                                 "key_padding_mask (True = padding), not both")
            require_tensor("key_padding_mask", key_padding_mask, 2)
            if key_padding_mask.dtype != torch.bool:
                raise ValueError(f"key_padding_mask must be a bool tensor, got "
                                 f"{key_padding_mask.dtype}")
            mask = ~key_padding_mask
        if mask is None:
            ptr = torch.arange(B + 1, device=x.device) * N
            out = self.conv(x.reshape(B * N, C), ptr=ptr, generator=generator)
            return self.out(out).view(B, N, C)
        require_tensor("mask", mask, 2)
        if mask.dtype != torch.bool or mask.shape != (B, N):
            raise ValueError(f"mask must be a bool tensor of shape [{B}, {N}], "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        if self.conv.capacity is not None:
            return self._static(x, mask, generator)
        lengths = mask.sum(dim=1)
        if N > 0 and bool((lengths == 0).any()):  # (one sync)
            raise ValueError(
                f"mask leaves sequence {int((lengths == 0).nonzero()[0])} "
                f"without a real token (mask: True = real token; "
                f"key_padding_mask: True = padding)")
        ptr = torch.cat([mask.new_zeros(1, dtype=torch.long), lengths.cumsum(0)])
        out = self.out(self.conv(x[mask], ptr=ptr, generator=generator))
        # out's dtype, not x's: they differ under autocast.
        return out.new_zeros(B, N, C).masked_scatter(mask[..., None], out)

    def _static(self, x: Tensor, mask: Tensor,
                generator: Optional[torch.Generator]) -> Tensor:
        # Static shapes (the layer's capacity): no boolean index and no
        # read. Each row's real tokens move to its front (a stable sort of
        # the mask), and the row becomes three sequences: its real tokens
        # attending each other, its padded queries with no key and its
        # padded keys with no query. The padding then draws no pair, so the
        # graph, the densities and the penalty are the real tokens' alone.
        B, N, C = x.shape
        if self.conv.self_loops:
            # A padded query's self-loop would reach into the padded keys'
            # sequence.
            raise ValueError("a mask with a capacity (static shapes) puts the "
                             "padded queries and keys in sequences of their own, "
                             "which self_loops=True cannot serve: leave "
                             "self_loops at False, or capacity at None")
        lengths = mask.sum(dim=1)
        if N > 0:
            torch._assert_async((lengths > 0).all(), _EMPTY)
        order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
        start = torch.arange(B, device=x.device) * N
        real_end = start + lengths
        last = start.new_full((1,), B * N)
        ptr_q = torch.cat([torch.stack([start, real_end, start + N], 1).flatten(), last])
        ptr_k = torch.cat([torch.stack([start, real_end, real_end], 1).flatten(), last])
        gather = order[..., None].expand(B, N, C)
        out = self.conv(x.gather(1, gather).reshape(B * N, C), ptr=(ptr_k, ptr_q),
                        generator=generator)
        out = self.out(out).view(B, N, C)
        # Back to the tokens' places; out's dtype, not x's (autocast).
        return out.scatter(1, gather, out).masked_fill(~mask[..., None], 0)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, "
                f"heads={self.heads}, head_channels={self.head_channels}, "
                f"num_clusters={self.conv.num_clusters})")
