r"""The SBM-Transformer attention as a PyG :class:`MessagePassing` layer."""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from functools import partial
from typing import Callable, Dict, Literal, Optional, Tuple, Union, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch.utils.hooks import RemovableHandle
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import scatter, softmax

from sbm_pyg.nn._sbm_attention import sbm_attention
from sbm_pyg.nn.block_model import StochasticBlockModel
from sbm_pyg.nn.capacity import AutoCapacity, next_capacity
from sbm_pyg.nn.distillation import layer_distillation
from sbm_pyg.nn.functional import straight_through_probability, with_sink
from sbm_pyg.nn.inputs import (
    check_layer_options,
    check_not_edges,
    eval_randomness,
    project,
    raise_for_batch,
    raise_for_features,
    raise_for_memory,
    sequence_pointers,
)
from sbm_pyg.nn.options import SBMAttentionOptions, default_exploration
from sbm_pyg.nn.warmup import warmup_forward
from sbm_pyg.ops.csr import heads_first
from sbm_pyg.ops.torch_attention import clip_grad
from sbm_pyg.sampling import SampledGraph

__all__ = ["SBMConv"]

Features = Union[Tensor, SparseTensor, Tuple]
Batch = Union[None, Tensor, Tuple[Optional[Tensor], Optional[Tensor]]]


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
    Gradients reach the SBM through a straight-through estimator (:obj:`ste`).
    Sequences are a sorted :obj:`batch` vector or a CSR :obj:`ptr`, without
    padding; the cost is linear in the number of sampled edges.

    The layer's attention is :func:`~sbm_pyg.nn.sbm_attention`. After each
    forward, :obj:`last_backends` says which kernels ran (e.g.
    :obj:`{'sampler': 'cpp', 'attention': 'cpp'}`), :obj:`sampled_density`
    :math:`[H]` holds the fraction of pairs sampled and
    :obj:`expected_density` :math:`[H]` the expected one, differentiable:
    the paper's sparsity regularizer (both averaged over non-empty
    sequences). With :obj:`distill` :math:`\beta > 0`, each training
    forward also sets :obj:`distillation` :math:`[H]`, the attention
    distillation (:func:`~sbm_pyg.nn.attention_distillation`, smoothing
    :data:`~sbm_pyg.nn.distillation.DISTILL_SMOOTHING`; the SBM's inputs
    detached, so that it teaches the SBM only), which
    :func:`~sbm_pyg.nn.distillation_loss` adds up over a model's layers,
    each weighted by its :math:`\beta`: it teaches the SBM to put its
    edges where the attention goes, so that a head held sparse keeps the
    edges it needs. With :obj:`attend_all` set (an attribute, e.g. for
    a dense warm-up in which the attention learns the task on every pair
    while the distillation teaches the SBM), training samples every pair
    (exploration 1; in :obj:`"exact"` mode, all of them) and the SBM learns
    on the side: no straight-through gradient (the graph does not follow
    it), and its memberships, so its densities too, computed from detached
    queries and keys, so that neither a density penalty nor the
    distillation pulls at the attention.

    Args:
        in_channels (int or tuple): size of each input sample (:obj:`-1`:
            lazy), or of source (key) and target (query) features.
        out_channels (int): size :math:`d` of each head.
        heads (int): number of heads :math:`H`. (default: :obj:`1`)
        concat (bool): concatenate the heads, else average. (default: True)
        num_clusters (int): SBM clusters :math:`k` per head. (default: 128)
        dropout (float): dropout on the attention weights. (default: 0.)
        bias (bool): additive biases in the projections. (default: True)
        root_weight (bool): add the skip term :math:`\mathbf{W}_1
            \mathbf{x}_i`. (default: :obj:`True`)
        exploration (float, optional): random edge exploration
            :math:`\delta` added to every pair's rate while training; 0 in
            eval. (default: :obj:`0.01`, or with :obj:`init_density`
            :math:`\min(0.01, \rho / 10)`: a tenth of the pairs the layer
            starts with, so that a large graph's exploration does not
            outnumber them)
        self_loops (bool): always connect query :math:`i` to key :math:`i`
            (the paper's "+I"). (default: :obj:`False`)
        mode (str): :obj:`"exact"` (:math:`\min(p_{ij} + \delta, 1)`) or
            :obj:`"poisson"` (the paper's Algorithm 1, :math:`1 -
            e^{-(p_{ij} + \delta)} \leq 0.63` here), see
            :func:`~sbm_pyg.sampling.fastrg`. (default: :obj:`"exact"`)
        max_edges (int, optional): raise instead of sampling more edges
            than this in one forward (with a :obj:`capacity`, the most it
            may be; :obj:`"auto"` raises on expected draws above it).
        ste (str): the straight-through estimator, :obj:`"paper"` or
            :obj:`"published"`. (default: :obj:`"paper"`)
        distill (float): the strength :math:`\beta \geq 0` of the
            attention distillation in :func:`~sbm_pyg.nn.distillation_loss`
            (0: not computed). It costs the weights on the sampled edges and
            an :math:`O(E k)` product; a (sequence, head) in the dense
            regime is attended by the sparse kernel on the graph read off
            its mask. (default: :obj:`0.0`)
        sbm_init (str): :obj:`"paper"` (about 25% of the pairs sampled) or
            :obj:`"dense"` (about 99%), see :class:`StochasticBlockModel`.
            (default: :obj:`"paper"`)
        init_density (float, optional): start at about this expected
            density :math:`\rho \in (0, 1)` instead (e.g. an expected
            degree over the number of nodes, :obj:`64 / n`, for a large
            graph, where 25% of the pairs would not fit): the SBM's
            :obj:`density` (:class:`StochasticBlockModel`): exactly
            :math:`\rho` under :obj:`sbm_parametrization="mmsb"`, within
            a few percent above it under :obj:`"paper"` (the memberships'
            logits are the offset up to a tenth of the MLP's output),
            up to half again above it under :obj:`"sharp"`. A budget
            (:class:`DensityBudget`) or the density penalty holds it there
            while training. (default: :obj:`None`)
        distill_edges (float): with :obj:`distill`, the weight
            :math:`\gamma \geq 0` of :func:`~sbm_pyg.nn.edge_fit` added to
            the distillation (per head: cross-entropy :math:`+ \gamma`
            edge fit): it pulls the edges the attention uses toward
            :math:`p = 1` and the others toward 0, the SBM's scale, which
            the cross-entropy leaves to the density. (default: :obj:`0.0`)
        distill_recall (float): with :obj:`distill`, the weight of
            :func:`~sbm_pyg.nn.recall_fit` added to the distillation: the
            attention mass the SBM's probabilities miss, each row alike,
            which pulls a row's heavy keys toward :math:`p = 1` within the
            density. (default: :obj:`0.0`)
        sbm_parametrization (str): :obj:`"paper"` (the paper's block
            matrix, a softmax over its :math:`k^2` entries),
            :obj:`"mmsb"` (memberships on the simplex, each block entry in
            :math:`(0, 1)`: many sparse blocks can each be dense) or
            :obj:`"sharp"` (that with each membership on its two largest
            clusters at a learned temperature, and separate key clusters),
            see :class:`StochasticBlockModel`. (default: :obj:`"paper"`)
        sink (bool): a learned attention sink per head (a logit
            :math:`b_h`, zero at first): one more term in every row's
            softmax denominator, of value zero, so that a row can attend to
            nothing instead of spreading its weight over a few sampled keys
            (see :func:`~sbm_pyg.nn.functional.sparse_attention`); the
            returned weights leave out its share. Off in the paper.
            (default: :obj:`False`)
        eval_seed (int, optional): in :obj:`eval()` mode, without a
            :obj:`generator`, sample from a generator seeded with this: the
            same input gives the same output. :obj:`None` samples afresh, as
            the paper evaluates (and warns once that it does).
            (default: :obj:`None`)
        sampler_backend (str): the backend of
            :func:`~sbm_pyg.sampling.fastrg`. (default: :obj:`"auto"`)
        attention_backend (str): a backend of
            :func:`~sbm_pyg.nn.sbm_attention` (:obj:`"auto"` runs each
            (sequence, head) on the dense or the sparse regime by its
            expected density; every kernel has attention dropout, by
            counter: :mod:`sbm_pyg.ops.dropout`), or
            :obj:`"message_passing"`: PyG's :meth:`message` (the same
            result with :obj:`[E, H, d]` memory). (default: :obj:`"auto"`)
        capacity (int or str, optional): static shapes: the draws that
            the sampler's buffers hold in one call, over all sequences and
            heads (:class:`SBMAttentionOptions`' :obj:`capacity`). The
            layer then reads nothing from the device, so that
            :func:`torch.compile` traces it as one graph
            (:obj:`fullgraph=True`) and a GPU can capture it; after each
            call :attr:`overflow` (a 0-dim bool on the device) says whether
            the draws overflowed it (the graph then lacks the rest) and
            :attr:`expected_draws` their mean, which
            :func:`~sbm_pyg.sampling.round_capacity` turns into a capacity.
            :obj:`"auto"`: the layer keeps the capacity itself, from its
            earlier calls' expected draws and overflows read one call late
            (:class:`~sbm_pyg.nn.capacity.AutoCapacity`: the first call
            reads once, an overflow warns and grows the next call's; one
            keeper for training and one for evaluation); compiled, it
            calls :meth:`update_capacity` between calls.
            (default: :obj:`None`)
        **kwargs (optional): additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing` (:obj:`aggr`
            :obj:`"add"`, :obj:`flow` :obj:`"source_to_target"`). Message
            hooks, :meth:`explain` and :obj:`decomposed_layers` act on the
            :obj:`"message_passing"` path only; graph hooks
            (:meth:`register_graph_hook`) on every path.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          (dense or sparse), batch vector :math:`(|\mathcal{V}|)` or
          :obj:`ptr` :math:`(G + 1)` (or pairs)
        - **output:** node features :math:`(|\mathcal{V}_t|, H \cdot d)` or
          :math:`(|\mathcal{V}_t|, d)` if :obj:`concat=False`; with
          :obj:`return_attention_weights=True` also :obj:`(graph, alpha)`,
          the :class:`SampledGraph` and weights :math:`(|\mathcal{E}|)`.

    Example:
        >>> conv = SBMConv(16, 8, heads=2, num_clusters=4)
        >>> x = torch.randn(10, 16)
        >>> batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])  # two sequences
        >>> out = conv(x, batch)
        >>> out.shape, conv.sampled_density.shape  # heads concatenated; [H]
        (torch.Size([10, 16]), torch.Size([2]))
    """

    # A PyG layer's constructor: flat keyword options, as TransformerConv's
    # and GATConv's (the attention's are grouped per call by
    # _attention_options).
    def __init__(self, in_channels: Union[int, Tuple[int, int]],  # noqa: PLR0913
                 out_channels: int, heads: int = 1, concat: bool = True,
                 num_clusters: int = 128, dropout: float = 0.0,
                 bias: bool = True, root_weight: bool = True,
                 exploration: Optional[float] = None, self_loops: bool = False,
                 mode: str = "exact", max_edges: Optional[int] = None,
                 ste: str = "paper", distill: float = 0.0,
                 sbm_init: str = "paper", eval_seed: Optional[int] = None,
                 sampler_backend: str = "auto",
                 attention_backend: str = "auto",
                 sbm_parametrization: str = "paper",
                 distill_edges: float = 0.0, sink: bool = False,
                 distill_recall: float = 0.0, init_density: Optional[float] = None,
                 capacity: Union[int, str, None] = None, **kwargs):
        check_layer_options(kwargs, sbm_init=sbm_init,
                            sbm_parametrization=sbm_parametrization,
                            attention_backend=attention_backend,
                            eval_seed=eval_seed, init_density=init_density,
                            weights=dict(distill=distill, distill_edges=distill_edges,
                                         distill_recall=distill_recall))
        super().__init__(node_dim=0, **kwargs)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.heads, self.concat, self.num_clusters = heads, concat, num_clusters
        self.dropout, self.root_weight = dropout, root_weight
        if exploration is None:
            exploration = default_exploration(init_density)
        self.exploration, self.self_loops = exploration, self_loops
        self.mode, self.max_edges, self.ste = mode, max_edges, ste
        self.distill, self.distill_edges = float(distill), float(distill_edges)
        self.distill_recall = float(distill_recall)
        # A dense warm-up (set by a training loop): in training, every pair
        # is sampled (exploration 1) whatever the SBM says.
        self.attend_all = False
        self.sampler_backend, self.attention_backend = sampler_backend, attention_backend
        self.eval_seed, self.capacity = eval_seed, capacity
        # Whether the last call's draws overflowed the capacity (0-dim bool
        # on the device; None without a capacity).
        self.overflow: Optional[Tensor] = None
        self.expected_draws: Optional[Tensor] = None
        # capacity="auto": the capacities of training and evaluation calls.
        self._keepers = {True: AutoCapacity(), False: AutoCapacity()}
        self._static_mode = True
        # The sharp form's memberships are zero off a token's top clusters.
        self.sparse_memberships = sbm_parametrization == "sharp"
        opts = self._attention_options(warmup=False)  # checks them, naming each
        if capacity == "auto":  # what a static call cannot serve, refused now
            replace(opts, capacity=1)
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
                                        init=sbm_init,
                                        parametrization=sbm_parametrization,
                                        density=init_density)
        # A learned attention sink per head: a row may put its weight on
        # nothing (a sampled row with no partner otherwise spends it all on
        # its few keys).
        self.sink: Optional[Parameter] = (Parameter(torch.empty(heads))
                                          if sink else None)
        self.sampled_density: Optional[Tensor] = None  # [H], set by forward
        self.expected_density: Optional[Tensor] = None
        self.distillation: Optional[Tensor] = None  # [H], with distill > 0
        self.last_backends: Optional[Dict[str, str]] = None
        self._alpha: Optional[Tensor] = None
        self._lse: Optional[Tensor] = None
        self._graph_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._weights_hooks: OrderedDict[int, Callable] = OrderedDict()
        self.reset_parameters()

    def _attention_options(self, warmup: bool) -> SBMAttentionOptions:
        # The attention's options now: every pair in a dense warm-up (no
        # straight-through gradient: the graph does not follow the SBM), no
        # exploration in evaluation; the message_passing path is the
        # layer's own, its graph the "auto" sampler's.
        explore = 1.0 if self.attend_all else self.exploration
        backend = self.attention_backend
        return SBMAttentionOptions(
            mode=self.mode, exploration=explore if self.training else 0.0,
            self_loops=self.self_loops, max_edges=self.max_edges,
            ste=None if warmup else self.ste, dropout=self.dropout,
            sampler_backend=self.sampler_backend,
            attention_backend="auto" if backend == "message_passing" else backend,
            sparse_memberships=self.sparse_memberships,
            # A bad capacity is refused by name by the options.
            capacity=None if self.capacity == "auto" else self.capacity)  # type: ignore[arg-type]

    def update_capacity(self) -> Optional[int]:
        r"""With :obj:`capacity="auto"`: starts the copy of the last call's
        expected draws and overflow to the host and reads those that have
        landed (no wait); returns the next call's capacity in the layer's
        mode (:obj:`None` before a first call). Each eager call does this
        itself; a compiled layer's loop calls it between calls (a new
        capacity retraces the compiled graph)."""
        if self.capacity != "auto":
            raise ValueError(f"update_capacity needs capacity='auto', got "
                             f"{self.capacity!r}")
        if self.overflow is not None and self.expected_draws is not None:
            self._keepers[self._static_mode].record(self.expected_draws, self.overflow)
        for keeper in self._keepers.values():
            keeper.refresh()
        return self._keepers[self.training].capacity

    def kept_capacity(self, training: bool = True) -> Optional[int]:
        r"""With :obj:`capacity="auto"`: the capacity kept for training
        calls (or, :obj:`training=False`, evaluation calls) as last
        refreshed, :obj:`None` before a first such call; reads and changes
        nothing (:meth:`update_capacity` refreshes it)."""
        if self.capacity != "auto":
            raise ValueError(f"kept_capacity needs capacity='auto', got "
                             f"{self.capacity!r}")
        return self._keepers[training].capacity

    def register_graph_hook(self, hook: Callable[[SBMConv, SampledGraph], None]
                            ) -> RemovableHandle:
        r"""Calls :obj:`hook(module, graph)` with every graph this layer
        samples (e.g. :class:`sbm_pyg.theory.GraphRecorder`); returns a handle
        whose :meth:`remove` unregisters it."""
        handle = RemovableHandle(self._graph_hooks)
        self._graph_hooks[handle.id] = hook
        return handle

    def register_weights_hook(
            self, hook: Callable[[SBMConv, SampledGraph, Tensor], None]
    ) -> RemovableHandle:
        r"""Calls :obj:`hook(module, graph, alpha)` with every graph this
        layer samples and its attention weights :obj:`alpha [E]` (detached;
        computed for the hook, as :obj:`return_attention_weights=True`
        would); returns a handle whose :meth:`remove` unregisters it."""
        handle = RemovableHandle(self._weights_hooks)
        self._weights_hooks[handle.id] = hook
        return handle

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.lin_skip is not None:
            self.lin_skip.reset_parameters()
        self.sbm.reset_parameters()
        if self.sink is not None:
            torch.nn.init.zeros_(self.sink)

    @overload
    def forward(self, x: Features, batch: Batch = None, *, ptr: Batch = None,
                batch_size: Optional[int] = None,
                include_edges: Optional[Tensor] = None,
                return_attention_weights: Optional[Literal[False]] = None,
                generator: Optional[torch.Generator] = None) -> Tensor:
        pass

    @overload
    def forward(self, x: Features, batch: Batch = None, *, ptr: Batch = None,
                batch_size: Optional[int] = None,
                include_edges: Optional[Tensor] = None,
                return_attention_weights: Literal[True],
                generator: Optional[torch.Generator] = None
                ) -> Tuple[Tensor, Tuple[SampledGraph, Tensor]]:
        pass

    def forward(self, x: Features, batch: Batch = None, *extra: object,
                ptr: Batch = None, batch_size: Optional[int] = None,
                include_edges: Optional[Tensor] = None,
                return_attention_weights: Optional[bool] = None,
                generator: Optional[torch.Generator] = None
                ) -> Union[Tensor, Tuple[Tensor, Tuple[SampledGraph, Tensor]]]:
        r"""Runs the layer on node features :obj:`x` (or :obj:`(x_src,
        x_dst)`: keys and values from :obj:`x_src`) cut into sequences by a
        sorted :obj:`batch` vector or CSR :obj:`ptr` (or pairs of them; one
        sequence if neither); :obj:`batch_size` (PyG's
        :obj:`Batch.num_graphs`) spares the read of the number of sequences
        off the batch vector. :obj:`include_edges` (:obj:`[2, E]` (key,
        query) edges, :class:`EdgeIndex`, :obj:`adj_t`), e.g. the input
        graph's, are added to every head's graph (structure-aware
        attention); :obj:`generator` gives the randomness."""
        if extra:  # conv(x, edge_index, batch), as PyG's convs are called
            check_not_edges(batch)
            raise TypeError(f"SBMConv.forward takes (x, batch) and keywords, "
                            f"got {2 + len(extra)} positional arguments; pass "
                            f"a local graph as include_edges=edge_index")
        H, C = self.heads, self.out_channels
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        query = project(self.lin_query, x_dst, "x_dst").view(-1, H, C)
        key = project(self.lin_key, x_src, "x_src").view(-1, H, C)
        value = project(self.lin_value, x_src, "x_src").view(-1, H, C)
        warmup = self.attend_all and self.training
        # In a dense warm-up the graph does not follow the SBM: it learns on
        # the side (distillation, density penalty) from detached queries and
        # keys, which nothing then pulls but the attention's own loss.
        q_memb, block, k_memb = (self.sbm(query.detach(), key.detach())
                                 if warmup else self.sbm(query, key))
        ptr_k, ptr_q = sequence_pointers(batch, ptr, key.size(0),
                                         query.size(0), batch_size)
        seed = None
        if generator is None and not self.training:
            generator, seed = eval_randomness(self.eval_seed, self.capacity is not None,
                                              query.device)
        passing = self.attention_backend == "message_passing"
        distilling = (self.distill > 0 and self.training
                      and torch.is_grad_enabled())
        if (warmup and not passing and not return_attention_weights
                and not self._graph_hooks and not self._weights_hooks):
            # Every pair attended and nobody asks for the graph: dense
            # products instead of a graph of every pair (nn/warmup.py).
            try:
                return warmup_forward(self, x_dst, (query, key, value),
                                      (q_memb, block, k_memb), ptr_q, ptr_k,
                                      distilling, generator)
            except ValueError as err:
                raise_for_batch(err, batch_size)
                raise
        opts = self._attention_options(warmup)
        try:
            if self.capacity == "auto":
                opts = replace(opts, capacity=next_capacity(
                    self._keepers[self.training], (q_memb, block, k_memb), ptr_q, ptr_k, opts))
            res = sbm_attention(
                query, key, value, (q_memb, block, k_memb), ptr_q=ptr_q,
                ptr_k=ptr_k, include_edges=include_edges, options=opts,
                training=self.training,
                return_graph=bool(self._graph_hooks or self._weights_hooks),
                return_attention_weights=(bool(return_attention_weights)
                                          or distilling
                                          or bool(self._weights_hooks)),
                attend=partial(self._propagate, query, key, value,
                               (q_memb, block, k_memb)) if passing else None,
                generator=generator, sink=self.sink, seed=seed)
        except ValueError as err:
            raise_for_features(err)
            raise_for_batch(err, batch_size)
            raise_for_memory(err)
            raise
        self.last_backends = res.backends  # before the hooks: they may read it
        for hook in self._graph_hooks.values():
            hook(self, res.graph)
        for hook in self._weights_hooks.values():
            assert res.alpha is not None
            hook(self, res.graph, res.alpha.detach())
        self.expected_density, self.sampled_density = (res.expected_density,
                                                       res.sampled_density)
        self.overflow, self.expected_draws = res.overflow, res.expected_draws
        self._static_mode = self.training  # whose keeper update_capacity feeds
        if self.capacity == "auto" and not torch.compiler.is_compiling():
            # Read before the next call (on a GPU: once it has landed).
            assert res.expected_draws is not None and res.overflow is not None
            self._keepers[self.training].record(res.expected_draws, res.overflow)
        self.distillation = None
        if distilling:
            # The SBM alone learns from it: its inputs detached, so that the
            # queries and keys that make the target are not moved toward it.
            assert res.graph is not None and res.alpha is not None
            qd, bd, kd = ((q_memb, block, k_memb) if warmup
                          else self.sbm(query.detach(), key.detach()))
            self.distillation = layer_distillation(
                res.alpha, (qd, bd, kd), res.graph, self.distill_edges,
                self.distill_recall)
        out = res.out.reshape(-1, H * C) if self.concat else res.out.mean(1)
        if self.lin_skip is not None:
            out = out + project(self.lin_skip, x_dst, "x_dst")
        if return_attention_weights:
            assert res.graph is not None and res.alpha is not None
            return out, (res.graph, res.alpha)
        return out

    def _propagate(self, query: Tensor, key: Tensor, value: Tensor,
                   sbm: Tuple[Tensor, Tensor, Tensor], graph: SampledGraph,
                   need_alpha: bool) -> Tuple[Tensor, Optional[Tensor]]:
        # attention_backend="message_passing": PyG's message() over the
        # heads-first graph; edge_prob carries the straight-through gradient.
        H, C = self.heads, self.out_channels
        need_ste = (torch.is_grad_enabled() and sbm[0].requires_grad
                    and not (self.attend_all and self.training))
        edge_prob = straight_through_probability(*sbm, graph) if need_ste else None
        Nq, Nk = graph.num_queries, graph.num_keys
        out = self.propagate(
            torch.stack([graph.csr.col, graph.csr.row()]).long(),
            query=heads_first(query), key=heads_first(key), value=heads_first(value),
            edge_prob=edge_prob, size=(H * Nk, H * Nq))
        weights, self._alpha = self._alpha, None
        lse, self._lse = self._lse, None
        if self.sink is not None:
            assert lse is not None  # message() kept it
            out, weights = with_sink(out, weights, lse, self.sink, graph.csr)
        return out.view(H, Nq, C).transpose(0, 1), weights

    def message(self, query_i: Tensor, key_j: Tensor, value_j: Tensor,
                edge_prob: Optional[Tensor], index: Tensor,
                ptr: Optional[Tensor], size_i: Optional[int]) -> Tensor:
        r"""The :obj:`"message_passing"` path, TransformerConv style: scores,
        segment softmax and weighted values per edge (:obj:`[E, H, d]`)."""
        score = (query_i * key_j).sum(dim=-1) / math.sqrt(self.out_channels)
        if edge_prob is not None and self.ste == "paper":
            # Straight-through: value unchanged, d score / d p = score.
            score = score + score.detach() * (edge_prob - edge_prob.detach())
        elif edge_prob is not None:
            # Value unchanged, dL/dp = clip(dL/d score, -1, 1).
            score = score + clip_grad(edge_prob - edge_prob.detach())
        alpha = softmax(score, index, ptr, size_i)
        self._alpha = alpha
        if self.sink is not None:  # each row's log-sum-exp, for the sink
            top = scatter(score.detach(), index, 0, size_i, reduce="max")
            total = scatter((score - top[index]).exp(), index, 0, size_i,
                            reduce="sum")
            self._lse = total.log() + top  # a row with no edge: -inf
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return value_j * alpha.unsqueeze(-1)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.out_channels}, heads={self.heads}, "
                f"num_clusters={self.num_clusters}, mode={self.mode!r}, "
                f"ste={self.ste!r}"
                + (f", distill={self.distill}" if self.distill else "")
                + (", sink=True" if self.sink is not None else "") + ")")
