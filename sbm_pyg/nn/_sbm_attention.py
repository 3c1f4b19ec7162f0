r"""The whole SBM attention of a layer as one function: the sequences
checked, a regime chosen per (sequence, head), the graph sampled and
attended (or the dense-regime kernel run), the density statistics
computed."""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from sbm_pyg.nn._call import Attend, Call, Part, attend_graph, unsupported
from sbm_pyg.nn._dense_regime import dense as dense_regime
from sbm_pyg.nn._pair_split import (
    SplitSizes,
    dense_keys,
    graph_keys,
    merged_graph,
    split_included,
    split_pairs,
    split_sizes,
    without_dense_pairs,
)
from sbm_pyg.nn._regimes import (
    TILES_MIN_SHARE,
    DenseChoice,
    MixedChoice,
    TiledChoice,
    backend_notes,
    regimes,
    tiles_share,
)
from sbm_pyg.nn._static_attention import static_attention
from sbm_pyg.nn.block_model import expected_densities, mean_densities
from sbm_pyg.nn.functional import check_sbm_shapes, check_sink
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.nn.support import compact_clusters
from sbm_pyg.nn.tiled_attention import tiled_regime
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend, tiles_min_edges
from sbm_pyg.ops.csr import full_precision, heads_first, nodes_first
from sbm_pyg.ops.dense_attention import mask_bytes
from sbm_pyg.sampling.checks import PtrLike, included_pairs
from sbm_pyg.sampling.fastrg import PlannedGraph, plan_fastrg
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import check_generator, sync

__all__ = ["sbm_attention", "SBMAttention"]


class SBMAttention(NamedTuple):
    r"""What :func:`sbm_attention` returns: the output :obj:`out`
    :obj:`[N_q, H, D_v]`; the sampled :obj:`graph` and the weights
    :obj:`alpha` :obj:`[E]` in its edge order, when asked for (else
    :obj:`None`); :obj:`expected_density` :obj:`[H]`, differentiable (the
    paper's sparsity regularizer), and :obj:`sampled_density` :obj:`[H]`,
    the fraction of pairs sampled, both averaged over non-empty sequences;
    :obj:`backends`, the kernels that ran, e.g. :obj:`{'sampler': 'cpp',
    'attention': 'cpp'}` (:obj:`'dense'` for both where the dense-regime
    kernel ran for every (sequence, head), and :obj:`'dense_pairs': 'd/n'`
    where it ran for :math:`d` of the :math:`n` pairs of non-empty
    sequences only; :obj:`'clusters': "k'/k"`, the clusters computed
    over, with the options' :obj:`sparse_memberships`; :obj:`'static'` the
    sampler with the options' :obj:`capacity`); and with a
    :obj:`capacity`, :obj:`overflow`, a 0-dim bool on the device: the
    draws did not fit it, and the graph lacks the rest, and
    :obj:`expected_draws`, their Poisson mean (0-dim; both :obj:`None`
    without a capacity: :func:`~sbm_pyg.sampling.round_capacity` sizes one)."""

    out: Tensor
    graph: Optional[SampledGraph]
    alpha: Optional[Tensor]
    expected_density: Tensor
    sampled_density: Tensor
    backends: Dict[str, str]
    overflow: Optional[Tensor] = None
    expected_draws: Optional[Tensor] = None


def sbm_attention(query: Tensor, key: Tensor, value: Tensor,  # noqa: PLR0913
                  sbm: Tuple[Tensor, Tensor, Tensor], *, ptr_q: PtrLike = None,
                  ptr_k: PtrLike = None,
                  include_edges: Optional[Tensor] = None,
                  options: Optional[SBMAttentionOptions] = None,
                  training: bool = False, return_graph: bool = False,
                  return_attention_weights: bool = False,
                  attend: Optional[Attend] = None,
                  generator: Optional[torch.Generator] = None,
                  sink: Optional[Tensor] = None,
                  seed: Optional[Tensor] = None) -> SBMAttention:
    r"""The SBM-Transformer's attention over a ragged batch, all heads at
    once: samples each (sequence, head)'s graph from the SBM
    :math:`p_{ij} = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}_h
    \hat{\mathbf{K}}_j^{\top}` (plus :obj:`exploration`) and attends over
    it, with the straight-through gradient to the SBM (the options'
    :obj:`ste`).

    Two regimes compute it, chosen per (sequence, head) before anything is
    sampled: the sampler and the sparse kernels (cost linear in the edges),
    or the dense-regime kernel (:func:`~sbm_pyg.ops.dense_attention`), which
    draws one Bernoulli per pair and attends with matrix products. With
    :obj:`attention_backend="auto"` a (sequence, head) takes the dense regime
    where its expected density reaches the device's crossover
    (:func:`~sbm_pyg.ops.backend_info.dense_crossover`) and the kernel runs
    on the device; a batch of both kinds runs each
    regime on its own pairs. :obj:`"dense"` runs it for all, any other
    backend the sparse path with that kernel. :obj:`"tiles"` asks for a
    third, the tiled regime of sharp heads
    (:func:`~sbm_pyg.nn.tiled_sbm_attention`: the heavy cluster pairs as
    tiles of cluster-sorted tokens on the dense-regime kernel, the rest on
    the sparse path; :obj:`backends` names the tiles' kernel and the rest's
    sampler and kernel); it reads the device five times (the inputs'
    checks, the plan's, the rest sampler's, the rest's edges outside the
    tiles, the layout's).
    :obj:`"auto"` takes it for the pairs of a call that the dense regime
    does not take (all of them, or beside the dense ones) where its tiles
    would hold half their expected edges or more
    (:func:`~sbm_pyg.sampling.tiles.tile_edges`, read with the choice;
    :obj:`backends["tile_share"]`) and, on a GPU, enough edges to pay the
    tiles' fixed cost (:func:`~sbm_pyg.ops.backend_info.tiles_min_edges`),
    the dense kernel runs and the call asks
    nothing the tiles lack (dropout, a sink, included edges, the weights,
    :obj:`max_edges`).

    A call of one regime reads the device once: the inputs' checks, the
    choice and the sizes of what is allocated next (the sampler's draws or
    the dense regime's mask) in one host sync (the sampler's plan is made
    before the choice, its first seed the dense kernel's where every pair
    is dense). On CUDA the Triton sampler then reads its graph's edge
    count (the dense kernel takes its mask's size from the sync); the
    backward reads nothing. A batch of both regimes reads four times (the
    choice; the split's sizes with the dense part's; the sampler's plan of
    the rest; its graph's edges outside the dense pairs, counted), the
    tiled regime five, and :obj:`sparse_memberships` once more first (the
    clusters in use, :func:`~sbm_pyg.nn.support.compact_clusters`).

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        sbm (tuple): the SBM :math:`(\hat{\mathbf{Q}}, \hat{\mathbf{S}},
            \hat{\mathbf{K}})`, memberships :obj:`[N_q, H, k]`, block
            :obj:`[H, k, k]`, memberships :obj:`[N_k, H, k]`, as
            :class:`~sbm_pyg.nn.StochasticBlockModel` returns them.
        ptr_q, ptr_k (LongTensor, optional): :obj:`[G + 1]` sequences of
            the queries and keys (:obj:`None`: one sequence).
        include_edges (Tensor, optional): :obj:`[2, E]` (query, key) pairs
            added to every head's graph, see
            :func:`~sbm_pyg.sampling.fastrg`.
        options (SBMAttentionOptions, optional): the sampler's and the
            kernels' options (:obj:`None`: the defaults).
        training (bool): apply the options' dropout (:mod:`sbm_pyg.ops.dropout`:
            a pure (sequence, head) regime drops the same weights on
            either kernel for the same seed; the dense pairs of a mixed
            batch are indexed as their own batch).
        return_graph (bool): also return the sampled graph (the dense
            regime's is read off its mask); with
            :obj:`return_attention_weights`, the weights too (the dense
            regime's graph then goes through the sparse kernel: the same
            sample and output, more cost).
        return_attention_weights (bool): see :obj:`return_graph`.
        attend (callable, optional): :obj:`attend(graph, need_weights)`
            computes the attention over the sampled graph in place of the
            kernels (a layer's :class:`MessagePassing` path), its sink
            included.
        generator (torch.Generator, optional): randomness of the sampler,
            the dense kernel's draws and the dropout.
        sink (Tensor, optional): :obj:`[H]`, each head's attention sink
            logit (see :func:`~sbm_pyg.nn.functional.sparse_attention`),
            in both regimes; the weights then leave out the sink's share.
        seed (Tensor, optional): with the options' :obj:`capacity`, the
            sampler's seed, a 0-dim int64 tensor :math:`\geq 0` on the
            device (:obj:`None`: drawn from :obj:`generator`, or from
            torch's default generator, on the device: no read).

    Returns:
        :class:`SBMAttention`.

    Example:
        >>> N, H, D, k = 10, 2, 4, 3
        >>> q, kk, v = torch.randn(3, N, H, D).unbind(0)
        >>> memb = torch.rand(N, H, k)
        >>> block = torch.softmax(torch.randn(H, k * k), -1).view(H, k, k)
        >>> res = sbm_attention(q, kk, v, (memb, block, memb),
        ...                     ptr_q=torch.tensor([0, 4, 10]),
        ...                     ptr_k=torch.tensor([0, 4, 10]),
        ...                     options=SBMAttentionOptions(mode="poisson"))
        >>> res.out.shape, res.sampled_density.shape
        (torch.Size([10, 2, 4]), torch.Size([2]))
    """
    opts = SBMAttentionOptions() if options is None else options
    if not isinstance(opts, SBMAttentionOptions):
        raise TypeError(f"options must be an SBMAttentionOptions or None, got "
                        f"{type(options).__name__}")
    given = check_sbm_shapes(sbm, query.size(0), key.size(0), query.size(1))
    # With sparse memberships, over the clusters some token uses; a static
    # call keeps all k (the width kept would be read), the same law.
    compact = opts.sparse_memberships and opts.capacity is None
    q_memb, block, k_memb = sbm = compact_clusters(given) if compact else given
    device = query.device
    check_generator(generator, device)
    check_sink(sink, query.size(1))
    need_graph = return_graph or return_attention_weights
    sampler = resolve_backend("sampler", opts.sampler_backend, device)
    # The sparse kernel: the one asked for, or where the dense or tiled
    # regime runs (asked for or chosen) the one "auto" takes, for weights,
    # graphs or the rest.
    attention = ("message_passing" if attend is not None else resolve_backend(
        "attention", "auto" if opts.attention_backend in ("dense", "tiles")
        else opts.attention_backend, device))
    if opts.capacity is not None:
        return _static(query, key, value, sbm, ptr_q, ptr_k, include_edges,
                       opts, dict(training=training, need_graph=need_graph,
                                  need_alpha=return_attention_weights,
                                  sink=sink, attend=attend),
                       attention, generator, seed)
    dense_backends = dict(sampler="dense",
                          attention=attention if need_graph else "dense")
    call, dense, per, choice = _decide(
        (query, key, value, q_memb, block, k_memb), ptr_q, ptr_k,
        dict(include_edges=include_edges, options=opts, training=training,
             need_graph=need_graph, need_alpha=return_attention_weights,
             attend=attend, generator=generator, checks=[], seed=None, sink=sink),
        sampler)
    if opts.attention_backend == "tiles":
        part = _tiles(call, sampler, attention)
        # The tiles' kernel, and the rest's sampler and sparse kernel.
        backends = dict(sampler=sampler, attention="tiles", tiles=(
            "dense" if dense_runs(device) else "torch"), rest=attention)
    elif attend is None and opts.attention_backend == "dense":
        part, backends = dense_regime(call), dense_backends
    elif isinstance(choice, TiledChoice):  # no pair dense, the tiles pay
        # The inputs' checks were read with the choice.
        part = _tiles(call._replace(checks=[]), sampler, attention)
        backends = dict(sampler=sampler, attention="tiles", tiles="dense",
                        rest=attention, tile_share=f"{choice.share:.3f}")
    elif isinstance(choice, SampledGraph):  # every pair sparse
        part = _sparse(call, choice, attention)
        backends = dict(sampler=sampler, attention=attention)
    elif isinstance(choice, DenseChoice):  # every pair dense
        part, backends = dense_regime(call, choice), dense_backends
    else:  # some of each
        assert isinstance(choice, MixedChoice) and dense is not None
        part, counts = _mixed(call._replace(seed=choice.seed), dense, sampler,
                              attention, choice.tiles is not None)
        backends = dict(sampler=sampler, attention=attention,
                        dense_pairs=counts)
        if choice.tiles is not None:  # the sparse pairs as tiles and rest
            backends.update(attention="tiles", tiles="dense", rest=attention,
                            tile_share=f"{choice.tiles:.3f}")
    backends.update(backend_notes(device, dense is not None, opts, block.size(-1),
                                  given[1].size(-1)))
    if per is None:
        per = expected_densities(call.ptr_q, call.ptr_k, q_memb, block, k_memb)
    expected, sampled = mean_densities(call.ptr_q, call.ptr_k, part.edges, per)
    return SBMAttention(part.out.to(query.dtype), part.graph, part.alpha,
                        expected, sampled, backends)


def _static(query: Tensor, key: Tensor, value: Tensor,
            sbm: Tuple[Tensor, Tensor, Tensor], ptr_q: PtrLike, ptr_k: PtrLike,
            include_edges: Optional[Tensor], opts: SBMAttentionOptions,
            requests: Dict[str, Any], attention: str,
            generator: Optional[torch.Generator],
            seed: Optional[Tensor]) -> SBMAttention:
    # A call with the options' capacity: static shapes, no read.
    if requests["attend"] is not None:
        raise ValueError("capacity (static shapes) attends on the fused "
                         "sparse kernel: a custom attention (the "
                         "message_passing backend) is not served there")
    if seed is None:
        seed = torch.randint(2**62, (), generator=generator, device=query.device)
    elif not (isinstance(seed, Tensor) and seed.dim() == 0
              and seed.dtype == torch.int64 and seed.device == query.device):
        raise TypeError(f"seed must be a 0-dim int64 tensor on {query.device} "
                        f"or None")
    out, graph, alpha, expected, sampled, draws = static_attention(
        (query, key, value, *sbm), ptr_q, ptr_k, include_edges, opts, requests,
        attention, seed)
    return SBMAttention(out.to(query.dtype), graph, alpha, expected, sampled,
                        dict(sampler="static", attention=attention),
                        draws.overflow, draws.expected_draws)


# The forward's one host read, and all the code that depends on what it
# read: torch.compile runs it eagerly (one graph break, between the
# memberships and the attention).
@torch.compiler.disable
def _decide(tensors: Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor],
            ptr_q: PtrLike, ptr_k: PtrLike,
            requests: Dict[str, Any], sampler: str
            ) -> Tuple[Call, Optional[Tensor], Optional[Tensor],
                       Union[None, SampledGraph, DenseChoice, MixedChoice, TiledChoice]]:
    # The call (its query, key, value and SBM `tensors`, the rest of its
    # fields `requests`) with its sequences checked and its regimes chosen
    # (sbm_pyg.nn._regimes), and, on the sparse path, the graph sampled or,
    # where the pairs chose by their density, the choice read (_choose);
    # None where the tiled or the dense regime was asked for.
    query, key, value, q_memb, block, k_memb = tensors
    opts = requests["options"]
    seq_q, seq_k, checks, dense, per = regimes(
        query, (q_memb, block, k_memb), ptr_q, ptr_k, key.size(0), opts,
        requests["attend"] is not None)
    call = Call(query, key, value, q_memb, block, k_memb, seq_q, seq_k,
                **dict(requests, checks=checks))
    if opts.attention_backend == "tiles" or (call.attend is None
                                             and opts.attention_backend == "dense"):
        return call, dense, per, None
    if dense is None:
        return call, dense, per, _sample(call, call.q_memb, opts.max_edges, sampler)
    return call, dense, per, _choose(call, dense, per, sampler)


def _tiles(call: Call, sampler: str, rest: str) -> Part:
    # The tiled regime (sbm_pyg.nn.tiled_attention); the inputs' checks
    # read first.
    out, graph, edges = tiled_regime(
        call.query, call.key, call.value, (call.q_memb, call.block, call.k_memb),
        call.ptr_q, call.ptr_k, call.options, call.checks, unsupported(call),
        generator=call.generator, sampler=sampler, rest=rest,
        need_graph=call.need_graph)
    return Part(out, graph, None, edges)


def _choose(call: Call, dense: Tensor, per: Tensor, sampler: str
            ) -> Union[SampledGraph, DenseChoice, MixedChoice, TiledChoice]:
    # The regime of a batch whose pairs chose by their expected density,
    # with one host read: the sampler's plan is made first (its first seed
    # serves the dense kernel where every pair is dense, as it would have
    # drawn it), and its values, the inputs' checks, the dense pairs'
    # count, the dense regime's sizes and the tiles' share of the edges
    # (where the tiled regime could serve the call) are read together. A
    # batch of both regimes, or the tiled regime, reads more (_mixed).
    planned = _plan(call, call.q_memb, call.options.max_edges, sampler)
    H = call.query.size(1)
    # Not weighed where the tiles could not serve the call, or could not
    # hold the device's least edges even if every pair were one.
    least = tiles_min_edges(call.query.device)[0]
    pairs = call.ptr_q.diff() * call.ptr_k.diff()  # of each sequence
    share = ([] if any(unsupported(call).values())
             or H * call.query.size(0) * call.key.size(0) < least
             else list(tiles_share((call.q_memb, call.block, call.k_memb),
                                   call.ptr_q, call.ptr_k, pairs, per,
                                   call.options, dense)))
    values = sync([*call.checks, *planned.checks], *planned.scalars,
                  dense.sum(), H * pairs.sum(),
                  mask_bytes(call.ptr_q, call.ptr_k, H).sum(), *share)
    num_dense, num_pairs, num_bytes = values[len(planned.scalars):][:3]
    # The tiles' share of the sparse pairs' expected edges, where it pays:
    # half of them, and on a GPU enough to pay the tiles' fixed cost.
    tiles = (float(values[-2]) if share and values[-2] >= TILES_MIN_SHARE
             and values[-1] >= least else None)
    if num_dense == 0 and tiles is not None:
        return TiledChoice(tiles)
    if num_dense == 0:
        return planned.finish(values[:len(planned.scalars)])
    if num_dense == dense.numel():
        return DenseChoice(num_pairs, num_bytes, planned.seed)
    return MixedChoice(planned.seed, tiles)


def _sparse(call: Call, graph: SampledGraph, attention: str) -> Part:
    out, alpha = attend_graph(call, graph, attention)
    return Part(out, graph, alpha, graph.edge_counts())


def _plan(call: Call, q_memb: Tensor, max_edges: Optional[int],
          sampler: str) -> PlannedGraph:
    # The plan of the call's SBM with the query memberships q_memb (a mixed
    # batch zeroes its dense pairs'), from the call's first seed if drawn.
    opts = call.options
    return plan_fastrg(q_memb.detach(), call.block.detach(),
                       call.k_memb.detach(), ptr_q=call.ptr_q,
                       ptr_k=call.ptr_k, mode=opts.mode,
                       exploration=opts.exploration,
                       self_loops=opts.self_loops,
                       include_edges=call.include_edges, max_edges=max_edges,
                       generator=call.generator, backend=sampler,
                       seed=call.seed)


def _sample(call: Call, q_memb: Tensor, max_edges: Optional[int],
            sampler: str) -> SampledGraph:
    # The graph, with the call's checks raised at the sampler's one sync.
    planned = _plan(call, q_memb, max_edges, sampler)
    return planned.finish(sync([*call.checks, *planned.checks], *planned.scalars))


@torch.compiler.disable  # data-dependent row selections: runs eagerly
def _mixed(call: Call, dense: Tensor, sampler: str, attention: str,
           tiles: bool) -> Tuple[Part, str]:
    # Each (sequence, head) pair on its regime, and "d/n": the dense and
    # the non-empty pairs. The dense pairs run as a batch of one head,
    # their heads-first rows gathered (Q̂Ŝ with an identity block: the
    # blocks differ between heads); the sampler (or with `tiles` the tiled
    # regime) runs on the whole batch with the dense pairs' query
    # memberships zeroed, and their edges (exploration, self-loops,
    # included pairs) are dropped, their rows' output replaced. One read
    # sizes the split, the dense part's mask and its guard, beside the
    # counts and the included pairs' check.
    query, key, value, q_memb, block, k_memb, ptr_q, ptr_k = call[:8]
    Nq, H, _ = query.shape
    Nk, k = key.size(0), block.size(-1)
    checks = []
    if call.include_edges is not None:
        i, j, check = included_pairs(call.include_edges, ptr_q, ptr_k, Nq, Nk)
        checks.append(check)
    nq, nk = ptr_q.diff(), ptr_k.diff()
    # Counted over the non-empty sequences: the empty ones join either.
    busy = (nq * nk > 0)[:, None]
    d = dense.long()
    values = sync(checks, *split_sizes(ptr_q, ptr_k, dense),
                  (dense & busy).sum(), H * busy.sum(),
                  (d * (nq * nk)[:, None]).sum(),
                  (d * mask_bytes(ptr_q, ptr_k, 1)[:, None]).sum())
    sizes = SplitSizes(*(int(x) for x in values[:3]))
    counts = f"{int(values[3])}/{int(values[4])}"
    split = split_pairs(ptr_q, ptr_k, dense, Nq, Nk, sizes)
    inc = (None if call.include_edges is None
           else split_included(split, ptr_q, ptr_k, i, j))
    with full_precision(query.device):
        q_block = torch.einsum("nhu,huv->nhv", q_memb, block)

    def gather(x: Tensor, rows: Tensor) -> Tensor:
        return heads_first(x)[rows][:, None]

    eye = torch.eye(k, dtype=q_block.dtype, device=query.device)[None]
    dense_part = dense_regime(call._replace(
        query=gather(query, split.rows_q), key=gather(key, split.rows_k),
        value=gather(value, split.rows_k), q_memb=gather(q_block, split.rows_q),
        block=eye, k_memb=gather(k_memb, split.rows_k), ptr_q=split.ptr_q,
        ptr_k=split.ptr_k, include_edges=inc, checks=[],
        sink=None if call.sink is None else call.sink.repeat_interleave(Nq)[split.rows_q]),
        DenseChoice(values[5], values[6], call.seed))
    max_edges = call.options.max_edges
    pairs_left = (None if max_edges is None
                  else max(max_edges - int(dense_part.edges.sum()), 0))
    seq = torch.repeat_interleave(torch.arange(ptr_q.numel() - 1,
                                               device=query.device),
                                  ptr_q.diff(), output_size=Nq)
    sparse_memb = q_memb * (~dense)[seq][:, :, None]
    if tiles:  # (no max_edges: the tiles take none)
        out, graph, alpha, edges = _tiles(call._replace(q_memb=sparse_memb, checks=[]),
                                          sampler, attention)
        if graph is not None:
            graph = without_dense_pairs(graph, dense, seq)
    else:
        graph = _sample(call._replace(seed=None, checks=[]), sparse_memb,
                        pairs_left, sampler)
        graph = without_dense_pairs(graph, dense, seq)
        out, alpha = attend_graph(call, graph, attention)
        edges = graph.edge_counts()
    out = heads_first(out).index_copy(
        0, split.rows_q, dense_part.out[:, 0].to(out.dtype))
    # The dense pairs' counts, by their place in the dense batch (no read).
    edges = torch.where(dense, dense_part.edges[split.pair.clamp(min=0), 0],
                        edges)
    merged = alpha_all = None
    if call.need_graph and graph is not None:
        merged, alpha_all = merged_graph(
            [graph_keys(graph), dense_keys(split, dense_part.graph, Nq, Nk)],
            [alpha, dense_part.alpha], H, Nq, Nk, ptr_q, ptr_k)
    return Part(nodes_first(out, H), merged, alpha_all, edges), counts
