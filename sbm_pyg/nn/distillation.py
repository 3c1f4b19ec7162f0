r"""Attention distillation: a loss that teaches each head's SBM where its
attention goes.

The straight-through estimator passes the task's gradient to the sampled
edges' probabilities only through the mask's derivative, and that gradient
is tiny (docs/experiments.md). This loss teaches the SBM directly: the
attention weights on the sampled edges, detached, are the target of the
SBM's own distribution over each query's keys.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.nn.block_model import cluster_masses
from sbm_pyg.nn.functional import _check_memberships, edge_probability
from sbm_pyg.ops.csr import row_index
from sbm_pyg.sampling import SampledGraph
from sbm_pyg.validation import require_tensor

__all__ = ["attention_distillation", "edge_fit", "recall_fit", "layer_distillation",
           "DISTILL_SMOOTHING"]

#: The smoothing of :class:`~sbm_pyg.nn.SBMConv`'s distillation: label
#: smoothing's usual 0.1, so that a key the SBM misses pulls at most
#: :math:`10 n` times its weight.
DISTILL_SMOOTHING = 0.1

# Guards of the logarithm and the division: a row of zero mass (memberships
# that underflowed) or an edge of zero probability without smoothing.
_MIN_MASS = 1e-30


def _check_inputs(alpha: Tensor, q_memb: Tensor, block: Tensor,
                  k_memb: Tensor, graph: SampledGraph) -> None:
    _check_memberships(graph, q_memb, block, k_memb)
    require_tensor("alpha", alpha, 1, floating=True)
    if alpha.numel() != graph.num_edges:
        raise ValueError(f"alpha must have one entry per edge "
                         f"({graph.num_edges}), got {alpha.numel()}")


def attention_distillation(alpha: Tensor, q_memb: Tensor, block: Tensor,
                           k_memb: Tensor, graph: SampledGraph, *,
                           smoothing: float = 0.0) -> Tensor:
    r"""The cross-entropy from each query's attention weights on its sampled
    edges to the SBM's distribution over its sequence's keys, averaged over
    the queries with an edge, per head:

    .. math::
        \mathcal{L}_h = -\frac{1}{|\mathcal{I}_h|} \sum_{i \in \mathcal{I}_h}
        \sum_{j \in \mathcal{N}_h(i)} \bar{\alpha}_{hij} \log \Big(
        (1 - \varepsilon) \frac{p_{hij}}{\sum_{j' \in s(i)} p_{hij'}}
        + \frac{\varepsilon}{n_{s(i)}} \Big)

    where :math:`p_{hij} = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}_h
    \hat{\mathbf{K}}_j^{\top}`, :math:`s(i)` is the :math:`n_{s(i)}` keys of
    :math:`i`'s sequence, :math:`\mathcal{I}_h` the queries with a sampled
    key, :math:`\bar{\alpha}` the weights, detached (they sum to 1 over each
    query's edges), and :math:`\varepsilon` a smoothing toward the uniform
    row, which bounds the gradient of an edge the SBM gives (almost) no
    probability by :math:`n / \varepsilon`. It is the KL divergence from
    the attention's row to the SBM's, up to the attention's entropy:
    smallest where the SBM puts its row's mass on the keys the attention
    weights. It depends only on the shape of each row, not on the SBM's
    scale: the density is left to the density penalty or
    :class:`~sbm_pyg.nn.DensityBudget`. The row sums are in closed form,
    :math:`\hat{\mathbf{Q}}_i \hat{\mathbf{S}}_h \sum_{j \in s(i)}
    \hat{\mathbf{K}}_j^{\top}`: the cost is :math:`O(E k + N k^2)`, with
    nothing of size :obj:`[E, k]` kept. Keys the SBM misses reach the
    target through the sampler's exploration.

    Args:
        alpha (Tensor): :obj:`[E]` attention weights in :obj:`graph`'s
            edge order (e.g. from :func:`sparse_attention` with
            :obj:`return_attention_weights=True`); not differentiated.
        q_memb (Tensor): :math:`\hat{\mathbf{Q}}` :obj:`[N_q, H, k]`.
        block (Tensor): :math:`\hat{\mathbf{S}}` :obj:`[H, k, k]`.
        k_memb (Tensor): :math:`\hat{\mathbf{K}}` :obj:`[N_k, H, k]`.
        graph (SampledGraph): the sampled edges.
        smoothing (float): :math:`\varepsilon \in [0, 1)`.
            (default: :obj:`0.0`)

    Returns:
        Tensor :obj:`[H]`, differentiable in the memberships and the block.

    Example:
        >>> memb = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [N, H, k]
        >>> block = torch.full((1, 2, 2), 0.25)
        >>> graph = SampledGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 2, 2)
        >>> alpha = torch.tensor([0.5, 0.5])  # query 0 weighs both keys alike
        >>> attention_distillation(alpha, memb, block, memb, graph)  # KL = 0
        tensor([0.6931])
    """
    _check_inputs(alpha, q_memb, block, k_memb, graph)
    if not 0 <= smoothing < 1:  # NaN fails too
        raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
    Nq, H, k = q_memb.shape
    dtype = torch.promote_types(q_memb.dtype, torch.float32)
    q_memb, block, k_memb = (t.to(dtype) for t in (q_memb, block, k_memb))
    ptr_q, ptr_k = graph.ptr_q, graph.ptr_k
    # Each row's sum over its sequence's keys: Q̂_i Ŝ_h (sum of the K̂_j).
    mass_k = cluster_masses(ptr_k, k_memb)  # [G, H, k]
    seq = row_index(ptr_q, Nq)  # the sequence of each query
    q_block = torch.einsum("nhu,huv->nhv", q_memb, block)
    total = torch.einsum("nhv,nhv->nh", q_block, mass_k[seq])  # [Nq, H]
    keys = ptr_k.diff()[seq].to(dtype)[:, None].expand(Nq, H)
    rows = graph.csr.row().long()  # heads first: h * Nq + i
    total, keys = (t.transpose(0, 1).reshape(-1)[rows] for t in (total, keys))
    share = edge_probability(q_memb, block, k_memb, graph) / total.clamp(
        min=_MIN_MASS)
    target = (1 - smoothing) * share + smoothing / keys
    cross = alpha.detach().to(dtype) * target.clamp(min=_MIN_MASS).log()
    per_row = cross.new_zeros(H * Nq).index_add_(0, rows, -cross).view(H, Nq)
    has_edges = (graph.csr.rowptr.diff() > 0).to(dtype).view(H, Nq)
    return per_row.sum(1) / has_edges.sum(1).clamp(min=1)


def edge_fit(alpha: Tensor, q_memb: Tensor, block: Tensor, k_memb: Tensor,
             graph: SampledGraph) -> Tensor:
    r"""The binary cross-entropy from each sampled edge's SBM probability to
    whether the attention uses it, averaged over each head's edges:

    .. math::
        \mathcal{L}_h = -\frac{1}{|\mathcal{E}_h|} \sum_{e \in
        \mathcal{E}_h} \big( t_e \log p_e + (1 - t_e) \log (1 - p_e) \big),
        \qquad t_e = \min(1, \bar{\alpha}_e\, d_{i(e)})

    where :math:`d_i` is the number of edges of query :math:`i` and
    :math:`\bar{\alpha}_e` the edge's attention weight, detached: an edge
    that carries at least its uniform share of the row is a target of 1, one
    the attention ignores a target of 0. Unlike
    :func:`attention_distillation`, which sees only the shape of each row,
    it sets the SBM's scale: edges the attention needs are pulled toward
    :math:`p = 1`, the others toward 0 (as an SBM fitted alone to a graph
    is). Under the paper's parametrization the mass cap bounds what it can
    reach (:mod:`sbm_pyg.theory.block_cap`).

    Args:
        alpha (Tensor): :obj:`[E]` attention weights in :obj:`graph`'s edge
            order; not differentiated.
        q_memb (Tensor): :math:`\hat{\mathbf{Q}}` :obj:`[N_q, H, k]`.
        block (Tensor): :math:`\hat{\mathbf{S}}` :obj:`[H, k, k]`.
        k_memb (Tensor): :math:`\hat{\mathbf{K}}` :obj:`[N_k, H, k]`.
        graph (SampledGraph): the sampled edges.

    Returns:
        Tensor :obj:`[H]` (0 for a head without edges), differentiable in
        the memberships and the block.

    Example:
        >>> memb = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [N, H, k]
        >>> block = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
        >>> graph = SampledGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 2, 2)
        >>> edge_fit(torch.tensor([1.0, 0.0]), memb, block, memb, graph)  # log 2
        tensor([0.6931])
    """
    _check_inputs(alpha, q_memb, block, k_memb, graph)
    H = q_memb.size(1)
    dtype = torch.promote_types(q_memb.dtype, torch.float32)
    rows = graph.csr.row().long()
    degree = graph.csr.rowptr.diff()[rows].to(dtype)
    target = (alpha.detach().to(dtype) * degree).clamp(max=1)
    p = edge_probability(*(t.to(dtype) for t in (q_memb, block, k_memb)), graph)
    # Clamped so that an edge at p = 0 or 1 (the exact sampler's bounds)
    # costs a finite amount: the BCE's own clamp of log at -100 would
    # stop its gradient.
    eps = torch.finfo(dtype).eps
    loss = F.binary_cross_entropy(p.clamp(eps, 1 - eps), target,
                                  reduction="none")
    head = rows // graph.num_queries
    per_head = loss.new_zeros(H).index_add_(0, head, loss)
    count = loss.new_zeros(H).index_add_(0, head, torch.ones_like(loss))
    return per_head / count.clamp(min=1)


def recall_fit(alpha: Tensor, q_memb: Tensor, block: Tensor, k_memb: Tensor,
               graph: SampledGraph) -> Tensor:
    r"""The attention mass that the SBM's probabilities miss, averaged over
    each head's queries with an edge:

    .. math::
        \mathcal{L}_h = \frac{1}{|\mathcal{I}_h|} \sum_{i \in \mathcal{I}_h}
        \Big(1 - \sum_{j \in \mathcal{N}_h(i)} \bar{\alpha}_{hij}\,
        \min(p_{hij}, 1)\Big)

    with :math:`\bar{\alpha}` the weights, detached. On the graph of every
    pair it is one minus the selector's expected recall
    (:mod:`sbm_pyg.experiments.recall`): each edge is pulled toward
    :math:`p = 1` in proportion to the weight its row gives it, so a row
    whose attention sits on one key spends its probability there. Unlike
    :func:`attention_distillation` it sees the SBM's scale, and unlike
    :func:`edge_fit` it weighs each row alike rather than each edge (a
    row's one needed key among :math:`n` is not :math:`1/n` of its
    signal); the density is held by the budget. Probabilities above one
    (the exact mode clips them) count as one and pass no gradient.

    Args:
        alpha (Tensor): :obj:`[E]` attention weights in :obj:`graph`'s edge
            order; not differentiated.
        q_memb (Tensor): :math:`\hat{\mathbf{Q}}` :obj:`[N_q, H, k]`.
        block (Tensor): :math:`\hat{\mathbf{S}}` :obj:`[H, k, k]`.
        k_memb (Tensor): :math:`\hat{\mathbf{K}}` :obj:`[N_k, H, k]`.
        graph (SampledGraph): the sampled edges.

    Returns:
        Tensor :obj:`[H]` (0 for a head without edges), differentiable in
        the memberships and the block.

    Example:
        >>> memb = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [N, H, k]
        >>> block = torch.tensor([[[0.5, 0.1], [0.1, 0.5]]])
        >>> graph = SampledGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 2, 2)
        >>> recall_fit(torch.tensor([0.75, 0.25]), memb, block, memb, graph)
        tensor([0.6000])
    """
    _check_inputs(alpha, q_memb, block, k_memb, graph)
    H, Nq = q_memb.size(1), graph.num_queries
    dtype = torch.promote_types(q_memb.dtype, torch.float32)
    rows = graph.csr.row().long()  # heads first: h * Nq + i
    p = edge_probability(*(t.to(dtype) for t in (q_memb, block, k_memb)), graph)
    kept = alpha.detach().to(dtype) * p.clamp(max=1)
    per_row = kept.new_zeros(H * Nq).index_add_(0, rows, kept).view(H, Nq)
    has_edges = (graph.csr.rowptr.diff() > 0).to(dtype).view(H, Nq)
    return ((1 - per_row) * has_edges).sum(1) / has_edges.sum(1).clamp(min=1)


def layer_distillation(alpha: Tensor, sbm: Tuple[Tensor, Tensor, Tensor],
                       graph: SampledGraph, edges: float = 0.0,
                       recall: float = 0.0) -> Tensor:
    r"""What an :class:`~sbm_pyg.nn.SBMConv` with :obj:`distill` adds to
    its distillation term, per head :obj:`[H]`: :func:`attention_distillation`
    (smoothed by :data:`DISTILL_SMOOTHING`), plus :obj:`edges` times
    :func:`edge_fit` and :obj:`recall` times :func:`recall_fit` where they
    are positive, from the weights :obj:`alpha` :obj:`[E]` on
    :obj:`graph` and the SBM :obj:`(q_memb, block, k_memb)`."""
    loss = attention_distillation(alpha, *sbm, graph, smoothing=DISTILL_SMOOTHING)
    if edges > 0:
        loss = loss + edges * edge_fit(alpha, *sbm, graph)
    if recall > 0:
        loss = loss + recall * recall_fit(alpha, *sbm, graph)
    return loss
