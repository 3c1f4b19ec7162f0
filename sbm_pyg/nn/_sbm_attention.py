r"""The whole SBM attention of a layer as one function: the sequences
checked, a regime chosen per (sequence, head), the graph sampled and
attended (or the dense-regime kernel run), the density statistics
computed."""
from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn._pair_split import (
    graph_keys,
    merged_graph,
    split_included,
    split_pairs,
)
from sbm_pyg.nn.block_model import expected_densities, mean_densities
from sbm_pyg.nn.functional import STE_MODES, sparse_attention
from sbm_pyg.ops import backend_info
from sbm_pyg.ops.backend_info import (
    ATTENTION_BACKENDS,
    dense_runs,
    resolve_backend,
)
from sbm_pyg.ops.csr import full_precision, heads_first, nodes_first
from sbm_pyg.ops.dense_attention import dense_attention, mask_bytes, mask_keys, matmul_precision
from sbm_pyg.sampling.checks import (
    PtrLike,
    check_draws,
    check_pointers,
    check_sbm,
    included_pairs,
)
from sbm_pyg.sampling.fastrg import check_options, fastrg
from sbm_pyg.sampling.fastrg_op import included_csr, stream_seed
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import sync

__all__ = ["sbm_attention", "SBMAttention"]

# attend(graph, need_weights) -> (out [N_q, H, D_v], weights [E] or None):
# an attention over the sampled graph in place of the kernels (a layer's
# MessagePassing path).
Attend = Callable[[SampledGraph, bool], Tuple[Tensor, Optional[Tensor]]]


class SBMAttention(NamedTuple):
    r"""What :func:`sbm_attention` returns: the output :obj:`out`
    :obj:`[N_q, H, D_v]`; the sampled :obj:`graph` and the weights
    :obj:`alpha` :obj:`[E]` in its edge order, when asked for (else
    :obj:`None`); :obj:`expected_density` :obj:`[H]`, differentiable (the
    paper's sparsity regularizer), and :obj:`sampled_density` :obj:`[H]`,
    the fraction of pairs sampled, both averaged over non-empty sequences;
    and :obj:`backends`, the kernels that ran, e.g. :obj:`{'sampler': 'cpp',
    'attention': 'cpp'}` (:obj:`'dense'` for both where the dense-regime
    kernel ran for every (sequence, head), and :obj:`'dense_pairs': 'd/n'`
    where it ran for :math:`d` of the :math:`n` pairs of non-empty
    sequences only)."""

    out: Tensor
    graph: Optional[SampledGraph]
    alpha: Optional[Tensor]
    expected_density: Tensor
    sampled_density: Tensor
    backends: Dict[str, str]


class _Part(NamedTuple):
    # One regime's share of a call, with the edges of each (sequence, head).
    out: Tensor
    graph: Optional[SampledGraph]
    alpha: Optional[Tensor]
    edges: Tensor


def sbm_attention(query: Tensor, key: Tensor, value: Tensor, q_memb: Tensor,
                  block: Tensor, k_memb: Tensor, *, ptr_q: PtrLike = None,
                  ptr_k: PtrLike = None, mode: str = "exact",
                  exploration: float = 0.0, self_loops: bool = False,
                  include_edges: Optional[Tensor] = None,
                  max_edges: Optional[int] = None, ste: Optional[str] = "paper",
                  dropout: float = 0.0, training: bool = False,
                  sampler_backend: str = "auto",
                  attention_backend: str = "auto",
                  return_graph: bool = False,
                  return_attention_weights: bool = False,
                  attend: Optional[Attend] = None,
                  generator: Optional[torch.Generator] = None
                  ) -> SBMAttention:
    r"""The SBM-Transformer's attention over a ragged batch, all heads at
    once: samples each (sequence, head)'s graph from the SBM
    :math:`p_{ij} = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}_h
    \hat{\mathbf{K}}_j^{\top}` (plus :obj:`exploration`) and attends over
    it, with the straight-through gradient to the SBM (:obj:`ste`).

    Two regimes compute it, chosen per (sequence, head) before anything is
    sampled: the sampler and the sparse kernels (cost linear in the edges),
    or the dense-regime kernel (:func:`~sbm_pyg.ops.dense_attention`), which
    draws one Bernoulli per pair and attends with matrix products. With
    :obj:`attention_backend="auto"` a (sequence, head) takes the dense regime
    where its expected density reaches the device's crossover
    (:func:`~sbm_pyg.ops.backend_info.dense_crossover`) and the kernel runs
    on the device; a batch of both kinds runs each
    regime on its own pairs. :obj:`"dense"` runs it for all, any other
    backend the sparse path with that kernel.

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        q_memb (Tensor): :math:`\hat{\mathbf{Q}}` :obj:`[N_q, H, k]`.
        block (Tensor): :math:`\hat{\mathbf{S}}` :obj:`[H, k, k]`.
        k_memb (Tensor): :math:`\hat{\mathbf{K}}` :obj:`[N_k, H, k]`.
        ptr_q, ptr_k (LongTensor, optional): :obj:`[G + 1]` sequences of
            the queries and keys (:obj:`None`: one sequence).
        mode, exploration, self_loops, include_edges, max_edges: as for
            :func:`~sbm_pyg.sampling.fastrg`.
        ste (str, optional): :obj:`"paper"` or :obj:`"published"`, see
            :func:`~sbm_pyg.nn.functional.sparse_attention`, or :obj:`None`:
            no straight-through gradient (where the graph does not follow
            the SBM, e.g. every pair attended by a large exploration; the
            densities still reach it).
        dropout (float): attention dropout, in every kernel
            (:mod:`sbm_pyg.ops.dropout`: a pure (sequence, head) regime
            drops the same weights on either kernel for the same seed; the
            dense pairs of a mixed batch are indexed as their own batch).
        training (bool): apply the dropout.
        sampler_backend (str): see :func:`~sbm_pyg.sampling.fastrg`.
        attention_backend (str): one of
            :data:`~sbm_pyg.ops.backend_info.ATTENTION_BACKENDS`.
        return_graph (bool): also return the sampled graph (the dense
            regime's is read off its mask); with
            :obj:`return_attention_weights`, the weights too (the dense
            regime's graph then goes through the sparse kernel: the same
            sample and output, more cost).
        return_attention_weights (bool): see :obj:`return_graph`.
        attend (callable, optional): :obj:`attend(graph, need_weights)`
            computes the attention over the sampled graph in place of the
            kernels (a layer's :class:`MessagePassing` path).
        generator (torch.Generator, optional): randomness of the sampler,
            the dense kernel's draws and the dropout.

    Returns:
        :class:`SBMAttention`.

    Example:
        >>> N, H, D, k = 10, 2, 4, 3
        >>> q, kk, v = torch.randn(3, N, H, D).unbind(0)
        >>> memb = torch.rand(N, H, k)
        >>> block = torch.softmax(torch.randn(H, k * k), -1).view(H, k, k)
        >>> res = sbm_attention(q, kk, v, memb, block, memb,
        ...                     ptr_q=torch.tensor([0, 4, 10]),
        ...                     ptr_k=torch.tensor([0, 4, 10]))
        >>> res.out.shape, res.sampled_density.shape
        (torch.Size([10, 2, 4]), torch.Size([2]))
    """
    if ste is not None and ste not in STE_MODES:
        raise ValueError(f"ste must be one of {STE_MODES} or None, got {ste!r}")
    if attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of "
                         f"{ATTENTION_BACKENDS}, got {attention_backend!r}")
    device = query.device
    check_options(max_edges, generator, device)
    seq_q, seq_k, dense, per = _regimes(
        query, q_memb, block, k_memb, ptr_q, ptr_k, key.size(0), exploration,
        dropout, attention_backend, attend is not None)
    need_graph = return_graph or return_attention_weights
    args = (query, key, value, q_memb, block, k_memb, seq_q, seq_k,
            include_edges)
    opts = dict(mode=mode, exploration=exploration, self_loops=self_loops,
                ste=ste, dropout=dropout, training=training,
                need_graph=need_graph, need_alpha=return_attention_weights,
                attend=attend, generator=generator)
    pairs = dense.numel() if dense is not None else 0
    num_dense = 0 if dense is None else int(dense.sum())
    sampler = resolve_backend("sampler", sampler_backend, device)
    # The sparse kernel: the one asked for, or where the dense regime runs
    # (asked for or chosen) the one "auto" takes, for weights or graphs.
    attention = ("message_passing" if attend is not None else resolve_backend(
        "attention", "auto" if attention_backend == "dense"
        else attention_backend, device))
    if attend is None and (attention_backend == "dense"
                           or (pairs > 0 and num_dense == pairs)):
        part = _dense(*args, max_edges=max_edges, **opts)
        backends = dict(sampler="dense",
                        attention=attention if need_graph else "dense")
    elif num_dense == 0:
        part = _sparse(*args, max_edges=max_edges, sampler=sampler,
                       attention=attention, **opts)
        backends = dict(sampler=sampler, attention=attention)
    else:
        assert dense is not None  # some sequences are dense
        part = _mixed(*args, dense, max_edges=max_edges, sampler=sampler,
                      attention=attention, **opts)
        # Counted over the non-empty sequences: the empty ones join either.
        busy = (seq_q.diff() * seq_k.diff() > 0)[:, None].expand_as(dense)
        backends = dict(sampler=sampler, attention=attention,
                        dense_pairs=f"{int((dense & busy).sum())}/"
                                    f"{int(busy.sum())}")
    if dense is not None and device.type != "cpu":
        crossover, source = backend_info.dense_crossover(device)  # GPU's or CPU's
        backends["crossover"] = f"{crossover:g} ({source})"
    if per is None:
        per = expected_densities(seq_q, seq_k, q_memb, block, k_memb)
    expected, sampled = mean_densities(seq_q, seq_k, part.edges, per)
    return SBMAttention(part.out.to(query.dtype), part.graph, part.alpha,
                        expected, sampled, backends)


@torch.compiler.disable  # data-dependent: the pointers' checks and the choice
def _regimes(query: Tensor, q_memb: Tensor, block: Tensor, k_memb: Tensor,
             ptr_q: PtrLike, ptr_k: PtrLike, Nk: int, exploration: float,
             dropout: float, backend: str, custom: bool
             ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    # The pointers, which (sequence, head) pairs take the dense regime
    # ([G, H] bool), or None where the choice is not the expected density's,
    # and the expected densities [G, H] where they made the choice (with
    # their gradient: the layer reports them too).
    Nq, device = query.size(0), query.device
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk, device)
    auto = backend == "auto" and not custom and dense_runs(device)
    if not auto:
        if backend == "dense":
            resolve_backend("attention", "dense", device)
        return ptr_q, ptr_k, None, None
    # Checked here (one sync): the expected density reads the pointers.
    sync(checks)
    per = expected_densities(ptr_q, ptr_k, q_memb, block, k_memb)
    dense = (per.detach().double() + exploration
             >= backend_info.dense_crossover(device)[0])
    pairs = ptr_q.diff() * ptr_k.diff()
    # Empty sequences join the other regime: no split for them.
    return ptr_q, ptr_k, dense | ((pairs == 0)[:, None] & dense.any()), per


def _sparse(query, key, value, q_memb, block, k_memb, ptr_q, ptr_k,
            include_edges, *, mode, exploration, self_loops, ste, dropout,
            training, need_graph, need_alpha, attend, generator, max_edges,
            sampler, attention) -> _Part:
    graph = _sample(q_memb.detach(), block.detach(), k_memb.detach(), ptr_q,
                    ptr_k, include_edges, mode, exploration, self_loops,
                    max_edges, generator, sampler)
    out, alpha = _attend(query, key, value, q_memb, block, k_memb, graph,
                         ste, dropout, training, need_alpha, attend,
                         generator, attention)
    return _Part(out, graph, alpha, graph.edge_counts())


# Data-dependent edge count: the sampler runs eagerly under torch.compile,
# which compiles the code around it, the attention operator included.
@torch.compiler.disable
def _sample(q_memb, block, k_memb, ptr_q, ptr_k, include_edges, mode,
            exploration, self_loops, max_edges, generator, sampler
            ) -> SampledGraph:
    return fastrg(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k, mode=mode,
                  exploration=exploration, self_loops=self_loops,
                  include_edges=include_edges, max_edges=max_edges,
                  generator=generator, backend=sampler)


def _attend(query, key, value, q_memb, block, k_memb, graph, ste, dropout,
            training, need_alpha, attend, generator, attention
            ) -> Tuple[Tensor, Optional[Tensor]]:
    # The attention over a sampled graph: the kernels or `attend`.
    if attend is not None:
        return attend(graph, need_alpha)
    # The straight-through estimator uses the edge probabilities' gradient
    # only: their values are never computed.
    need_ste = (torch.is_grad_enabled() and q_memb.requires_grad
                and ste is not None)
    sbm = (q_memb, block, k_memb) if need_ste else None
    res = sparse_attention(query, key, value, graph, None, dropout, training,
                           ste=ste or "paper", generator=generator,
                           backend=attention,
                           sbm=sbm, return_attention_weights=need_alpha)
    return res if need_alpha else (res, None)


@torch.compiler.disable  # data-dependent mask size: runs eagerly
def _dense(query, key, value, q_memb, block, k_memb, ptr_q, ptr_k,
           include_edges, *, mode, exploration, self_loops, ste, dropout,
           training, need_graph, need_alpha, attend, generator,
           max_edges) -> _Part:
    # The dense-regime kernel samples the mask and attends over it, after
    # the sampler's argument checks and memory guard. Where the graph is
    # asked for, only the mask is wanted of it (no autograd graph): the
    # graph read off the mask goes through the sparse kernel.
    Nq, H, C = query.shape
    Nk = key.size(0)
    qm, b, km = q_memb.detach(), block.detach(), k_memb.detach()
    ptr_q, ptr_k, checks = check_sbm(qm, b, km, ptr_q, ptr_k, mode,
                                     exploration, self_loops)
    if include_edges is not None:
        i, j, check = included_pairs(include_edges, ptr_q, ptr_k, Nq, Nk)
        checks.append(check)
    num_pairs, num_bytes = sync(checks, H * (ptr_q.diff() * ptr_k.diff()).sum(),
                                mask_bytes(ptr_q, ptr_k, H).sum())
    check_draws(num_pairs, num_pairs, num_bytes, max_edges, query.device,
                ptr_q.numel() - 1, H, Nq, Nk)
    included = None if include_edges is None else included_csr(i, j, Nq, Nk)
    grad = torch.is_grad_enabled() and not need_graph
    need_ste = grad and q_memb.requires_grad and ste is not None
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    # As PyTorch's matmuls would take it (before full_precision sets it).
    precision = matmul_precision(query.dtype)
    seed = stream_seed(generator, query.device)
    # The dropout's own seed, drawn after the mask's (none without dropout).
    drop = dropout if training and not need_graph else 0.0
    drop_seed = stream_seed(generator, query.device) if drop > 0 else 0
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
            seed=seed, mode=mode,
            exploration=exploration, self_loops=self_loops, included=included,
            ste=ste if need_ste else None, dropout=drop, dropout_seed=drop_seed,
            precision=precision)
    if not need_graph:
        return _Part(nodes_first(res.out, H), None, None, res.edges)
    graph = SampledGraph.from_keys(mask_keys(res.mask, ptr_q, ptr_k, H), H, Nq,
                                   Nk, ptr_q=ptr_q, ptr_k=ptr_k)
    attention = resolve_backend("attention", "auto", query.device)
    out, alpha = _attend(query, key, value, q_memb, block, k_memb, graph, ste,
                         dropout, training, need_alpha, attend, generator,
                         attention)
    return _Part(out, graph, alpha, res.edges)


@torch.compiler.disable  # data-dependent row selections: runs eagerly
def _mixed(query, key, value, q_memb, block, k_memb, ptr_q, ptr_k,
           include_edges, dense: Tensor, *, max_edges, sampler, attention,
           **opts) -> _Part:
    # Each (sequence, head) pair on its regime. The dense pairs run as a
    # batch of one head, their heads-first rows gathered (Q̂Ŝ with an
    # identity block: the blocks differ between heads); the sampler runs on
    # the whole batch with the dense pairs' query memberships zeroed, and
    # their edges (exploration, self-loops, included pairs) are dropped.
    Nq, H, _ = query.shape
    Nk, k = key.size(0), block.size(-1)
    split = split_pairs(ptr_q, ptr_k, dense, Nq, Nk)
    inc = None
    if include_edges is not None:
        i, j, check = included_pairs(include_edges, ptr_q, ptr_k, Nq, Nk)
        sync([check])
        inc = split_included(split, ptr_q, ptr_k, i, j)
    with full_precision(query.device):
        q_block = torch.einsum("nhu,huv->nhv", q_memb, block)

    def gather(x: Tensor, rows: Tensor) -> Tensor:
        return heads_first(x)[rows][:, None]

    eye = torch.eye(k, dtype=q_block.dtype, device=query.device)[None]
    dense_part = _dense(
        gather(query, split.rows_q), gather(key, split.rows_k),
        gather(value, split.rows_k), gather(q_block, split.rows_q), eye,
        gather(k_memb, split.rows_k), split.ptr_q, split.ptr_k, inc,
        max_edges=max_edges, **opts)
    pairs_left = (None if max_edges is None
                  else max(max_edges - int(dense_part.edges.sum()), 0))
    seq = torch.repeat_interleave(torch.arange(ptr_q.numel() - 1,
                                               device=query.device),
                                  ptr_q.diff(), output_size=Nq)
    sparse_memb = q_memb * (~dense)[seq][:, :, None]
    graph = _sample(sparse_memb.detach(), block.detach(), k_memb.detach(),
                    ptr_q, ptr_k, include_edges, opts["mode"],
                    opts["exploration"], opts["self_loops"], pairs_left,
                    opts["generator"], sampler)
    keys = graph_keys(graph)
    row = keys // max(Nk, 1)
    keys = keys[~dense[seq[row % max(Nq, 1)], row // max(Nq, 1)]]
    graph = SampledGraph.from_keys(keys, H, Nq, Nk, ptr_q=ptr_q, ptr_k=ptr_k)
    out, alpha = _attend(query, key, value, q_memb, block, k_memb, graph,
                         opts["ste"], opts["dropout"], opts["training"],
                         opts["need_alpha"], None, opts["generator"],
                         attention)
    out = heads_first(out).index_copy(
        0, split.rows_q, dense_part.out[:, 0].to(out.dtype))
    edges = graph.edge_counts().index_put(
        dense.nonzero(as_tuple=True), dense_part.edges[split.pair[dense]][:, 0])
    merged = alpha_all = None
    if opts["need_graph"]:
        # The dense pairs' keys, from their batch back to the whole one.
        dense_keys = graph_keys(dense_part.graph)
        r = split.rows_q[dense_keys // max(dense_part.graph.num_keys, 1)]
        c = split.rows_k[dense_keys % max(dense_part.graph.num_keys, 1)]
        merged, alpha_all = merged_graph(
            [keys, r * Nk + c - r // max(Nq, 1) * Nk],
            [alpha, dense_part.alpha], H, Nq, Nk, ptr_q, ptr_k)
    return _Part(nodes_first(out, H), merged, alpha_all, edges)
