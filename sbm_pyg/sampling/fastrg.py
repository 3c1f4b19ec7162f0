r"""fastRG (the paper's Algorithm 1) over a ragged batch, all heads at
once: the arguments checked, a backend chosen, the graph built."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sbm_pyg.ops.backend_info import BACKENDS, resolve_backend
from sbm_pyg.ops.csr import full_precision
from sbm_pyg.sampling import fastrg_op, fastrg_torch
from sbm_pyg.sampling.checks import (
    MODES,
    PtrLike,
    check_sampler_options,
    check_sbm,
    included_pairs,
)
from sbm_pyg.sampling.edges import SampledEdges
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import Check, check_generator, nonnegative_finite, sync

__all__ = ["fastrg", "plan_fastrg", "PlannedGraph", "MODES", "BACKENDS"]


@torch.compiler.disable  # data-dependent edge count: runs eagerly
def fastrg(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
    include_edges: Optional[Tensor] = None,
    max_edges: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = "auto",
) -> SampledGraph:
    r"""Samples a query→key graph per sequence and head with fastRG
    (Rohe et al., 2018; Algorithm 1 of the SBM-Transformer paper).

    For sequence :math:`g` and head :math:`h`, with cluster masses
    :math:`s^Y_u = \sum_{i \in g} Y_{iu}` and :math:`s^Z_v = \sum_{j \in g}
    Z_{jv}`, the number of draws from cluster pair :math:`(u, v)` is
    :math:`\mathrm{Poisson}(s^Y_u B_{uv} s^Z_v)`; each draw picks query
    :math:`i` with probability :math:`Y_{iu}/s^Y_u` and key :math:`j` with
    :math:`Z_{jv}/s^Z_v`. The multiplicity of pair :math:`(i, j)` is then
    :math:`\mathrm{Poisson}(p_{ij})`. Duplicates are merged:

    * :obj:`mode="poisson"`: :math:`P(i \to j) = 1 - e^{-p_{ij}}`.
    * :obj:`mode="exact"`: :math:`P(i \to j) = \min(p_{ij}, 1)`, edges
      independent. The multigraph is drawn at rate :math:`c\,p_{ij}` and
      each distinct edge kept with probability :math:`\min(p_{ij}, 1) /
      (1 - e^{-c p_{ij}})`, with :math:`c = -\log(1 - P)/P` from the bound
      :math:`P = \max_i \mathbf{Y}_i \, \mathbf{B} \, \max_j \mathbf{Z}_j
      \geq p_{ij}` of each sequence and head (capped at 40 when
      :math:`P \geq 1`). Extra cost: :math:`c` times as many draws (1.39 at
      :math:`P = 0.5`, 2.56 at 0.9, 4.65 at 0.99), one
      :math:`O(N \cdot k^2)` product :math:`\mathbf{Y}\mathbf{B}`, an
      :math:`O(E k)` sampled dot product for the thinning, and one more host
      sync.

    Everything is vectorized over sequences, heads and clusters. Time and
    memory are :math:`O(m + (N_q + N_k) H k + G H k^2)` for :math:`m`
    draws, plus :math:`O(m \log m)` for sorting the edges.

    Args:
        q_memb (Tensor): query memberships :obj:`[N_q, H, k]`, :math:`\geq 0`.
        block (Tensor): block matrices :obj:`[H, k, k]`, :math:`\geq 0`.
        k_memb (Tensor): key memberships :obj:`[N_k, H, k]`, :math:`\geq 0`.
        ptr_q (LongTensor, optional): :obj:`[G + 1]` CSR pointer cutting the
            query rows into :math:`G` sequences (:obj:`None`: one sequence).
        ptr_k (LongTensor, optional): the same for key rows.
        mode (str): :obj:`"poisson"` or :obj:`"exact"`, see above.
        exploration (float): :math:`\delta \geq 0`, added to every pair's
            rate within a sequence (the paper's random edge exploration) as
            one extra cluster, never an :math:`n \times n` matrix.
        self_loops (bool): if set, query :math:`i` always gets key
            :math:`i` (the paper's "+I" variant); queries and keys must be
            the same sequences.
        include_edges (LongTensor, optional): :obj:`[2, E]` pairs
            (key :math:`j`, query :math:`i`) added to every head's graph
            without duplicates, e.g. the input graph's :obj:`edge_index`
            for structure-aware attention; a pair must not cross sequences.
        max_edges (int, optional): raise a :class:`ValueError` if more
            draws than this are made, before anything of that size is
            allocated. Independently, a draw that would not fit into the
            available memory raises too.
        generator (torch.Generator, optional): source of randomness; the
            same state gives the same graph (for a backend).
        backend (str, optional): :obj:`"cpp"` (the C++ kernels of the
            operators ``sbm_pyg::fastrg_plan`` and ``fastrg_sample``, CPU;
            :mod:`~sbm_pyg.sampling.fastrg_op` describes them),
            :obj:`"triton"` (the same operators' Triton kernels, CUDA: the
            same algorithm and random stream;
            :mod:`~sbm_pyg.sampling.fastrg_triton`),
            :obj:`"torch"` (pure PyTorch, any device, another algorithm
            and stream; :mod:`~sbm_pyg.sampling.fastrg_torch`) or
            :obj:`"auto"`: the fastest that runs on the memberships' device
            (:func:`~sbm_pyg.ops.resolve_backend`). All sample the same
            distribution; :obj:`"cpp"` and :obj:`"triton"` give the same
            graph for the same seed, up to floating-point ties.

    Returns:
        :class:`SampledGraph`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q_memb = torch.rand(100, 2, 8)  # [N_q, H, k]
        >>> k_memb = torch.rand(100, 2, 8)  # [N_k, H, k]
        >>> block = torch.softmax(torch.randn(2, 64, generator=g), -1).view(2, 8, 8)
        >>> graph = fastrg(q_memb, block, k_memb, ptr_q=[0, 40, 100],
        ...                ptr_k=[0, 40, 100], mode="exact", generator=g)
        >>> graph.edge_index.size(0), graph.density().shape  # [G, H]
        (2, torch.Size([2, 2]))
    """
    planned = plan_fastrg(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k,
                          mode=mode, exploration=exploration,
                          self_loops=self_loops, include_edges=include_edges,
                          max_edges=max_edges, generator=generator,
                          backend=backend)
    return planned.finish(sync(planned.checks, *planned.scalars))


class PlannedGraph:
    r"""A graph of :func:`fastrg` planned but not drawn yet (see
    :func:`plan_fastrg`): its :obj:`checks` and :obj:`scalars` are for the
    caller's one host sync (:func:`~sbm_pyg.validation.sync`), which may
    read other values too, and :meth:`finish` takes the scalars' values and
    draws the graph."""

    def __init__(self, shape: Tuple[int, int, int], ptr: Tuple[Tensor, Tensor],
                 checks: List[Check], plan: Optional[fastrg_op.Plan],
                 torch_sample: Optional[Callable[[], SampledEdges]]) -> None:
        self._shape, self._ptr = shape, ptr
        self._plan, self._torch_sample = plan, torch_sample
        self.checks: List[Check] = checks if plan is None else plan.checks
        self.scalars: Tuple[Tensor, ...] = () if plan is None else plan.scalars
        # The row streams' seed (None for the "torch" backend, which draws
        # from the generator as it samples).
        self.seed: Optional[int] = None if plan is None else plan.seed

    def finish(self, values: Sequence[float]) -> SampledGraph:
        if self._plan is not None:
            edges = fastrg_op.draw(self._plan, values)
        else:
            assert self._torch_sample is not None
            edges = self._torch_sample()
        Nq, Nk, H = self._shape
        return SampledGraph(edges.csr, Nq, Nk, H, *self._ptr, edges.num_draws,
                            edges.expected_draws)


def plan_fastrg(q_memb: Tensor, block: Tensor, k_memb: Tensor, *,
                ptr_q: PtrLike = None, ptr_k: PtrLike = None,
                mode: str = "poisson", exploration: float = 0.0,
                self_loops: bool = False,
                include_edges: Optional[Tensor] = None,
                max_edges: Optional[int] = None,
                generator: Optional[torch.Generator] = None,
                backend: Optional[str] = "auto",
                seed: Optional[int] = None) -> PlannedGraph:
    r""":func:`fastrg` up to its host sync, which the caller makes (with
    values of its own: a layer reads everything it needs in one sync):
    the arguments checked (raising at once where no device value is
    needed), the operators' plan run (each row's degree, drawn from
    :obj:`seed`, or from :obj:`generator` if :obj:`None`). Arguments as
    :func:`fastrg`'s."""
    # Both backends check the memberships' values in their own first pass.
    check_sampler_options(mode, exploration, max_edges)
    ptr_q, ptr_k, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                     self_loops, check_memberships=False)
    backend = resolve_backend("sampler", backend, q_memb.device)
    check_generator(generator, q_memb.device)
    included = None
    if include_edges is not None:
        *included, check = included_pairs(include_edges, ptr_q, ptr_k,
                                          q_memb.size(0), k_memb.size(0))
        checks.append(check)
    shape, ptr = (q_memb.size(0), k_memb.size(0), q_memb.size(1)), (ptr_q, ptr_k)
    if backend == "torch":
        # Its memberships are checked as it samples: checked here too, so
        # that a caller that takes the dense regime instead has them.
        checks += [nonnegative_finite("q_memb", q_memb),
                   nonnegative_finite("k_memb", k_memb)]

        def torch_sample() -> SampledEdges:
            # The checks are the caller's to raise: none passed on. The
            # sampler computes in the memberships' precision (float64 or
            # float32) whatever autocast is on around it.
            with full_precision(q_memb.device):
                return fastrg_torch.sample(
                    q_memb, block, k_memb, ptr_q, ptr_k, [], mode,
                    exploration, self_loops, included, max_edges, generator)
        return PlannedGraph(shape, ptr, checks, None, torch_sample)
    with full_precision(q_memb.device):
        plan = fastrg_op.plan(q_memb, block, k_memb, ptr_q, ptr_k, checks,
                              mode, exploration, self_loops, included,
                              max_edges, generator, backend=backend, seed=seed)
    return PlannedGraph(shape, ptr, checks, plan, None)
