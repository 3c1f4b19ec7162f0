"""A dense reference of the published SBM-Transformer head and model.

Written from the description of the published code's dense path (and the
paper's Eq. 5-8), not from its source: per head, memberships
sigma(MLP(Q) C^T) and sigma(MLP(K) C^T), the block softmax(C C^T) over all
k^2 entries, edge probabilities p = Qhat S Khat^T for every pair, a 0/1 mask
M, the full softmax of the scores times M renormalized to sum 1 per query
(a query without an edge gets 0), and M's gradient handed to p on the
sampled edges:

- ``"published"``: dL/dp = clip(dL/dM, -1, 1) on sampled pairs, 0 elsewhere;
- ``"paper"``: dL/dp = dL/dA * (q_i . k_j / sqrt(d)) on sampled pairs, with
  A = M * (q_i . k_j / sqrt(d)) the masked scores (the paper's Eq. 8).

Everything is dense ([B, H, N, N]) and reads the weights of an sbm_pyg
module by name, so that the same weights and the same mask can be given to
both; the mask comes from the graph the sbm_pyg layer sampled.
"""
import math

import torch
import torch.nn.functional as F
from torch import Tensor


class _PublishedMask(torch.autograd.Function):
    # Forward: the sampled 0/1 mask; backward: clip(M * dL/dM, -1, 1) to p.
    @staticmethod
    def forward(ctx, prob: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return mask.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        mask, = ctx.saved_tensors
        return (mask * grad).clamp(-1.0, 1.0), None


def dense_mask(graph, real: Tensor) -> Tensor:
    """[B, H, N, N] bool mask (query, key) of a graph sampled on the real
    tokens of a padded batch; ``real`` is the [B, N] bool padding mask."""
    B, N = real.shape
    pos = real.nonzero()  # ragged index -> (b, n), in order
    key, query = graph.edge_index
    mask = torch.zeros(B, graph.num_heads, N, N, dtype=torch.bool)
    assert torch.equal(pos[query, 0], pos[key, 0])  # no edge crosses sequences
    mask[pos[query, 0], graph.head, pos[query, 1], pos[key, 1]] = True
    return mask


def attention(conv, out_lin, x: Tensor, real: Tensor, mask: Tensor,
              ste: str) -> Tensor:
    """The published multi-head SBM attention on x [B, N, C]; ``conv`` is an
    :class:`SBMConv` (its projections and SBM give the weights), ``out_lin``
    the output projection."""
    B, N, _ = x.shape
    H, d = conv.heads, conv.out_channels

    def split(lin):  # [B, H, N, d]
        return F.linear(x, lin.weight, lin.bias).view(B, N, H, d).transpose(1, 2)

    q, k, v = split(conv.lin_query), split(conv.lin_key), split(conv.lin_value)
    sbm = conv.sbm

    def membership(z):  # per head: sigma(MLP(z) C^T), [B, H, N, k]
        h = torch.relu(z @ sbm.weight1 + sbm.bias1)
        return torch.sigmoid((h @ sbm.weight2 + sbm.bias2) @ sbm.clusters.transpose(1, 2))

    cc = sbm.clusters @ sbm.clusters.transpose(1, 2)
    block = cc.flatten(1).softmax(-1).view_as(cc)  # [H, k, k]
    prob = membership(q) @ block @ membership(k).transpose(-1, -2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    padding = ~real[:, None, None, :]
    m = mask.to(x.dtype)
    if ste == "published":
        full = scores.masked_fill(padding, float("-inf")).softmax(-1)
        attn = F.normalize(full * _PublishedMask.apply(prob, m), p=1, dim=-1)
    else:
        # Value A = M * s on the sampled pairs; dL/dp = dL/dA * s there.
        a = scores * (1 + m * (prob - prob.detach()))
        attn = a.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
    out = (attn @ v).transpose(1, 2).reshape(B, N, H * d)
    return F.linear(out, out_lin.weight, out_lin.bias) * real[..., None]


def transformer(model, tokens: Tensor, real: Tensor, masks, ste: str) -> Tensor:
    """Token logits [B, N, C_tok] of the published pre-norm encoder with the
    weights of an :class:`SBMTransformer`; ``masks``: one [B, H, N, N] mask
    per layer."""
    N = tokens.size(1)
    x = model.token_embedding.weight[tokens] + model.position_embedding.weight[:N]
    for block, mask in zip(model.blocks, masks):
        h = F.layer_norm(x, x.shape[-1:], block.norm1.weight, block.norm1.bias)
        x = x + attention(block.attention.conv, block.attention.out, h, real,
                          mask, ste)
        h = F.layer_norm(x, x.shape[-1:], block.norm2.weight, block.norm2.bias)
        lin1, lin2 = block.mlp[0], block.mlp[2]
        x = x + F.linear(F.gelu(F.linear(h, lin1.weight, lin1.bias)),
                         lin2.weight, lin2.bias)
    x = F.layer_norm(x, x.shape[-1:], model.norm.weight, model.norm.bias)
    return F.linear(x, model.token_head.weight, model.token_head.bias)
