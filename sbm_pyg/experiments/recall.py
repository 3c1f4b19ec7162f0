r"""How much of the attention an SBM head's sampled graph keeps: the
selector's recall.

For a head with dense attention :math:`A` (the softmax of the same queries
and keys over every key of the sequence) and a sampled graph
:math:`\mathcal{E}`, each query row :math:`i` gives

- its **recall** :math:`\sum_j A_{ij} [(i, j) \in \mathcal{E}]`, the share
  of the row's attention mass the graph keeps;
- its **expected recall** :math:`\sum_j A_{ij} P_{ij}`, with :math:`P_{ij}`
  the SBM's edge probability (:math:`\min(p_{ij}, 1)` in the exact mode,
  :math:`1 - e^{-p_{ij}}` in the Poisson mode; exploration, self-loops and
  included edges are in the sampled graph, not in :math:`P`);
- its **top-key recall**, whether the row's heaviest key is sampled;
- the **oracle's recall** at the same edge count: the mass of the row's
  :math:`m` heaviest keys, :math:`m` the (sequence, head)'s mean sampled
  degree rounded (half up, at least 1), the graph an ideal selector would keep with
  as many edges spread evenly over the rows.

Before a switch from dense to sampled attention they say whether the SBM
is ready; after it, whether the graph still holds what the attention uses.
The attention is formed densely, :math:`O(N^2)` per sequence and head:
this is a diagnostic for task-sized inputs (sequences of at most a few
thousand tokens, in chunks of at most :obj:`max_pairs` pairs), not a
training path.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.utils import to_dense_batch
from torch_geometric.utils.sparse import ptr2index

from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.sampling import SampledGraph

__all__ = ["row_recall", "RecallMeter", "RECALL_KEYS"]

RECALL_KEYS = ("recall", "expected_recall", "top_key_recall", "oracle_recall")


def row_recall(attention: Tensor, sampled: Tensor, edge_prob: Tensor,
               valid_keys: Tensor) -> Tensor:
    r"""The four recalls of every query row.

    Args:
        attention (Tensor): :obj:`[..., L_q, L_k]` dense attention rows
            (zero on padded keys).
        sampled (Tensor): :obj:`[..., L_q, L_k]` bool, the sampled pairs.
        edge_prob (Tensor): :obj:`[..., L_q, L_k]` each pair's probability
            of being sampled.
        valid_keys (Tensor): :obj:`[..., L_k]` bool, the real keys of each
            row's sequence (no oracle edge goes to padding).

    Returns:
        :obj:`[4, ..., L_q]`: recall, expected recall, top-key recall and
        the oracle's recall at the mean sampled degree of each leading
        index (a (sequence, head)).

    Example:
        >>> A = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]])
        >>> S = torch.tensor([[[False, True, True], [False, False, True]]])
        >>> row_recall(A, S, S.float(), torch.ones(1, 3, dtype=torch.bool))[:, 0]
        tensor([[0.3000, 0.8000],
                [0.3000, 0.8000],
                [0.0000, 1.0000],
                [0.9000, 0.9000]])
    """
    if attention.shape != sampled.shape or attention.shape != edge_prob.shape:
        raise ValueError(f"attention, sampled and edge_prob must have one shape, got "
                         f"{tuple(attention.shape)}, {tuple(sampled.shape)} and "
                         f"{tuple(edge_prob.shape)}")
    if sampled.dtype != torch.bool:
        raise TypeError(f"sampled must be a bool tensor, got {sampled.dtype}")
    kept = (attention * sampled).sum(-1)
    expected = (attention * edge_prob).sum(-1)
    top = sampled.gather(-1, attention.argmax(-1, keepdim=True)).squeeze(-1)
    # The oracle: each row's m heaviest keys, m the mean degree over the
    # rows of the leading index (its real rows: those with a real key).
    rows = (attention.sum(-1) > 0)
    degree = sampled.sum((-2, -1)).double() / rows.sum(-1).clamp(min=1)
    keys = valid_keys.sum(-1, keepdim=True).clamp(min=1)
    m = (degree + 0.5).floor().long().clamp(min=1).unsqueeze(-1).minimum(keys)
    heaviest = attention.sort(-1, descending=True).values.cumsum(-1)
    oracle = heaviest.gather(-1, (m - 1).unsqueeze(-1).expand(
        *m.shape[:-1], attention.size(-2), 1)).squeeze(-1)
    return torch.stack([kept, expected, top.to(kept.dtype), oracle])


class RecallMeter:
    r"""Measures :func:`row_recall` for every head of every
    :class:`~sbm_pyg.nn.SBMConv` of :obj:`model` in the forwards run inside
    its context, from the queries, keys, memberships and graph each layer
    computes (forward and graph hooks; the forward itself is unchanged).

    .. code-block:: python

        with RecallMeter(model) as meter:
            model(tokens, mask)
        meter.summary()  # {"recall": ..., "recall_per_layer_head": [[...]], ...}

    Args:
        model (torch.nn.Module): a model with SBM layers.
        max_pairs (int): the most (sequence, head, query, key) pairs formed
            at once; sequences are taken in chunks below it. (default:
            :obj:`2**24`)

    Example:
        >>> from sbm_pyg.models import SBMTransformer
        >>> model = SBMTransformer(num_tokens=10, max_len=8, num_clusters=4).eval()
        >>> with RecallMeter(model) as meter:
        ...     _ = model(torch.randint(1, 10, (3, 8)), generator=torch.Generator())
        >>> sorted(meter.summary())[:2]
        ['expected_recall', 'expected_recall_per_layer_head']
    """

    def __init__(self, model: torch.nn.Module, max_pairs: int = 2**24):
        self.convs = [m for m in model.modules() if isinstance(m, SBMConv)]
        if not self.convs:
            raise ValueError("model has no SBMConv layer to measure")
        if not isinstance(max_pairs, int) or max_pairs < 1:
            raise ValueError(f"max_pairs must be an int >= 1, got {max_pairs!r}")
        self.max_pairs = max_pairs
        # Per layer: sums [4, H] over rows and the row count.
        self.sums: List[Optional[Tensor]] = [None] * len(self.convs)
        self.rows: List[int] = [0] * len(self.convs)
        self._seen: List[Dict[str, object]] = [{} for _ in self.convs]
        self._handles: list = []

    def __enter__(self) -> RecallMeter:
        for index, conv in enumerate(self.convs):
            seen = self._seen[index]

            def keep(name, seen=seen):
                def hook(module, inputs, output):
                    seen[name] = output
                return hook

            self._handles += [conv.lin_query.register_forward_hook(keep("query")),
                              conv.lin_key.register_forward_hook(keep("key")),
                              conv.sbm.register_forward_hook(keep("sbm")),
                              conv.register_graph_hook(self._graph_hook(index))]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _graph_hook(self, index: int):
        def hook(conv: SBMConv, graph: SampledGraph) -> None:
            seen = self._seen[index]
            H, C = conv.heads, conv.out_channels
            query = seen["query"].detach().view(-1, H, C)  # type: ignore[union-attr]
            key = seen["key"].detach().view(-1, H, C)  # type: ignore[union-attr]
            memb = tuple(t.detach() for t in seen["sbm"])  # type: ignore[union-attr]
            sums, rows = _measure(query, key, memb, graph, conv.mode, self.max_pairs)
            self.sums[index] = sums if self.sums[index] is None else self.sums[index] + sums
            self.rows[index] += rows
        return hook

    def summary(self) -> Dict[str, object]:
        r"""The mean of each recall over all rows measured, over every layer
        and head (:obj:`"recall"`, ...) and per layer and head
        (:obj:`"recall_per_layer_head"`, ... :obj:`[L][H]`); empty if
        nothing was measured."""
        if any(s is None for s in self.sums):
            return {}
        per = torch.stack([s / max(r, 1) for s, r in zip(self.sums, self.rows)])  # type: ignore[misc]
        result: Dict[str, object] = {}
        for k, name in enumerate(RECALL_KEYS):
            result[name] = float(per[:, k].mean())
            result[f"{name}_per_layer_head"] = per[:, k].tolist()
        return result


def _measure(query: Tensor, key: Tensor, memb: Tuple[Tensor, ...],
             graph: SampledGraph, mode: str, max_pairs: int) -> Tuple[Tensor, int]:
    # Sums over real query rows [4, H] of row_recall, and the row count.
    q_memb, block, k_memb = memb
    ptr_q, ptr_k = graph.ptr_q.to(query.device), graph.ptr_k.to(query.device)
    G, H, C = ptr_q.numel() - 1, query.size(1), query.size(2)
    seq_q, seq_k = ptr2index(ptr_q), ptr2index(ptr_k)
    Q, valid_q = to_dense_batch(torch.cat([query, q_memb], -1).flatten(1), seq_q,
                                batch_size=G)
    K, valid_k = to_dense_batch(torch.cat([key, k_memb], -1).flatten(1), seq_k,
                                batch_size=G)
    Lq, Lk = Q.size(1), K.size(1)
    Q, K = Q.view(G, Lq, H, -1), K.view(G, Lk, H, -1)
    j, i = graph.edge_index.to(query.device)
    edge_seq = seq_q[i]
    local_i, local_j = i - ptr_q[edge_seq], j - ptr_k[edge_seq]
    head = graph.head.to(query.device)
    chunk = max(1, max_pairs // max(1, H * Lq * Lk))
    sums = torch.zeros(4, H, dtype=torch.float64, device=query.device)
    for start in range(0, G, chunk):  # chunks bound the O(N^2) memory
        stop = min(G, start + chunk)
        q, k = Q[start:stop], K[start:stop]
        scores = torch.einsum("gihc,gjhc->ghij", q[..., :C], k[..., :C]) / math.sqrt(C)
        keys = valid_k[start:stop, None, None, :]
        attention = scores.masked_fill(~keys, float("-inf")).softmax(-1)
        attention = attention * valid_q[start:stop, None, :, None]
        p = torch.einsum("gihu,huv,gjhv->ghij", q[..., C:], block, k[..., C:])
        prob = p.clamp(0, 1) if mode == "exact" else -torch.expm1(-p.clamp(min=0))
        sampled = torch.zeros_like(attention, dtype=torch.bool)
        here = (edge_seq >= start) & (edge_seq < stop)
        sampled[edge_seq[here] - start, head[here], local_i[here], local_j[here]] = True
        per_row = row_recall(attention.double(), sampled, prob.double(),
                             valid_k[start:stop, None, :].expand(-1, H, -1))
        real = valid_q[start:stop, None, :].expand(-1, H, -1)  # [g, H, Lq]
        sums += (per_row * real).sum((1, 3))
    return sums.cpu(), int(valid_q.sum())
