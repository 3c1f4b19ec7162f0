r"""A call of :func:`~sbm_pyg.nn.sbm_attention` with static shapes (the
options' :obj:`capacity`): checked at the door, the graph sampled into
buffers of a fixed size (:func:`~sbm_pyg.sampling.fastrg_static`), the
fused sparse kernel, the densities, and the checks raised on the device;
nothing read to the host, so that :func:`torch.compile` traces it as one
graph and a GPU can capture it."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn._call import Call, attend_graph
from sbm_pyg.nn.block_model import (
    check_exact_densities,
    expected_densities,
    mean_densities,
)
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.sampling.checks import PtrLike, check_sbm, included_pairs
from sbm_pyg.sampling.static_fastrg import fastrg_static, valid_graph
from sbm_pyg.validation import Check

__all__ = ["static_attention", "raise_on_device", "ABOVE_ONE"]

#: The check of a drawn pair whose SBM probability exceeds 1 in exact mode.
ABOVE_ONE = ("sbm: in mode='exact' each pair is an edge with probability "
             "p_ij = q_memb[i] @ block @ k_memb[j], which must not exceed 1; "
             "a sampled pair has p_ij > 1: scale block or the memberships "
             "down (or use mode='poisson', where p_ij is a rate)")


def raise_on_device(checks: List[Check]) -> None:
    r"""Each deferred check raised where the device finds it failed
    (:func:`torch._assert_async`: a :class:`RuntimeError` with the check's
    message; on a GPU, at the next synchronization), with no host read."""
    for flag, message in checks:
        torch._assert_async(~flag, message)


def static_attention(tensors: Tuple[Tensor, ...], ptr_q: PtrLike,
                     ptr_k: PtrLike, include_edges: Optional[Tensor],
                     opts: SBMAttentionOptions, requests: Dict,
                     attention: str, seed: Tensor):
    r"""The static call: :obj:`tensors` the query, key, value and SBM,
    :obj:`requests` :func:`~sbm_pyg.nn.sbm_attention`'s flags; the output,
    the graph and weights where asked for (cut to the valid edges: one
    read), the expected and sampled densities :obj:`[H]`, and the sampler's
    :class:`~sbm_pyg.sampling.StaticGraph` (its overflow flag and expected
    draws)."""
    query, key, value, q_memb, block, k_memb = tensors
    Nq, Nk = query.size(0), key.size(0)
    # The memberships' values are checked as the sampler reads them.
    ptr_q, ptr_k, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                     opts.self_loops, check_memberships=False)
    included = None
    if include_edges is not None:
        *included, check = included_pairs(include_edges, ptr_q, ptr_k, Nq, Nk)
        checks.append(check)
    per = expected_densities(ptr_q, ptr_k, q_memb, block, k_memb)
    if opts.mode == "exact":
        checks.append(check_exact_densities(per))
    assert opts.capacity is not None
    sampled = fastrg_static(q_memb, block, k_memb, ptr_q, ptr_k,
                            capacity=opts.capacity, seed=seed, mode=opts.mode,
                            exploration=opts.exploration,
                            self_loops=opts.self_loops, included=included,
                            backend=opts.sampler_backend)
    raise_on_device(checks + sampled.checks + [(sampled.above_one, ABOVE_ONE)])
    call = Call(query, key, value, q_memb, block, k_memb, ptr_q, ptr_k,
                include_edges, opts, requests["training"], requests["need_graph"],
                requests["need_alpha"], None, None, [], None, requests["sink"],
                dropout_seed=seed)
    out, alpha = attend_graph(call, sampled.graph, attention)
    graph = None
    if requests["need_graph"]:  # the valid edges, as the other paths give them
        graph = valid_graph(sampled.graph)
        alpha = None if alpha is None else alpha[:graph.num_edges]
    expected, density = mean_densities(ptr_q, ptr_k, sampled.edges, per)
    return out, graph, alpha, expected, density, sampled

