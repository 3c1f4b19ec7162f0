r"""The SBM-Transformer attention as a PyG :class:`MessagePassing` layer."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Dict, Literal, Optional, Tuple, Union, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.hooks import RemovableHandle
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import softmax

from sbm_pyg.nn.block_model import (
    INITS,
    StochasticBlockModel,
    expected_densities,
    mean_densities,
)
from sbm_pyg.nn.functional import (
    STE_MODES,
    sparse_attention,
    straight_through_probability,
)
from sbm_pyg.nn.inputs import project, raise_for_features, sequence_pointers
from sbm_pyg.ops.backend_info import (
    ATTENTION_BACKENDS,
    BACKENDS,
    resolve_backend,
)
from sbm_pyg.ops.csr import full_precision, heads_first, nodes_first
from sbm_pyg.ops.dense_attention import (
    DenseAttention,
    dense_attention,
    mask_bytes,
    mask_keys,
)
from sbm_pyg.ops.torch_attention import clip_grad
from sbm_pyg.sampling import MODES, SampledGraph, fastrg
from sbm_pyg.sampling.checks import (
    check_draws,
    check_pointers,
    check_sbm,
    included_pairs,
)
from sbm_pyg.sampling.fastrg_op import included_csr, stream_seed
from sbm_pyg.validation import sync

__all__ = ["SBMConv"]

Pair = Tuple[Optional[Tensor], Optional[Tensor]]
# The attention paths a layer can run: sparse_attention's backends, the
# dense-regime kernel, or PyG's gather/scatter message() (the reference,
# with [E, H, d] gathers).
LAYER_ATTENTION_BACKENDS = ATTENTION_BACKENDS + ("message_passing",)


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

    After each forward, :obj:`last_backends` says which kernels ran, e.g.
    :obj:`{'sampler': 'cpp', 'attention': 'cpp'}`, and
    :obj:`sampled_density` :math:`[H]` holds the
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
            paper's Algorithm 1, :math:`1 - e^{-(p_{ij} + \delta)}`, which
            never exceeds :math:`1 - e^{-1-\delta} \approx 0.63` here, so
            a head cannot reach full attention), see
            :func:`~sbm_pyg.sampling.fastrg`. (default: :obj:`"exact"`)
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
        sampler_backend (str): the backend of
            :func:`~sbm_pyg.sampling.fastrg`: :obj:`"cpp"`,
            :obj:`"triton"`, :obj:`"torch"` or :obj:`"auto"` (the fastest
            that runs on the input's device). (default: :obj:`"auto"`)
        attention_backend (str): the backend of
            :func:`~sbm_pyg.nn.functional.sparse_attention`
            (:obj:`"cpp"`, :obj:`"triton"`, :obj:`"torch"` or
            :obj:`"auto"`), or :obj:`"message_passing"`: PyG's
            gather/scatter :meth:`message` path (same result,
            :obj:`[E, H, d]` memory; its :obj:`edge_prob` argument carries
            the straight-through gradient, visible to message hooks).
            :obj:`"auto"` takes the fused kernel for the device, or
            :obj:`"torch"` when :obj:`dropout > 0` (the only kernel with
            attention dropout), in training and evaluation alike; a fused
            kernel asked for with :obj:`dropout > 0` raises.
            :obj:`"dense"` runs the dense-regime kernel
            (:func:`~sbm_pyg.ops.dense_attention`, CPU): it samples the
            same distribution as the sampler, one Bernoulli per pair, and
            computes the masked softmax with matrix products, building no
            graph; :obj:`"auto"` takes it on the CPU when the expected
            density of the call reaches
            :data:`~sbm_pyg.ops.backend_info.DENSE_CROSSOVER`. Attention
            weights and graph hooks get the graph it sampled, attended by
            the sparse kernel (the same output: asking for them changes
            nothing of the sample, only the cost). Both
            choices are made by :func:`~sbm_pyg.ops.resolve_backend`, and
            :obj:`last_backends` says which kernels ran, e.g.
            :obj:`{'sampler': 'dense', 'attention': 'dense'}`. (default:
            :obj:`"auto"`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`. :obj:`aggr`
            must be :obj:`"add"` and :obj:`flow` :obj:`"source_to_target"`
            (others raise). PyG's message hooks, :meth:`explain` and
            :obj:`decomposed_layers` act only on the
            :obj:`"message_passing"` path: the fused kernels never call
            :meth:`message`. The graph hooks
            (:meth:`register_graph_hook`) and forward hooks act on every
            path.

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
        sampler_backend: str = "auto",
        attention_backend: str = "auto",
        **kwargs,
    ):
        # The softmax over a query's edges is the aggregation: a sum of
        # weighted values, from keys to queries. Other aggregations or flows
        # would change the attention, and no kernel has them.
        if kwargs.setdefault("aggr", "add") != "add":
            raise ValueError(f"aggr must be 'add' (attention sums its "
                             f"softmax-weighted values), got {kwargs['aggr']!r}")
        if kwargs.setdefault("flow", "source_to_target") != "source_to_target":
            raise ValueError(f"flow must be 'source_to_target' (keys are "
                             f"sources, queries targets), got {kwargs['flow']!r}")
        super().__init__(node_dim=0, **kwargs)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        for name, value, choices in (
                ("mode", mode, MODES), ("ste", ste, STE_MODES),
                ("sbm_init", sbm_init, INITS),
                ("sampler_backend", sampler_backend, BACKENDS),
                ("attention_backend", attention_backend,
                 LAYER_ATTENTION_BACKENDS)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got "
                                 f"{value!r}")
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
        self.sampler_backend = sampler_backend
        self.attention_backend = attention_backend
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
        self.last_backends: Optional[Dict[str, str]] = None
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

    @overload
    def forward(
        self,
        x: Union[Tensor, SparseTensor, Tuple],
        batch: Union[None, Tensor, Pair] = None,
        *,
        ptr: Union[None, Tensor, Pair] = None,
        include_edges: Optional[Tensor] = None,
        return_attention_weights: Optional[Literal[False]] = None,
        generator: Optional[torch.Generator] = None,
    ) -> Tensor:
        pass

    @overload
    def forward(
        self,
        x: Union[Tensor, SparseTensor, Tuple],
        batch: Union[None, Tensor, Pair] = None,
        *,
        ptr: Union[None, Tensor, Pair] = None,
        include_edges: Optional[Tensor] = None,
        return_attention_weights: Literal[True],
        generator: Optional[torch.Generator] = None,
    ) -> Tuple[Tensor, Tuple[SampledGraph, Tensor]]:
        pass

    def forward(
        self,
        x: Union[Tensor, SparseTensor, Tuple],
        batch: Union[None, Tensor, Pair] = None,
        *,
        ptr: Union[None, Tensor, Pair] = None,
        include_edges: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
        generator: Optional[torch.Generator] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[SampledGraph, Tensor]]]:
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
        query = project(self.lin_query, x_dst, "x_dst").view(-1, H, C)
        key = project(self.lin_key, x_src, "x_src").view(-1, H, C)
        value = project(self.lin_value, x_src, "x_src").view(-1, H, C)
        q_memb, block, k_memb = self.sbm(query, key)
        out, graph, alpha = self._sample_and_attend(
            query, key, value, q_memb, block, k_memb, batch, ptr,
            include_edges, generator, bool(return_attention_weights))
        Nq = query.size(0)
        out = out.reshape(Nq, H * C) if self.concat else out.mean(dim=1)
        if self.lin_skip is not None:
            out = out + project(self.lin_skip, x_dst, "x_dst")
        if return_attention_weights:
            # computed when asked for
            assert alpha is not None and graph is not None
            return out, (graph, alpha)
        return out

    def _sample_and_attend(self, query: Tensor, key: Tensor, value: Tensor,
                           q_memb: Tensor, block: Tensor, k_memb: Tensor,
                           batch, ptr, include_edges: Optional[Tensor],
                           generator: Optional[torch.Generator],
                           need_alpha: bool
                           ) -> Tuple[Tensor, Optional[SampledGraph],
                                      Optional[Tensor]]:
        ptr_q, ptr_k, generator, sampler, attention = self._choose(
            query, key, q_memb, block, k_memb, batch, ptr, generator)
        if attention != "dense":
            graph = self._sample(q_memb, block, k_memb, ptr_q, ptr_k,
                                 include_edges, generator, sampler)
            return self._attend(query, key, value, q_memb, block, k_memb,
                                graph, attention, generator, need_alpha)
        need_graph = need_alpha or bool(self._graph_hooks)
        res = self._attend_dense(query, key, value, q_memb, block, k_memb,
                                 ptr_q, ptr_k, include_edges, generator,
                                 keep_output=not need_graph)
        if not need_graph:
            self.expected_density, self.sampled_density = mean_densities(
                ptr_q, ptr_k, res.edges, q_memb, block, k_memb)
            return nodes_first(res.out, self.heads).to(query.dtype), None, None
        # Weights or graph hooks: the graph the dense kernel sampled, attended
        # by the sparse kernel (the same output, tested), so that asking for
        # them changes nothing of the sample.
        graph = SampledGraph.from_keys(
            mask_keys(res.mask, ptr_q, ptr_k, self.heads), self.heads,
            query.size(0), key.size(0), ptr_q=ptr_q, ptr_k=ptr_k)
        self._record(graph, q_memb, block, k_memb)
        attention = resolve_backend("attention", "auto", query.device)
        assert self.last_backends is not None  # set by _choose
        self.last_backends["attention"] = attention
        return self._attend(query, key, value, q_memb, block, k_memb, graph,
                            attention, generator, need_alpha)

    # Data-dependent sizes (the sampled edge count, batch pointers): these
    # run eagerly under torch.compile, which compiles the code around them,
    # the fused attention operator included.
    @torch.compiler.disable
    def _choose(self, query: Tensor, key: Tensor, q_memb: Tensor,
                block: Tensor, k_memb: Tensor, batch, ptr,
                generator: Optional[torch.Generator]):
        # The sequences, the generator and the kernels of this call.
        Nq, Nk = query.size(0), key.size(0)
        ptr_k, ptr_q = sequence_pointers(batch, ptr, Nk, Nq)
        if query.device.type == "cpu":
            # Checked here, where a check costs no sync: the expected
            # density and the dense kernel read them.
            ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk,
                                                  query.device)
            sync(checks)
        if generator is None and not self.training and self.eval_seed is not None:
            generator = torch.Generator(query.device).manual_seed(self.eval_seed)
        # Chosen from the layer's configuration, not from self.training, so
        # that training and evaluation run the same kernels; "auto" runs the
        # dense-regime kernel from the expected density on, which is known
        # before sampling.
        sampler = resolve_backend("sampler", self.sampler_backend, query.device)
        attention = self.attention_backend
        if attention != "message_passing":
            density = None
            if (attention == "auto" and query.device.type == "cpu"
                    and self.dropout == 0):
                assert ptr_q is not None and ptr_k is not None  # checked
                density = self._expected_density(ptr_q, ptr_k, q_memb, block,
                                                 k_memb)
            attention = resolve_backend("attention", attention, query.device,
                                        dropout=self.dropout, density=density)
        self.last_backends = dict(
            sampler="dense" if attention == "dense" else sampler,
            attention=attention)
        return ptr_q, ptr_k, generator, sampler, attention

    def _expected_density(self, ptr_q: Tensor, ptr_k: Tensor, q_memb: Tensor,
                          block: Tensor, k_memb: Tensor) -> float:
        # Expected edges per query-key pair of the whole call, exploration
        # included: O(N k + G k^2), before anything is sampled.
        with torch.no_grad():
            pairs = (ptr_q.diff() * ptr_k.diff()).double()
            per = expected_densities(ptr_q, ptr_k, q_memb, block, k_memb)
            edges = (per.double() * pairs[:, None]).sum()
            total = pairs.sum() * self.heads
        delta = self.exploration if self.training else 0.0
        return float(edges / total.clamp(min=1)) + delta

    @torch.compiler.disable
    def _sample(self, q_memb: Tensor, block: Tensor, k_memb: Tensor,
                ptr_q: Tensor, ptr_k: Tensor, include_edges: Optional[Tensor],
                generator: Optional[torch.Generator],
                sampler: str) -> SampledGraph:
        try:
            graph = fastrg(q_memb.detach(), block.detach(), k_memb.detach(),
                           ptr_q=ptr_q, ptr_k=ptr_k, mode=self.mode,
                           exploration=self.exploration if self.training else 0.0,
                           self_loops=self.self_loops,
                           include_edges=include_edges,
                           max_edges=self.max_edges, generator=generator,
                           backend=sampler)
        except ValueError as err:
            raise_for_features(err)
            raise
        self._record(graph, q_memb, block, k_memb)
        return graph

    def _record(self, graph: SampledGraph, q_memb: Tensor, block: Tensor,
                k_memb: Tensor) -> None:
        # The graph hooks and the density statistics of a sampled graph.
        for hook in self._graph_hooks.values():
            hook(self, graph)
        self.expected_density, self.sampled_density = mean_densities(
            graph.ptr_q, graph.ptr_k, graph.edge_counts(), q_memb, block,
            k_memb)

    @torch.compiler.disable
    def _attend_dense(self, query: Tensor, key: Tensor, value: Tensor,
                      q_memb: Tensor, block: Tensor, k_memb: Tensor,
                      ptr_q: Tensor, ptr_k: Tensor,
                      include_edges: Optional[Tensor],
                      generator: Optional[torch.Generator],
                      keep_output: bool) -> DenseAttention:
        # The dense-regime kernel samples the mask and attends over it; the
        # same argument checks and memory guard as the sampler's. Without
        # keep_output only the mask is wanted: no autograd graph.
        H, C = self.heads, self.out_channels
        Nq, Nk = query.size(0), key.size(0)
        delta = self.exploration if self.training else 0.0
        try:
            ptr_q, ptr_k, checks = check_sbm(
                q_memb.detach(), block.detach(), k_memb.detach(), ptr_q,
                ptr_k, self.mode, delta, self.self_loops)
            if include_edges is not None:
                i, j, check = included_pairs(include_edges, ptr_q, ptr_k, Nq,
                                             Nk)
                checks.append(check)
            num_pairs, num_bytes = sync(
                checks, H * (ptr_q.diff() * ptr_k.diff()).sum(),
                mask_bytes(ptr_q, ptr_k, H).sum())
            check_draws(num_pairs, num_pairs, num_bytes, self.max_edges,
                        query.device, ptr_q.numel() - 1, H, Nq, Nk)
        except ValueError as err:
            raise_for_features(err)
            raise
        included = None
        if include_edges is not None:
            included = included_csr(i, j, Nq, Nk)
        need_ste = (keep_output and torch.is_grad_enabled()
                    and q_memb.requires_grad)
        dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
        # Q̂Ŝ feeds the mask's draws: computed in full precision, whatever
        # autocast and the TF32 setting say.
        with full_precision(query.device), \
                torch.set_grad_enabled(keep_output and torch.is_grad_enabled()):
            q_block = torch.einsum("nhu,huv->nhv", q_memb.to(dtype),
                                   block.to(dtype))
            if not need_ste:
                q_block, k_memb = q_block.detach(), k_memb.detach()
            q, k, v, qb, km = (heads_first(x.to(dtype)) for x in (
                query, key, value, q_block, k_memb))
            res = dense_attention(
                q, k, v, qb, km, ptr_q, ptr_k, heads=H,
                scale=1.0 / math.sqrt(C),
                seed=stream_seed(generator, query.device), mode=self.mode,
                exploration=delta, self_loops=self.self_loops,
                included=included, ste=self.ste if need_ste else None)
        return res

    def _attend(self, query: Tensor, key: Tensor, value: Tensor,
                q_memb: Tensor, block: Tensor, k_memb: Tensor,
                graph: SampledGraph, attention: str,
                generator: Optional[torch.Generator], need_alpha: bool
                ) -> Tuple[Tensor, SampledGraph, Optional[Tensor]]:
        H, C = self.heads, self.out_channels
        Nq, Nk = query.size(0), key.size(0)
        # The straight-through estimator uses the edge probabilities'
        # gradient only: their values are never computed.
        need_ste = torch.is_grad_enabled() and q_memb.requires_grad

        if attention != "message_passing":
            sbm = (q_memb, block, k_memb) if need_ste else None
            if need_alpha:  # a pass of its own on the Triton path
                out, alpha = sparse_attention(
                    query, key, value, graph, None, self.dropout,
                    self.training, ste=self.ste, generator=generator,
                    backend=self.attention_backend, sbm=sbm,
                    return_attention_weights=True)
                return out, graph, alpha
            return sparse_attention(
                query, key, value, graph, None, self.dropout, self.training,
                ste=self.ste, generator=generator,
                backend=attention, sbm=sbm), graph, None
        edge_prob = (straight_through_probability(q_memb, block, k_memb, graph)
                     if need_ste else None)
        out = self.propagate(
            torch.stack([graph.csr.col, graph.csr.row()]).long(),
            query=heads_first(query), key=heads_first(key),
            value=heads_first(value), edge_prob=edge_prob,
            size=(H * Nk, H * Nq))
        weights, self._alpha = self._alpha, None
        return out.view(H, Nq, C).transpose(0, 1), graph, weights

    def message(self, query_i: Tensor, key_j: Tensor, value_j: Tensor,
                edge_prob: Optional[Tensor], index: Tensor,
                ptr: Optional[Tensor], size_i: Optional[int]) -> Tensor:
        r"""The reference path (:obj:`attention_backend="message_passing"`), TransformerConv
        style: scores, segment softmax and weighted values per edge, with
        :obj:`[E, H, d]` gathers; same result as the fused kernels."""
        score = (query_i * key_j).sum(dim=-1) / math.sqrt(self.out_channels)
        if edge_prob is not None and self.ste == "paper":
            # Straight-through: value unchanged, d score / d p = score.
            score = score + score.detach() * (edge_prob - edge_prob.detach())
        elif edge_prob is not None:
            # Value unchanged, dL/dp = clip(dL/d score, -1, 1).
            score = score + clip_grad(edge_prob - edge_prob.detach())
        alpha = softmax(score, index, ptr, size_i)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return value_j * alpha.unsqueeze(-1)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.out_channels}, heads={self.heads}, "
                f"num_clusters={self.num_clusters}, mode={self.mode!r}, "
                f"ste={self.ste!r})")
