r"""Dense and kernelized attentions that SBM attention is compared with:
softmax over all tokens, and linear attention."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, Module

__all__ = ["FullAttention", "LinearAttention"]


class _QKVAttention(Module):
    # Shared projections of the dense baselines: [B, N, C] -> [B, H, N, d].
    def __init__(self, channels: int, heads: int, head_channels: int,
                 dropout: float = 0.0):
        super().__init__()
        self.heads, self.head_channels, self.dropout = heads, head_channels, dropout
        self.qkv = Linear(channels, 3 * heads * head_channels, bias=False)
        self.out = Linear(heads * head_channels, channels)

    def split(self, x: Tensor):
        B, N, _ = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.heads, self.head_channels)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x [B, H, N, d]

    def merge(self, out: Tensor) -> Tensor:
        B, H, N, d = out.shape
        return self.out(out.transpose(1, 2).reshape(B, N, H * d))


class FullAttention(_QKVAttention):
    r"""Softmax attention over all real tokens
    (:func:`torch.nn.functional.scaled_dot_product_attention`); padded keys are
    masked out.

    Shapes: x :math:`(B, N, C)`, mask :math:`(B, N)` → :math:`(B, N, C)`.
    """

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.split(x)
        attn_mask = None if mask is None else mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0)
        return self.merge(out)


class LinearAttention(_QKVAttention):
    r"""Linear attention of Katharopoulos et al. (2020) with the feature map
    :math:`\phi(x) = \mathrm{elu}(x) + 1`:

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^{\top} \sum_j \phi(\mathbf{k}_j)
        \mathbf{v}_j^{\top}}{\phi(\mathbf{q}_i)^{\top} \sum_j
        \phi(\mathbf{k}_j)}

    over real keys :math:`j`, in :math:`O(N d^2)`.

    Shapes: x :math:`(B, N, C)`, mask :math:`(B, N)` → :math:`(B, N, C)`.
    """

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.split(x)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        if mask is not None:
            k = k * mask[:, None, :, None]
        kv = torch.einsum("bhnd,bhne->bhde", k, v)
        norm = torch.einsum("bhnd,bhd->bhn", q, k.sum(2)).clamp(min=1e-6)
        return self.merge(torch.einsum("bhnd,bhde->bhne", q, kv) / norm[..., None])
