r"""Sparse attention on sampled graphs and the straight-through estimator.

Both functions run on the block-diagonal CSR form of a
:class:`~sbm_pyg.sampling.SampledGraph` (see :mod:`sbm_pyg.ops.csr`), for
all heads and sequences of a ragged batch in one kernel call, and keep only
:math:`O(E + N H D)` for backward: nothing of size :obj:`[E, D]` or
:obj:`[E, k]`. The attention runs on one of three backends
(:mod:`sbm_pyg.ops`): the fused kernel of the compiled extension (CPU), the
Triton kernels (CUDA), or PyTorch's CSR kernels (any device, the reference).
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Tuple, Union, overload

import torch
from torch import Tensor

from sbm_pyg.nn.block_model import _per_chunk, _row_chunks
from sbm_pyg.ops.backend_info import resolve_backend
from sbm_pyg.ops.csr import full_precision, heads_first, nodes_first
from sbm_pyg.ops.dropout import as_seed
from sbm_pyg.ops.fused_attention import fused_attention
from sbm_pyg.ops.graph import CSRGraph
from sbm_pyg.ops.torch_attention import SDDMM, SDDMMGradOnly, SparseAttention
from sbm_pyg.sampling import SampledGraph
from sbm_pyg.sampling.fastrg_op import stream_seed
from sbm_pyg.validation import check_generator, require_tensor

__all__ = ["sparse_attention", "with_sink", "edge_probability",
           "straight_through_probability", "STE_MODES"]


# The PyTorch path's CSR kernels are opaque to the compiler: torch.compile
# runs these functions eagerly (a graph break).
@torch.compiler.disable
def edge_probability(q_memb: Tensor, block: Tensor, k_memb: Tensor,
                     graph: SampledGraph) -> Tensor:
    r"""The SBM probability of each sampled edge, differentiable:

    .. math::
        p_e = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}_h \hat{\mathbf{K}}_j^{\top}
        \quad \text{for edge } e = (j \to i) \text{ in head } h.

    Computed as a sampled dense-dense product of :math:`\hat{\mathbf{Q}}
    \hat{\mathbf{S}}` and :math:`\hat{\mathbf{K}}`; the gradients to them are
    sparse-dense products, so no :obj:`[E, k]` tensor is kept.

    Args:
        q_memb (Tensor): :obj:`[N_q, H, k]`.
        block (Tensor): :obj:`[H, k, k]`.
        k_memb (Tensor): :obj:`[N_k, H, k]`.
        graph (SampledGraph): the sampled edges.

    Returns:
        Tensor :obj:`[E]` in edge order.

    Example:
        >>> from sbm_pyg.sampling import SampledGraph
        >>> memb = torch.full((3, 1, 2), 0.5)  # [N, H, k]
        >>> block = torch.full((1, 2, 2), 0.25)  # [H, k, k], sums to 1
        >>> graph = SampledGraph.from_edge_index(torch.tensor([[0], [2]]), 3, 3)
        >>> edge_probability(memb, block, memb, graph)
        tensor([0.2500])
    """
    _check_memberships(graph, q_memb, block, k_memb)
    return SDDMM.apply(graph.csr, _query_block(q_memb, block),
                       heads_first(k_memb))


def _query_block(q_memb: Tensor, block: Tensor) -> Tensor:
    # Q̂ Ŝ per head, heads first: [N_q, H, k] x [H, k, k] -> [H * N_q, k],
    # in chunks of rows: Ŝ's gradient Q̂ᵀ d(Q̂ Ŝ) sums over all N_q rows,
    # which one product per head runs on a few k x k tiles (0.81 ms at
    # N = 16384 on an H200, 36x its floor); per chunk, on H N / ROW_CHUNK.
    N, k = q_memb.size(0), block.size(-1)
    x, S = _row_chunks(q_memb.transpose(0, 1))  # [H S, L, k]
    out = torch.bmm(x, _per_chunk(block, S))
    return out.view(block.size(0), S * x.size(1), k)[:, :N].reshape(-1, k)


def _check_memberships(graph: SampledGraph, q_memb: Tensor, block: Tensor,
                       k_memb: Tensor, prefix: str = "") -> None:
    for name, t in (("q_memb", q_memb), ("block", block), ("k_memb", k_memb)):
        require_tensor(prefix + name, t, 3, floating=True)
    _check_graph(graph, q_memb.size(0), k_memb.size(0), q_memb.size(1),
                 prefix + "q_memb", "k_memb")


@torch.compiler.disable
def straight_through_probability(q_memb: Tensor, block: Tensor,
                                 k_memb: Tensor, graph: SampledGraph) -> Tensor:
    r""":func:`edge_probability` for the straight-through estimator: zeros
    :obj:`[E]` (the attention's forward never reads :math:`p_e`, so the
    :math:`O(E k)` product is skipped) with :func:`edge_probability`'s
    backward."""
    return SDDMMGradOnly.apply(graph.csr, _query_block(q_memb, block),
                               heads_first(k_memb))


def _check_graph(graph: SampledGraph, Nq: int, Nk: int, H: int, q_name: str,
                 k_name: str) -> None:
    if not isinstance(graph, SampledGraph):
        raise TypeError(f"graph must be a SampledGraph, got "
                        f"{type(graph).__name__}")
    if (graph.num_queries, graph.num_keys, graph.num_heads) != (Nq, Nk, H):
        raise ValueError(
            f"graph has N_q={graph.num_queries}, N_k={graph.num_keys}, "
            f"H={graph.num_heads} but {q_name} and {k_name} give N_q={Nq}, "
            f"N_k={Nk}, H={H}")


STE_MODES = ("paper", "published")


@overload
def sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph: SampledGraph,
    edge_prob: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    *,
    ste: str = "paper",
    generator: Optional[torch.Generator] = None,
    dropout_seed: Union[int, Tensor, None] = None,
    return_attention_weights: Literal[False] = False,
    backend: Optional[str] = "auto",
    sbm: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
    sink: Optional[Tensor] = None,
) -> Tensor:
    pass


@overload
def sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph: SampledGraph,
    edge_prob: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    *,
    ste: str = "paper",
    generator: Optional[torch.Generator] = None,
    dropout_seed: Union[int, Tensor, None] = None,
    return_attention_weights: Literal[True],
    backend: Optional[str] = "auto",
    sbm: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
    sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    pass


@overload
def sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph: SampledGraph,
    edge_prob: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    *,
    ste: str = "paper",
    generator: Optional[torch.Generator] = None,
    dropout_seed: Union[int, Tensor, None] = None,
    return_attention_weights: bool = False,
    backend: Optional[str] = "auto",
    sbm: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
    sink: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    pass


def sparse_attention(  # noqa: PLR0913
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph: SampledGraph,
    edge_prob: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    *,
    ste: str = "paper",
    generator: Optional[torch.Generator] = None,
    dropout_seed: Union[int, Tensor, None] = None,
    return_attention_weights: bool = False,
    backend: Optional[str] = "auto",
    sbm: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
    sink: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    r"""Masked softmax attention on the sampled edges only.

    For each head :math:`h` and query :math:`i` with sampled keys
    :math:`\mathcal{N}_h(i)`:

    .. math::
        a_{hij} &= \frac{\mathbf{q}_{hi}^{\top} \mathbf{k}_{hj}}{\sqrt{D}}
        \, m_{hij}, \qquad m_{hij} = 1 \\
        \alpha_{hij} &= \frac{\exp(a_{hij})}
        {\sum_{j' \in \mathcal{N}_h(i)} \exp(a_{hij'})} \\
        \mathbf{o}_{hi} &= \sum_{j \in \mathcal{N}_h(i)} \alpha_{hij}
        \mathbf{v}_{hj}

    A query with no sampled key outputs zeros. With a :obj:`sink` (a
    learned logit :math:`b_h` per head, as in StreamingLLM's and gpt-oss's
    attention sinks), each row's softmax has one more term in its
    denominator, a key of value zero that every query sees:

    .. math::
        \alpha_{hij} = \frac{\exp(a_{hij})}{e^{b_h} +
        \sum_{j' \in \mathcal{N}_h(i)} \exp(a_{hij'})},

    so that a row can put its weight nowhere (the sink's share,
    :math:`1 - \sum_j \alpha_{hij}`) instead of on its few sampled keys;
    computed as the output without it times :math:`\sigma(\mathrm{lse}_{hi}
    - b_h)`, with :math:`\mathrm{lse}_{hi}` the row's log-sum-exp, which
    the kernels keep and differentiate. With :obj:`edge_prob`
    (:math:`p_e`, e.g. from :func:`edge_probability`), the mask entry
    :math:`m_e` passes a straight-through gradient to :math:`p_e`; the
    forward value does not depend on :math:`p_e`. :obj:`ste` chooses it:

    .. math::
        \frac{\partial L}{\partial p_e} =
        \begin{cases}
        \dfrac{\partial L}{\partial a_e} \cdot
        \dfrac{\mathbf{q}_i^{\top}\mathbf{k}_j}{\sqrt{D}}
        & \text{"paper" (the paper's equation)} \\
        \operatorname{clip}\left(\dfrac{\partial L}{\partial a_e},
        -1, 1\right) & \text{"published" (the published code)}
        \end{cases}

    where :math:`\partial L / \partial a_e = \alpha_e (g_e -
    \sum_{e' \in \mathcal{N}(i)} \alpha_{e'} g_{e'})` with :math:`g_e =
    \partial L / \partial \alpha_e`: the published one sums to zero over a
    query's edges before clipping, the paper's does not.

    Time :math:`O(E D)`, memory :math:`O(E + N H D)`: no :obj:`[E, D]`
    tensor is built or kept. Half precision inputs are computed in float32
    (the Triton kernels read them as they are).

    Args:
        query (Tensor): :obj:`[N_q, H, D]`.
        key (Tensor): :obj:`[N_k, H, D]`.
        value (Tensor): :obj:`[N_k, H, D_v]`.
        graph (SampledGraph): edges sorted by :obj:`(head, query, key)`.
        edge_prob (Tensor, optional): :obj:`[E]` probabilities of the
            sampled edges, for the straight-through estimator.
        dropout (float): dropout on the attention weights (when
            :obj:`training`).
        training (bool): whether dropout is applied.
        ste (str): the straight-through estimator, :obj:`"paper"` or
            :obj:`"published"` (see above).
        generator (torch.Generator, optional): source of the dropout
            mask's seed (the mask is a function of it and each edge,
            :mod:`sbm_pyg.ops.dropout`: the same on every backend).
        dropout_seed (int or Tensor, optional): the mask's seed itself,
            instead of a draw from :obj:`generator`: a one-element int64
            tensor on the device, which the kernels read there (what a
            static call passes: nothing drawn on the host, so that a
            captured graph draws a new one each replay), or an int.
        return_attention_weights (bool): also return :math:`\alpha`
            :obj:`[E]` in edge order (before dropout).
        backend (str, optional): :obj:`"cpp"`, the fused kernel of the
            compiled extension (CPU), or :obj:`"triton"`, fused kernels
            (CUDA; on the CPU only under ``TRITON_INTERPRET=1``, for
            testing), both keeping nothing per edge for backward (the
            output and each row's log-sum-exp; under dropout the mask is
            recomputed), or :obj:`"torch"`, CSR kernels of PyTorch (any
            device; the reference), or :obj:`"auto"`: the fused kernel for
            the tensors' device (:func:`~sbm_pyg.ops.resolve_backend`).
        sbm ((Tensor, Tensor, Tensor), optional): instead of
            :obj:`edge_prob`, the SBM the graph was sampled from,
            :obj:`(q_memb [N_q, H, k], block [H, k, k], k_memb [N_k, H,
            k])`: its edge probabilities get the straight-through gradient
            as with :obj:`edge_prob=edge_probability(*sbm, graph)`; the
            C++ backend sums it into the memberships inside its
            backward pass, with no :obj:`[E]` tensor :math:`p`.
        sink (Tensor, optional): :obj:`[H]`, each head's sink logit
            :math:`b_h` (differentiable; or :obj:`[H * N_q]`, a logit per
            heads-first row); the returned weights then leave out the
            sink's share.

    Returns:
        Tensor :obj:`[N_q, H, D_v]`, or :obj:`(out, alpha)`.

    Example:
        >>> from sbm_pyg.sampling import SampledGraph
        >>> graph = SampledGraph.from_edge_index(
        ...     torch.tensor([[0, 1, 1], [1, 0, 1]]), num_queries=2, num_keys=2)
        >>> q = k = v = torch.randn(2, 1, 4)  # [N, H, D]
        >>> out, alpha = sparse_attention(q, k, v, graph, return_attention_weights=True)
        >>> out.shape, alpha[0].item()  # query 0 has one key: weight 1
        (torch.Size([2, 1, 4]), 1.0)
    """
    if backend == "dense":
        raise ValueError("backend 'dense' samples its own mask and takes no "
                         "graph: it runs inside SBMConv "
                         "(attention_backend='dense'); sparse_attention "
                         "takes 'auto', 'cpp', 'triton' or 'torch'")
    require_tensor("query", query, 3, floating=True)
    require_tensor("key", key, 3, floating=True)
    require_tensor("value", value, 3, floating=True)
    Nq, H, D = query.shape
    if key.shape != (key.size(0), H, D):
        raise ValueError(f"key must have shape [N_k, {H}, {D}] to match query "
                         f"{tuple(query.shape)}, got {tuple(key.shape)}")
    if value.shape[:2] != key.shape[:2]:
        raise ValueError(f"value must have shape [{key.size(0)}, {H}, D_v] to "
                         f"match key, got {tuple(value.shape)}")
    _check_graph(graph, Nq, key.size(0), H, "query", "key")
    if edge_prob is not None:
        require_tensor("edge_prob", edge_prob, 1, floating=True)
        if edge_prob.numel() != graph.num_edges:
            raise ValueError(f"edge_prob must have one entry per edge "
                             f"({graph.num_edges}), got {edge_prob.numel()}")
    if sbm is not None:
        _check_sbm_argument(sbm, graph, edge_prob)
    check_sink(sink, H, H * Nq)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if ste not in STE_MODES:
        raise ValueError(f"ste must be one of {STE_MODES}, got {ste!r}")
    check_generator(generator, query.device)
    dropout = dropout if training else 0.0
    backend = resolve_backend("attention", backend, query.device)
    scale = 1.0 / math.sqrt(D)
    q, k, v = heads_first(query), heads_first(key), heads_first(value)
    # One draw from the generator, on the host (no sync): the mask's seed.
    seed: Union[int, Tensor] = 0
    if dropout > 0:
        seed = (stream_seed(generator, query.device) if dropout_seed is None
                else as_seed("dropout_seed", dropout_seed, query.device))
    factors = None if sbm is None else sbm_factors(
        sbm, torch.float64 if query.dtype == torch.float64 else torch.float32)
    flat, alpha, lse = edge_attention(graph, q, k, v, edge_prob, factors, scale,
                                      ste, return_attention_weights, dropout,
                                      seed, backend)
    if sink is not None:
        flat, alpha = with_sink(flat, alpha, lse, sink, graph.csr)
    out = nodes_first(flat.to(value.dtype), H)
    if return_attention_weights:
        assert alpha is not None  # asked for from the kernel
        return out, alpha
    return out


def check_sink(sink: Optional[Tensor], heads: int, rows: Optional[int] = None) -> None:
    r"""Raises a :class:`ValueError` (or :class:`TypeError`) naming
    :obj:`sink` unless it is :obj:`None` or a floating tensor of one logit
    per head (or, given :obj:`rows`, per row)."""
    if sink is None:
        return
    require_tensor("sink", sink, 1, floating=True)
    if sink.numel() not in (heads, heads if rows is None else rows):
        raise ValueError(f"sink must have one logit per head ({heads})"
                         + ("" if rows is None else f" or per row ({rows})")
                         + f", got shape {tuple(sink.shape)}")


def with_sink(out: Tensor, alpha: Optional[Tensor], lse: Tensor, sink: Tensor,
              graph: Optional[CSRGraph] = None
              ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""An attention's output and weights with a sink: :obj:`out`
    :obj:`[H * N_q, D_v]` (heads-first rows) and :obj:`alpha` :obj:`[E]`
    (in :obj:`graph`'s edge order) times :math:`\sigma(\mathrm{lse}_{hi} -
    b_h)`, from each row's log-sum-exp :obj:`lse` :obj:`[H * N_q]` and the
    sink logits :obj:`sink` (:obj:`[H]`, or one per row); differentiable in
    :obj:`out`, :obj:`lse` and :obj:`sink` (a row with no edge, lse
    :math:`-\infty`, keeps zeros and no gradient)."""
    rows = sink.to(lse.dtype)
    if rows.numel() != lse.numel():  # one per head: each head's rows
        rows = rows.repeat_interleave(lse.numel() // max(rows.numel(), 1))
    keep = torch.sigmoid(lse - rows)
    out = out * keep[:, None].to(out.dtype)
    if alpha is not None and graph is not None:
        alpha = alpha * keep.detach().to(alpha.dtype).index_select(0, graph.row())
    return out, alpha


def sbm_factors(sbm: Tuple[Tensor, Tensor, Tensor], dtype: torch.dtype
                ) -> Tuple[Tensor, Tensor]:
    r"""The SBM's two factors as the kernels read them, heads-first in
    :obj:`dtype` and full precision: :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`
    :obj:`[H * N_q, k]` and :math:`\hat{\mathbf{K}}` :obj:`[H * N_k, k]`
    (:math:`p_{ij}` is their rows' dot product)."""
    q_memb, block, k_memb = sbm
    with full_precision(q_memb.device):
        return (_query_block(q_memb.to(dtype), block.to(dtype)),
                heads_first(k_memb.to(dtype)).contiguous())


def edge_attention(graph: SampledGraph, q: Tensor, k: Tensor, v: Tensor,
                   edge_prob: Optional[Tensor],
                   factors: Optional[Tuple[Tensor, Tensor]], scale: float,
                   ste: str, weights: bool, dropout: float,
                   dropout_seed: Union[int, Tensor],
                   backend: str) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    r"""The attention over :obj:`graph`'s edges on the resolved
    :obj:`backend`'s kernel, heads-first (:obj:`q` :obj:`[H * N_q, D]`,
    checked by the caller), the straight-through gradient to the SBM's
    :func:`sbm_factors` where given (a caller that has them, e.g. the
    tiled regime's, passes its own): the output :obj:`[H * N_q, D_v]`, the
    weights per edge (with :obj:`weights`) and each row's log-sum-exp."""
    if backend in ("cpp", "triton"):
        return _fused_attention(
            graph.csr, q, k, v, edge_prob, factors, scale, ste, weights, dropout,
            dropout_seed, triton=backend == "triton",
            triton_on_cpu=backend == "triton" and q.device.type == "cpu")
    return _torch_attention(graph, q, k, v, edge_prob, factors, scale, dropout,
                            dropout_seed, ste)


# The PyTorch path's autograd functions take the graph object: torch.compile
# runs them eagerly (a graph break). The fused path is one operator with
# fake kernels, which the compiler traces.
@torch.compiler.disable
def _torch_attention(graph: SampledGraph, q: Tensor, k: Tensor, v: Tensor,
                     edge_prob: Optional[Tensor],
                     factors: Optional[Tuple[Tensor, Tensor]],
                     scale: float, dropout: float,
                     dropout_seed: Union[int, Tensor],
                     ste: str) -> Tuple[Tensor, Tensor, Tensor]:
    if factors is not None:  # zeros with edge_probability's backward
        edge_prob = SDDMMGradOnly.apply(graph.csr, *factors)
    return SparseAttention.apply(graph.csr, q, k, v, edge_prob, scale,
                                 dropout, dropout_seed, ste)


def _check_sbm_argument(sbm, graph: SampledGraph, edge_prob: Optional[Tensor]) -> None:
    if edge_prob is not None:
        raise ValueError("give edge_prob or sbm, not both")
    if not isinstance(sbm, tuple):  # the kernels' argument: a tuple only
        raise TypeError(f"sbm must be a tuple (q_memb, block, k_memb), got "
                        f"{type(sbm).__name__}")
    q_memb, block, k_memb = check_sbm_shapes(sbm)
    _check_memberships(graph, q_memb, block, k_memb, prefix="sbm's ")


def check_sbm_shapes(sbm: object, Nq: Optional[int] = None, Nk: Optional[int] = None,
              H: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Checks an :obj:`sbm` argument :obj:`(q_memb [N_q, H, k], block [H,
    k, k], k_memb [N_k, H, k])`, the sizes given matched, and returns it;
    raises a :class:`TypeError` or :class:`ValueError` naming it."""
    if not (isinstance(sbm, (tuple, list)) and len(sbm) == 3):
        raise TypeError(f"sbm must be a tuple (q_memb, block, k_memb), got "
                        f"{type(sbm).__name__}")
    q_memb, block, k_memb = sbm
    for name, t in (("q_memb", q_memb), ("block", block), ("k_memb", k_memb)):
        require_tensor("sbm's " + name, t, 3, floating=True)
    k = q_memb.size(2)
    expect = ((q_memb.size(0) if Nq is None else Nq,
               q_memb.size(1) if H is None else H, k),
              (q_memb.size(1) if H is None else H, k, k),
              (k_memb.size(0) if Nk is None else Nk,
               q_memb.size(1) if H is None else H, k))
    if (q_memb.shape, block.shape, k_memb.shape) != expect:
        raise ValueError(f"sbm must be (q_memb [N_q, H, k], block [H, k, k], "
                         f"k_memb [N_k, H, k]) with the queries' and keys' "
                         f"N_q, N_k and H, here shapes {list(expect)}; got "
                         f"{tuple(q_memb.shape)}, {tuple(block.shape)}, "
                         f"{tuple(k_memb.shape)}")
    return q_memb, block, k_memb


def _fused_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                     edge_prob: Optional[Tensor],
                     factors: Optional[Tuple[Tensor, Tensor]],
                     scale: float, ste: str, weights: bool, dropout: float,
                     dropout_seed: Union[int, Tensor], triton: bool,
                     triton_on_cpu: bool) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    # The kernels compute in float32 or float64. The Triton kernels read
    # half precision rows as they are, half the bytes of each gathered row;
    # for the C++ kernel (and for the weights, recomputed outside the
    # kernel) half precision inputs are cast, and autograd casts their
    # gradients back.
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    half = (torch.float16, torch.bfloat16)
    rows = (q.dtype if triton and not weights and q.dtype in half
            and k.dtype == v.dtype == q.dtype else dtype)
    q_block = k_memb = None
    if factors is not None:
        q_block, k_memb = (x.to(dtype).contiguous() for x in factors)
    with full_precision(q.device):
        if edge_prob is not None:
            edge_prob = edge_prob.to(dtype)
        return fused_attention(
            graph, q.to(rows).contiguous(), k.to(rows).contiguous(),
            v.to(rows).contiguous(), edge_prob, q_block, k_memb,
            scale=scale, ste=ste, weights=weights, dropout=dropout,
            dropout_seed=dropout_seed, triton_on_cpu=triton_on_cpu)
