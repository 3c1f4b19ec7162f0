r"""A dense warm-up step of an SBM attention layer, computed densely.

In a dense warm-up (:attr:`SBMConv.attend_all` in training) every pair is
attended and the SBM learns on the side from the attention distillation.
Through :func:`~sbm_pyg.nn.sbm_attention` that is a graph of every pair
attended by the sparse kernel (the distillation needs each edge's weight)
and an :math:`O(E k)` product for the SBM's probability of each edge: 10 s
a step for the repeated-token task at :math:`N = 256`, batch 256, on one
CPU thread. Here the same quantities come from padded dense products
(:math:`[G, H, n, n]` per batch), as full attention computes them.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.nn.block_model import expected_densities, mean_densities
from sbm_pyg.nn.distillation import DISTILL_SMOOTHING
from sbm_pyg.nn.inputs import project
from sbm_pyg.ops.csr import row_index
from sbm_pyg.ops.dropout import dropout_keep, dropout_threshold, keep_scale
from sbm_pyg.sampling.checks import check_pointers
from sbm_pyg.sampling.fastrg_op import stream_seed
from sbm_pyg.validation import check_memory, sync

__all__ = ["dense_warmup", "warmup_forward"]

# The distillation's guard of the logarithm and the division, as
# attention_distillation's.
_MIN_MASS = 1e-30


def _slots(ptr: Tensor, num_rows: int) -> Tuple[Tensor, Tensor]:
    # Each row's sequence and position in it [num_rows], made on the device.
    seq = row_index(ptr, num_rows).long()
    return seq, torch.arange(num_rows, device=ptr.device) - ptr[seq]


def _padded(x: Tensor, slots: Tuple[Tensor, Tensor], G: int, size: int
            ) -> Tensor:
    # [N, ...] cut into sequences -> [G, size, ...], zero-padded; written
    # through index tensors, so that no mask is read to the host.
    out = x.new_zeros(G, size, *x.shape[1:])
    out[slots] = x
    return out


def warmup_forward(conv: Any, x_dst: Tensor, qkv: Tuple[Tensor, Tensor, Tensor],
                   memb: Tuple[Tensor, Tensor, Tensor], ptr_q: Optional[Tensor],
                   ptr_k: Optional[Tensor], distilling: bool,
                   generator: Optional[torch.Generator]) -> Tensor:
    r"""The rest of :obj:`conv`'s (an :class:`~sbm_pyg.nn.SBMConv`, which
    imports this module) forward in a dense warm-up step: its
    queries, keys and values :obj:`qkv` (:obj:`[N, H, D]`) attended over
    every pair of each sequence (:func:`dense_warmup`), its memberships
    :obj:`memb` distilled where :obj:`distilling`; sets the layer's
    densities and distillation as its forward does and returns its
    output."""
    query, key, value = qkv
    device = query.device
    if ptr_q is None or ptr_k is None:  # one sequence, made on the device
        ptr_q = torch.arange(2, device=device) * query.size(0)
        ptr_k = torch.arange(2, device=device) * key.size(0)
    out, distill, expected, sampled = dense_warmup(
        query, key, value, *memb, ptr_q.to(device), ptr_k.to(device),
        dropout=conv.dropout, distill=distilling,
        smoothing=DISTILL_SMOOTHING, distill_edges=conv.distill_edges,
        distill_recall=conv.distill_recall,
        generator=generator, sink=conv.sink)
    conv.expected_density, conv.sampled_density = expected, sampled
    conv.distillation = distill
    conv.last_backends = {"sampler": "dense", "attention": "warm-up"}
    out = out.reshape(-1, conv.heads * conv.out_channels) if conv.concat else out.mean(1)
    if conv.lin_skip is not None:
        out = out + project(conv.lin_skip, x_dst, "x_dst")
    return out


def dense_warmup(query: Tensor, key: Tensor, value: Tensor, q_memb: Tensor,  # noqa: PLR0913
                 block: Tensor, k_memb: Tensor, ptr_q: Tensor, ptr_k: Tensor,
                 *, dropout: float = 0.0, distill: bool = True,
                 smoothing: float = 0.0, distill_edges: float = 0.0,
                 distill_recall: float = 0.0,
                 generator: Optional[torch.Generator] = None,
                 sink: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Optional[Tensor], Tensor, Tensor]:
    r"""Attention over every pair of each sequence, and the SBM's
    distillation from its weights, as a dense warm-up step of
    :class:`~sbm_pyg.nn.SBMConv` computes them: the output of
    :func:`~sbm_pyg.nn.sparse_attention` on the graph of every pair (scale
    :math:`1/\sqrt{D}`, attention dropout by counter as every kernel
    draws it: the same mask for the same seed), and
    :func:`~sbm_pyg.nn.attention_distillation` (plus :obj:`distill_edges`
    times :func:`~sbm_pyg.nn.edge_fit` and :obj:`distill_recall` times
    :func:`~sbm_pyg.nn.recall_fit`) of its weights, in
    :math:`O(G H n^2 (D + k) + N H k^2)` with :math:`[G, H, n, n]` tensors
    for the longest sequence :math:`n`.

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        q_memb (Tensor): :obj:`[N_q, H, k]`.
        block (Tensor): :obj:`[H, k, k]`.
        k_memb (Tensor): :obj:`[N_k, H, k]`.
        ptr_q (Tensor): :obj:`[G + 1]` the query rows of each sequence.
        ptr_k (Tensor): :obj:`[G + 1]` the key rows of each sequence.
        dropout (float): attention dropout. (default: :obj:`0.0`)
        distill (bool): compute the distillation (else :obj:`None` is
            returned for it). (default: :obj:`True`)
        smoothing (float): the distillation's smoothing.
            (default: :obj:`0.0`)
        distill_edges (float): the edge fit's weight. (default: :obj:`0.0`)
        distill_recall (float): the recall fit's weight. (default: :obj:`0.0`)
        generator (torch.Generator, optional): the dropout's seed (two
            draws, as :func:`~sbm_pyg.nn.sbm_attention` takes them in a
            warm-up step).
        sink (Tensor, optional): :obj:`[H]`, each head's attention sink
            logit: one more term in every row's softmax, of value zero; the
            distillation's weights then leave out its share (a row that
            attends to the sink weighs less).

    Returns:
        :obj:`(out [N_q, H, D_v], distillation [H] or None, expected [H],
        sampled [H])`: the densities as :func:`sbm_attention` reports them
        (the sampled one 1 for every head with a non-empty sequence).

    Example:
        >>> q, k, v = torch.randn(3, 5, 1, 4).unbind(0)
        >>> memb = torch.rand(5, 1, 2)
        >>> ptr = torch.tensor([0, 2, 5])
        >>> out, distill, expected, sampled = dense_warmup(
        ...     q, k, v, memb, torch.full((1, 2, 2), 0.25), memb, ptr, ptr)
        >>> out.shape, distill.shape, sampled
        (torch.Size([5, 1, 4]), torch.Size([1]), tensor([1.]))
    """
    Nq, H, D = query.shape
    # The pointers' checks raise at the one host read, which reads the
    # padded tensors' shapes; until then the pointers are made valid.
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, key.size(0), query.device)
    n_q, n_k = ptr_q.diff(), ptr_k.diff()
    longest = [n_q.max(), n_k.max()] if n_q.numel() else []
    sizes = [int(size) for size in sync(checks, *longest)] or [0, 0]
    G = ptr_q.numel() - 1
    # Guarded before anything of that size is allocated: about six
    # [G, H, n_q, n_k] tensors of 4 bytes live at once with the backward's.
    check_memory(24.0 * G * H * sizes[0] * sizes[1], query.device,
                 f"a dense warm-up step over {G} sequence(s) of up to "
                 f"{sizes[0]} queries and {sizes[1]} keys, {H} head(s)")
    q_slots, k_slots = _slots(ptr_q, Nq), _slots(ptr_k, key.size(0))
    q, k, v = (_padded(query, q_slots, G, sizes[0]), _padded(key, k_slots, G, sizes[1]),
               _padded(value, k_slots, G, sizes[1]))
    q_mask = torch.arange(sizes[0], device=q.device) < n_q[:, None]  # [G, n]
    k_mask = torch.arange(sizes[1], device=q.device) < n_k[:, None]
    scores = torch.einsum("gihd,gjhd->ghij", q, k) * (1.0 / math.sqrt(D))
    scores = scores.masked_fill(~k_mask[:, None, None, :], float("-inf"))
    if sink is None:
        alpha = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty key rows
    else:  # the sink's column, dropped after the softmax
        column = sink.to(scores.dtype)[None, :, None, None].expand(
            *scores.shape[:3], 1)
        alpha = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
    attended = alpha
    # Two draws, as the graph path takes them: the mask's seed (every pair
    # is attended: unused) and the dropout's, so that a run's random stream
    # after the warm-up is the one that path leaves.
    stream_seed(generator, query.device)
    seed = stream_seed(generator, query.device) if dropout > 0 else 0
    if dropout > 0:
        # The kernels' rows and columns are heads first: h * N_q + i and
        # h * N_k + j.
        heads = torch.arange(H, device=q.device)[None, :, None]
        rows = heads * Nq + (ptr_q[:-1, None] + torch.arange(
            sizes[0], device=q.device))[:, None, :]  # [G, H, n_q]
        cols = heads * key.size(0) + (ptr_k[:-1, None] + torch.arange(
            sizes[1], device=q.device))[:, None, :]  # [G, H, n_k]
        threshold = dropout_threshold(dropout)
        keep = dropout_keep(seed, rows[..., None], cols[:, :, None, :]
                            .expand(-1, -1, sizes[0], -1), threshold)
        attended = alpha * keep * keep_scale(threshold)
    out = torch.einsum("ghij,gjhd->gihd", attended, v)[q_slots]
    per = expected_densities(ptr_q, ptr_k, q_memb, block, k_memb)
    expected, sampled = mean_densities(
        ptr_q, ptr_k, (n_q * n_k)[:, None].expand(-1, H), per)
    if not distill:
        return out, None, expected, sampled

    # The distillation: each row's SBM distribution over its keys against
    # the attention's (detached) weights.
    Qm = _padded(q_memb, q_slots, G, sizes[0])
    Km = _padded(k_memb, k_slots, G, sizes[1])
    dtype = torch.promote_types(q_memb.dtype, torch.float32)
    p = torch.einsum("gihu,huv,gjhv->ghij", Qm.to(dtype), block.to(dtype),
                     Km.to(dtype))
    total = p.sum(-1, keepdim=True)
    keys = n_k.to(dtype)[:, None, None, None].clamp(min=1)
    target = (1 - smoothing) * p / total.clamp(min=_MIN_MASS) + smoothing / keys
    weights = alpha.detach().to(dtype)
    cross = -(weights * target.clamp(min=_MIN_MASS).log()).sum(-1)  # [G, H, i]
    rows_used = (q_mask[:, None, :] & (n_k > 0)[:, None, None]).expand_as(cross)
    count = rows_used.sum((0, 2)).clamp(min=1).to(dtype)
    loss = (cross * rows_used).sum((0, 2)) / count
    if distill_edges > 0:
        eps = torch.finfo(dtype).eps
        pairs = (q_mask[:, None, :, None] & k_mask[:, None, None, :]).expand_as(p)
        fit = F.binary_cross_entropy(p.clamp(eps, 1 - eps),
                                     (weights * keys).clamp(max=1),
                                     reduction="none") * pairs
        loss = loss + distill_edges * fit.sum((0, 2, 3)) / pairs.sum(
            (0, 2, 3)).clamp(min=1).to(dtype)
    if distill_recall > 0:
        missed = 1 - (weights * p.clamp(max=1)).sum(-1)  # [G, H, i]
        loss = loss + distill_recall * (missed * rows_used).sum((0, 2)) / count
    return out, loss, expected, sampled
