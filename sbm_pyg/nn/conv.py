r"""The SBM-Transformer attention as a PyG :class:`MessagePassing` layer."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.hooks import RemovableHandle
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import is_sparse, softmax

from sbm_pyg.nn.block_model import INITS, StochasticBlockModel
from sbm_pyg.nn.functional import (
    STE_MODES,
    _heads_first,
    _ste_probability,
    sparse_attention,
)
from sbm_pyg.sampling import MODES, SampledGraph, fastrg
from sbm_pyg.validation import invalid_values, require_tensor, sync

__all__ = ["SBMConv"]

Pair = Tuple[Optional[Tensor], Optional[Tensor]]


def _project(lin: Linear, x, name: str) -> Tensor:
    # Sparse node features (torch.sparse or torch_sparse.SparseTensor) are
    # projected with a sparse-dense product.
    if not (isinstance(x, Tensor) or is_sparse(x)):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be a [num_nodes, channels] matrix, got "
                         f"shape {tuple(x.size())}")
    if lin.in_channels > 0 and x.size(-1) != lin.in_channels:
        raise ValueError(f"{name} must have {lin.in_channels} channels, got "
                         f"{x.size(-1)}")
    if not is_sparse(x):
        return lin(x)
    weight_t = lin.weight.t()
    out = x @ weight_t if isinstance(x, SparseTensor) else torch.sparse.mm(x, weight_t)
    return out if lin.bias is None else out + lin.bias


def _batch_to_ptr(batch: Tensor, num_rows: int, num_graphs: int,
                  name: str) -> Tensor:
    require_tensor(name, batch, 1)
    if batch.dtype != torch.long:
        raise TypeError(f"{name} must be a LongTensor, got {batch.dtype}")
    if batch.numel() != num_rows:
        raise ValueError(f"{name} must have one entry per node ({num_rows}), "
                         f"got {batch.numel()}")
    return torch.searchsorted(batch, torch.arange(num_graphs + 1,
                                                  device=batch.device))


def _check_not_edges(batch) -> None:
    # conv(x, edge_index) is every PyG user's first call: say what this
    # layer takes instead.
    if is_sparse(batch) or (isinstance(batch, Tensor) and batch.dim() == 2):
        shape = tuple(batch.size()) if isinstance(batch, Tensor) else "sparse"
        raise ValueError(
            f"SBMConv takes (x, batch): batch must be the 1-D sequence index "
            f"of each node, got a {shape} graph, which looks like an "
            f"edge_index. SBMConv samples its own attention graph; pass a "
            f"local graph as include_edges=edge_index to add it to every "
            f"head's graph")


class _ClipGrad(torch.autograd.Function):
    r"""Identity forward; backward clips the gradient to :math:`[-1, 1]`."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.clamp(-1.0, 1.0)


class SBMConv(MessagePassing):
    r"""The attention of SBM-Transformer from `"Transformers meet Stochastic
    Block Models: Attention with Data-Adaptive Sparsity and Cost"
    <https://arxiv.org/abs/2210.15541>`_ (Cho et al., NeurIPS 2022).

    Each head :math:`h` projects queries, keys and values, infers a
    mixed-membership SBM from them (:class:`StochasticBlockModel`), samples a
    bipartite key→query graph :math:`\mathcal{G}_h` with fastRG
    (:func:`~sbm_pyg.sampling.fastrg`), and attends over its edges only:

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}_h(i)} \alpha_{hij}
        \mathbf{W}^V_h \mathbf{x}_j, \qquad
        \alpha_{hij} = \mathrm{softmax}_{j \in \mathcal{N}_h(i)} \left(
        \frac{(\mathbf{W}^Q_h \mathbf{x}_i)^{\top} (\mathbf{W}^K_h
        \mathbf{x}_j)}{\sqrt{d}} \right)

    with :math:`\mathcal{N}_h(i) \sim \mathrm{SBM}(\hat{\mathbf{Q}}_h,
    \hat{\mathbf{S}}_h, \hat{\mathbf{K}}_h)` within :math:`i`'s sequence.
    Gradients reach the SBM through a straight-through estimator on sampled
    edges: the paper's :math:`\partial L / \partial p_{ij} = \partial L /
    \partial a_{ij} \cdot \mathbf{q}_i^{\top}\mathbf{k}_j / \sqrt{d}` or
    the published code's :math:`\mathrm{clip}(\partial L / \partial
    a_{ij}, -1, 1)` (:obj:`ste`, see
    :func:`~sbm_pyg.nn.functional.sparse_attention`).

    Sequences are given PyG-style by a sorted :obj:`batch` vector or a CSR
    :obj:`ptr`; no padding is used and no edge crosses sequences. The cost
    is linear in the number of sampled edges.

    After each forward, :obj:`sampled_density` :math:`[H]` holds the
    fraction of pairs sampled (averaged over non-empty sequences) and
    :obj:`expected_density` :math:`[H]` the closed form
    :math:`\frac{1}{n_q n_k} \sum_{ij} p_{ij} = \frac{(\mathbf{1}^{\top}
    \hat{\mathbf{Q}}) \hat{\mathbf{S}} (\hat{\mathbf{K}}^{\top}
    \mathbf{1})}{n_q n_k}`, differentiable: the paper's sparsity
    regularizer.

    Args:
        in_channels (int or tuple): size of each input sample, or :obj:`-1`
            to infer it lazily; a tuple gives the sizes of source (key) and
            target (query) features.
        out_channels (int): size :math:`d` of each head.
        heads (int): number of heads :math:`H`. (default: :obj:`1`)
        concat (bool): concatenate the heads (else average). (default:
            :obj:`True`)
        num_clusters (int): SBM clusters :math:`k` per head. (default:
            :obj:`128`)
        dropout (float): dropout on the attention weights. (default:
            :obj:`0.`)
        bias (bool): learn additive biases in the projections. (default:
            :obj:`True`)
        root_weight (bool): add the skip term :math:`\mathbf{W}_1
            \mathbf{x}_i`. (default: :obj:`True`)
        exploration (float): random edge exploration :math:`\delta` added to
            every pair's rate while training; 0 in eval. (default: :obj:`0.01`)
        self_loops (bool): always connect query :math:`i` to key :math:`i`
            (the paper's "+I"; needs queries and keys to be the same
            nodes). (default: :obj:`False`)
        mode (str): :obj:`"exact"` (each pair with probability
            :math:`\min(p_{ij} + \delta, 1)`) or :obj:`"poisson"` (the
            paper's Algorithm 1, :math:`1 - e^{-(p_{ij} + \delta)}`), see
            :func:`~sbm_pyg.sampling.fastrg`. Since :math:`p_{ij} < 1` here
            (sigmoid memberships, :math:`\hat{\mathbf{S}}` sums to 1),
            :obj:`"poisson"` samples no pair with probability above
            :math:`1 - e^{-1-\delta} \approx 0.63`, so a head cannot reach
            full attention; :obj:`"exact"` is the default because it learns
            best on the repeated-token task (README, "Experiments").
            (default: :obj:`"exact"`)
        max_edges (int, optional): raise instead of sampling more edges
            than this in one forward.
        ste (str): the straight-through estimator, :obj:`"paper"` or
            :obj:`"published"`. (default: :obj:`"paper"`)
        sbm_init (str): initialization of the SBMs, :obj:`"paper"` (about
            25% of the pairs sampled) or :obj:`"dense"` (about 99%: the head
            starts as full attention), see :class:`StochasticBlockModel`.
            (default: :obj:`"paper"`)
        eval_seed (int, optional): in :obj:`eval()` mode, without a
            :obj:`generator`, sample every forward from a generator seeded
            with this, so that evaluating the same input twice gives the
            same graph and output (a :obj:`load_state_dict` round trip
            included). :obj:`None` samples afresh each time, as the paper
            evaluates. Training always samples afresh. (default:
            :obj:`None`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`. Setting
            :obj:`self.fuse = False` runs PyG's gather/scatter
            :meth:`message` path instead of the fused sparse kernels (same
            result, more memory).

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          (dense, :obj:`torch.sparse` or :class:`torch_sparse.SparseTensor`),
          batch vector :math:`(|\mathcal{V}|)` or a pair, or
          :obj:`ptr` :math:`(G + 1)` or a pair
        - **output:** node features :math:`(|\mathcal{V}_t|, H \cdot d)` or
          :math:`(|\mathcal{V}_t|, d)` if :obj:`concat=False`; with
          :obj:`return_attention_weights=True` also
          :obj:`(graph, alpha)`, the :class:`SampledGraph` and the weights
          :math:`(|\mathcal{E}|)` in its edge order.

    Example:
        >>> conv = SBMConv(16, 8, heads=2, num_clusters=4)
        >>> x = torch.randn(10, 16)
        >>> batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])  # two sequences
        >>> out = conv(x, batch)
        >>> out.shape, conv.sampled_density.shape  # heads concatenated; [H]
        (torch.Size([10, 16]), torch.Size([2]))
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        num_clusters: int = 128,
        dropout: float = 0.0,
        bias: bool = True,
        root_weight: bool = True,
        exploration: float = 0.01,
        self_loops: bool = False,
        mode: str = "exact",
        max_edges: Optional[int] = None,
        ste: str = "paper",
        sbm_init: str = "paper",
        eval_seed: Optional[int] = None,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        # PyG sets fuse only when message_and_aggregate is implemented; here
        # it selects the fused sparse kernels over the message() path.
        self.fuse = True
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if ste not in STE_MODES:
            raise ValueError(f"ste must be one of {STE_MODES}, got {ste!r}")
        if sbm_init not in INITS:
            raise ValueError(f"sbm_init must be one of {INITS}, got {sbm_init!r}")
        if not (isinstance(exploration, (int, float)) and exploration >= 0):
            raise ValueError(f"exploration must be >= 0, got {exploration!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.num_clusters = num_clusters
        self.dropout = dropout
        self.root_weight = root_weight
        self.exploration = exploration
        self.self_loops = self_loops
        self.mode = mode
        self.max_edges = max_edges
        self.ste = ste
        if eval_seed is not None and (not isinstance(eval_seed, int)
                                      or isinstance(eval_seed, bool)):
            raise TypeError(f"eval_seed must be an int or None, got "
                            f"{eval_seed!r}")
        self.eval_seed = eval_seed
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.lin_key = Linear(in_channels[0], heads * out_channels, bias=bias)
        self.lin_query = Linear(in_channels[1], heads * out_channels, bias=bias)
        self.lin_value = Linear(in_channels[0], heads * out_channels, bias=bias)
        self.lin_skip = None
        if root_weight:
            self.lin_skip = Linear(in_channels[1],
                                   heads * out_channels if concat else out_channels,
                                   bias=bias)
        self.sbm = StochasticBlockModel(heads, out_channels, num_clusters,
                                        init=sbm_init)
        self.sampled_density: Optional[Tensor] = None
        self.expected_density: Optional[Tensor] = None
        self._alpha: Optional[Tensor] = None
        self._graph_hooks: OrderedDict[int, Callable] = OrderedDict()
        self.reset_parameters()

    def register_graph_hook(self, hook: Callable[[SBMConv, SampledGraph], None]
                            ) -> RemovableHandle:
        r"""Calls :obj:`hook(module, graph)` with every graph this layer
        samples (e.g. :class:`sbm_pyg.theory.GraphRecorder`); returns a handle
        whose :meth:`remove` unregisters it."""
        handle = RemovableHandle(self._graph_hooks)
        self._graph_hooks[handle.id] = hook
        return handle

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.lin_skip is not None:
            self.lin_skip.reset_parameters()
        self.sbm.reset_parameters()

    def _pointers(self, batch, ptr, num_src: int, num_dst: int
                  ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """CSR pointers (ptr_k, ptr_q) of key and query rows."""
        if ptr is not None:
            if batch is not None:
                raise ValueError("pass either batch or ptr, not both")
            return ptr if isinstance(ptr, tuple) else (ptr, ptr)
        if batch is None:
            return None, None
        _check_not_edges(batch)
        batch_src, batch_dst = batch if isinstance(batch, tuple) else (batch, batch)
        if batch_src is None or batch_dst is None:
            raise ValueError("batch must give both the source and the "
                             "target batch vector")
        flags = [(b.diff() < 0).any() | (b < 0).any()
                 for b in (batch_src, batch_dst) if isinstance(b, Tensor)]
        last = [b[-1] for b in (batch_src, batch_dst)
                if isinstance(b, Tensor) and b.numel() > 0]
        flags_and_max = sync([(flag, "batch must be sorted and non-negative "
                                     "(as PyG's DataLoader makes it)")
                              for flag in flags],
                             *last)
        num_graphs = int(max(flags_and_max, default=-1)) + 1
        return (_batch_to_ptr(batch_src, num_src, num_graphs, "batch"),
                _batch_to_ptr(batch_dst, num_dst, num_graphs, "batch"))

    def forward(
        self,
        x: Union[Tensor, SparseTensor, Tuple],
        batch: Union[None, Tensor, Pair] = None,
        *,
        ptr: Union[None, Tensor, Pair] = None,
        include_edges: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
        generator: Optional[torch.Generator] = None,
    ):
        r"""Runs the layer.

        Args:
            x (Tensor or (Tensor, Tensor)): node features, or
                :obj:`(x_src, x_dst)` for bipartite attention (keys and
                values from :obj:`x_src`, queries from :obj:`x_dst`).
            batch (LongTensor or (LongTensor, LongTensor), optional): sorted
                sequence index of each node (one sequence if :obj:`None`).
            ptr (LongTensor or pair, optional): CSR pointers instead of
                :obj:`batch` (avoids a host sync).
            include_edges (LongTensor, EdgeIndex, SparseTensor or
                torch.sparse tensor, optional): :obj:`[2, E]` edges
                (source/key, target/query) or an :obj:`adj_t` (rows are
                queries), e.g. the input graph's :obj:`edge_index`, added to
                every head's sampled graph without duplicates
                (structure-aware attention); they get the
                same straight-through gradient as sampled edges.
            return_attention_weights (bool, optional): also return
                :obj:`(graph, alpha)`.
            generator (torch.Generator, optional): randomness of the
                sampler and of attention dropout.
        """
        H, C = self.heads, self.out_channels
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        query = _project(self.lin_query, x_dst, "x_dst").view(-1, H, C)
        key = _project(self.lin_key, x_src, "x_src").view(-1, H, C)
        value = _project(self.lin_value, x_src, "x_src").view(-1, H, C)
        q_memb, block, k_memb = self.sbm(query, key)
        out, graph, alpha = self._sample_and_attend(
            query, key, value, q_memb, block, k_memb, batch, ptr,
            include_edges, generator, bool(return_attention_weights))
        Nq = query.size(0)
        out = out.reshape(Nq, H * C) if self.concat else out.mean(dim=1)
        if self.lin_skip is not None:
            out = out + _project(self.lin_skip, x_dst, "x_dst")
        if return_attention_weights:
            return out, (graph, alpha)
        return out

    # Data-dependent sizes (the sampled edge count, batch pointers): runs
    # eagerly under torch.compile, which compiles the dense code around it.
    @torch.compiler.disable
    def _sample_and_attend(self, query: Tensor, key: Tensor, value: Tensor,
                           q_memb: Tensor, block: Tensor, k_memb: Tensor,
                           batch, ptr, include_edges: Optional[Tensor],
                           generator: Optional[torch.Generator],
                           need_alpha: bool
                           ) -> Tuple[Tensor, SampledGraph, Optional[Tensor]]:
        H, C = self.heads, self.out_channels
        Nq, Nk = query.size(0), key.size(0)
        ptr_k, ptr_q = self._pointers(batch, ptr, Nk, Nq)
        if generator is None and not self.training and self.eval_seed is not None:
            generator = torch.Generator(query.device).manual_seed(self.eval_seed)
        try:
            graph = fastrg(q_memb.detach(), block.detach(), k_memb.detach(),
                           ptr_q=ptr_q, ptr_k=ptr_k, mode=self.mode,
                           exploration=self.exploration if self.training else 0.0,
                           self_loops=self.self_loops,
                           include_edges=include_edges,
                           max_edges=self.max_edges, generator=generator)
        except ValueError as err:
            # Sigmoid memberships are never negative: NaN or inf came in
            # with the features (or the weights). Name what the user passed.
            for memb, source in (("q_memb", "x (x_dst: the queries)"),
                                 ("k_memb", "x (x_src: the keys)")):
                if str(err) == invalid_values(memb):
                    raise ValueError(
                        f"SBMConv: {source} or the layer's weights contain "
                        f"NaN or inf, so its SBM memberships are not "
                        f"finite") from err
            raise
        for hook in self._graph_hooks.values():
            hook(self, graph)
        # The straight-through estimator uses the edge probabilities'
        # gradient only: their values are never computed.
        need_ste = torch.is_grad_enabled() and q_memb.requires_grad
        self._record_density(graph, q_memb, block, k_memb)

        if self.fuse:
            # The weights cost a pass of their own on the Triton path.
            out = sparse_attention(
                query, key, value, graph, None, self.dropout,
                self.training, ste=self.ste, generator=generator,
                return_attention_weights=need_alpha,
                sbm=(q_memb, block, k_memb) if need_ste else None)
            out, alpha = out if need_alpha else (out, None)
            return out, graph, alpha
        edge_prob = (_ste_probability(q_memb, block, k_memb, graph)
                     if need_ste else None)
        _, col = graph.csr()
        out = self.propagate(
            torch.stack([col, graph.row().long()]),
            query=_heads_first(query), key=_heads_first(key),
            value=_heads_first(value), edge_prob=edge_prob,
            size=(H * Nk, H * Nq))
        alpha, self._alpha = self._alpha, None
        return out.view(H, Nq, C).transpose(0, 1), graph, alpha

    def message(self, query_i: Tensor, key_j: Tensor, value_j: Tensor,
                edge_prob: Optional[Tensor], index: Tensor,
                ptr: Optional[Tensor], size_i: Optional[int]) -> Tensor:
        r"""The reference path (:obj:`self.fuse = False`), TransformerConv
        style: scores, segment softmax and weighted values per edge, with
        :obj:`[E, H, d]` gathers; same result as the fused kernels."""
        score = (query_i * key_j).sum(dim=-1) / math.sqrt(self.out_channels)
        if edge_prob is not None and self.ste == "paper":
            # Straight-through: value unchanged, d score / d p = score.
            score = score + score.detach() * (edge_prob - edge_prob.detach())
        elif edge_prob is not None:
            # Value unchanged, dL/dp = clip(dL/d score, -1, 1).
            score = score + _ClipGrad.apply(edge_prob - edge_prob.detach())
        alpha = softmax(score, index, ptr, size_i)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return value_j * alpha.unsqueeze(-1)

    def _record_density(self, graph: SampledGraph, q_memb: Tensor,
                        block: Tensor, k_memb: Tensor) -> None:
        pairs = (graph.ptr_q.diff() * graph.ptr_k.diff()).to(q_memb.dtype)
        nonempty = (pairs > 0).to(q_memb.dtype)[:, None]  # [G, 1]
        count = nonempty.sum().clamp(min=1)
        mass_q = torch.segment_reduce(q_memb, "sum", offsets=graph.ptr_q,
                                      axis=0, unsafe=True)  # [G, H, k]
        mass_k = torch.segment_reduce(k_memb, "sum", offsets=graph.ptr_k,
                                      axis=0, unsafe=True)
        expected = torch.einsum("ghu,huv,ghv->gh", mass_q, block, mass_k)
        expected = expected / pairs.clamp(min=1)[:, None]
        self.expected_density = (expected * nonempty).sum(0) / count
        self.sampled_density = (graph.density().to(q_memb.dtype)
                                * nonempty).sum(0) / count

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.out_channels}, heads={self.heads}, "
                f"num_clusters={self.num_clusters}, mode={self.mode!r}, "
                f"ste={self.ste!r})")
