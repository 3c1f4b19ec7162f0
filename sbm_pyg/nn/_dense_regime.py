r"""The dense regime of an SBM attention call
(:func:`~sbm_pyg.nn.sbm_attention`): one Bernoulli per pair drawn and
attended by the dense-regime kernel (:func:`~sbm_pyg.ops.dense_attention`)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from sbm_pyg.nn._call import Call, Part, attend_graph
from sbm_pyg.nn._regimes import DenseChoice
from sbm_pyg.nn.functional import with_sink
from sbm_pyg.ops.backend_info import resolve_backend
from sbm_pyg.ops.csr import full_precision, heads_first, nodes_first
from sbm_pyg.ops.dense_attention import dense_attention, mask_bytes, mask_keys, matmul_precision
from sbm_pyg.sampling.checks import check_draws, check_sbm, included_pairs
from sbm_pyg.sampling.fastrg_op import included_csr, stream_seed
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import sync

__all__ = ["dense"]


@torch.compiler.disable  # data-dependent mask size: runs eagerly
def dense(call: Call, sized: Optional[DenseChoice] = None) -> Part:
    r"""The dense regime of :obj:`call`: the dense-regime kernel samples
    the mask and attends over it, after the sampler's argument checks and
    memory guard (its sizes :obj:`sized` where the regime's choice read
    them). Where the graph is asked for, only the mask is wanted of it (no
    autograd graph): the graph read off the mask goes through the sparse
    kernel."""
    query, key, value, q_memb, block, k_memb = call[:6]
    opts = call.options
    Nq, H, C = query.shape
    Nk = key.size(0)
    qm, b, km = q_memb.detach(), block.detach(), k_memb.detach()
    # The memberships' value checks only where they are read here: with
    # `sized` the regime's choice read them (or they are derived from
    # inputs it checked: a mixed batch's dense part).
    ptr_q, ptr_k, checks = check_sbm(qm, b, km, call.ptr_q, call.ptr_k,
                                     opts.self_loops,
                                     check_memberships=sized is None)
    if call.include_edges is not None:
        i, j, check = included_pairs(call.include_edges, ptr_q, ptr_k, Nq, Nk)
        checks.append(check)
    if sized is None:  # not read with the regime's choice: read here
        num_pairs, num_bytes = sync(
            call.checks + checks, H * (ptr_q.diff() * ptr_k.diff()).sum(),
            mask_bytes(ptr_q, ptr_k, H).sum())
        sized = DenseChoice(num_pairs, num_bytes, call.seed)
    check_draws(sized.num_pairs, sized.num_pairs, sized.num_bytes,
                opts.max_edges, query.device, ptr_q.numel() - 1, H, Nq, Nk)
    included = (None if call.include_edges is None
                else included_csr(i, j, Nq, Nk))
    grad = torch.is_grad_enabled() and not call.need_graph
    need_ste = grad and q_memb.requires_grad and opts.ste is not None
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    # As PyTorch's matmuls would take it (before full_precision sets it).
    precision = matmul_precision(query.dtype)
    seed = (stream_seed(call.generator, query.device) if sized.seed is None
            else sized.seed)
    # The dropout's own seed, drawn after the mask's (none without dropout).
    drop = opts.dropout if call.training and not call.need_graph else 0.0
    drop_seed = stream_seed(call.generator, query.device) if drop > 0 else 0
    # Q̂Ŝ feeds the mask's draws: computed in full precision, whatever
    # autocast and the TF32 setting say.
    with full_precision(query.device), torch.set_grad_enabled(grad):
        q_block = torch.einsum("nhu,huv->nhv", q_memb.to(dtype),
                               block.to(dtype))
        k_memb_d = k_memb if need_ste else k_memb.detach()
        q_block = q_block if need_ste else q_block.detach()
        # contiguous: the kernel takes contiguous rows (a reshape of a
        # strided input may stay a view)
        q, k, v, qb, kmd = (heads_first(x.to(dtype)).contiguous() for x in (
            query, key, value, q_block, k_memb_d))
        res = dense_attention(
            q, k, v, qb, kmd, ptr_q, ptr_k, heads=H, scale=1.0 / math.sqrt(C),
            seed=seed, mode=opts.mode, exploration=opts.exploration,
            self_loops=opts.self_loops, included=included,
            ste=opts.ste if need_ste else None, dropout=drop,
            dropout_seed=drop_seed, precision=precision,
            mask_bytes=int(sized.num_bytes))  # read with the choice
    if not call.need_graph:
        out = res.out if call.sink is None else with_sink(
            res.out, None, res.lse, call.sink)[0]
        return Part(nodes_first(out, H), None, None, res.edges)
    graph = SampledGraph.from_keys(mask_keys(res.mask, ptr_q, ptr_k, H), H, Nq,
                                   Nk, ptr_q=ptr_q, ptr_k=ptr_k)
    attention = resolve_backend("attention", "auto", query.device)
    out, alpha = attend_graph(call, graph, attention)
    return Part(out, graph, alpha, res.edges)
