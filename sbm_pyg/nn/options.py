r"""The options of :func:`~sbm_pyg.nn.sbm_attention`: how the graph is
sampled and which kernels attend over it, in one frozen object checked
when it is built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sbm_pyg.nn.functional import STE_MODES
from sbm_pyg.ops.backend_info import ATTENTION_BACKENDS, BACKENDS
from sbm_pyg.sampling.checks import check_sampler_options
from sbm_pyg.sampling.tiles import check_tile_options

__all__ = ["SBMAttentionOptions", "SBM_ATTENTION_BACKENDS", "EXPLORATION",
           "EXPLORATION_SHARE", "default_exploration"]

#: The random exploration rate :math:`\delta` of the published experiments.
EXPLORATION = 0.01
#: Under a density budget :math:`\rho`, the exploration is at most this
#: share of it: :math:`\delta = \min(0.01, \rho / 10)`. At :math:`\rho =
#: 0.02` a fixed 0.01 made a third of the pairs sampled in training random
#: ones; on the
#: repeat task (N = 64, seed 0) :math:`\rho / 10` gave 69.94% at 5% and
#: 66.14% at 2% against 69.82% and 65.99% with 0.01
#: (docs/experiments.md, "Exploration under a budget").
EXPLORATION_SHARE = 0.1


def default_exploration(target_density: Optional[float]) -> float:
    r"""The exploration rate where none is given: :data:`EXPLORATION`, or
    :data:`EXPLORATION_SHARE` of :obj:`target_density` (a budget, or the
    density a layer starts at) where that is less."""
    if target_density is None or not target_density > 0:  # checked apart
        return EXPLORATION
    return min(EXPLORATION, EXPLORATION_SHARE * target_density)

#: The attention backends of :class:`SBMAttentionOptions`: the kernels', and
#: the tiled regime.
SBM_ATTENTION_BACKENDS = ATTENTION_BACKENDS + ("tiles",)


@dataclass(frozen=True)
class SBMAttentionOptions:
    r"""The sampler's and the kernels' options of
    :func:`~sbm_pyg.nn.sbm_attention`, checked once, when the object is
    built (a :class:`ValueError` naming the field); change one with
    :func:`dataclasses.replace`, which checks again.

    Args:
        mode (str): :obj:`"exact"` (:math:`P(i \to j) = \min(p_{ij}, 1)`)
            or :obj:`"poisson"` (:math:`1 - e^{-p_{ij}}`), see
            :func:`~sbm_pyg.sampling.fastrg`; in :func:`~sbm_pyg.nn.sbm_attention`
            the exact mode refuses an SBM whose mean :math:`p_{ij}` over a
            (sequence, head) exceeds 1 (a :class:`ValueError` naming
            :obj:`sbm`). (default: :obj:`"exact"`)
        exploration (float): :math:`\delta` added to every pair's
            probability. (default: :obj:`0.0`)
        self_loops (bool): every query attends to its own position.
            (default: :obj:`False`)
        max_edges (int, optional): the most edges a call may sample, over
            both regimes (:obj:`None`: the device's memory is the bound).
        ste (str, optional): the straight-through estimator,
            :obj:`"paper"` or :obj:`"published"`
            (:func:`~sbm_pyg.nn.functional.sparse_attention`), or
            :obj:`None`: no straight-through gradient (where the graph does
            not follow the SBM, e.g. every pair attended by a large
            exploration; the densities still reach it).
            (default: :obj:`"paper"`)
        dropout (float): attention dropout in :math:`[0, 1)`, in every
            kernel (:mod:`sbm_pyg.ops.dropout`), applied in training.
            (default: :obj:`0.0`)
        sampler_backend (str): one of
            :data:`~sbm_pyg.ops.backend_info.BACKENDS`.
            (default: :obj:`"auto"`)
        attention_backend (str): one of :data:`SBM_ATTENTION_BACKENDS`:
            a kernel of :data:`~sbm_pyg.ops.backend_info.ATTENTION_BACKENDS`;
            :obj:`"auto"` takes the dense regime per (sequence, head) where
            the expected density reaches the device's crossover, and the
            tiled regime for the other pairs where its tiles would hold
            half their expected edges or more;
            :obj:`"dense"` for every pair; or :obj:`"tiles"`, the tiled
            regime of a sharp head (:func:`~sbm_pyg.nn.tiled_sbm_attention`:
            its heavy cluster pairs as dense tiles of cluster-sorted tokens on
            the dense-regime kernel, the rest on the sparse path; without
            :obj:`include_edges`, a sink, dropout, the attention weights
            or :obj:`max_edges`).
            (default: :obj:`"auto"`)
        tile_size (int): the tiled regime's tiles, :obj:`tile_size` queries
            by as many keys. (default: :obj:`64`)
        tile_fill (float): the least expected fill of a cluster pair the
            tiled regime computes as tiles
            (:func:`~sbm_pyg.sampling.tiles.plan_tiles`'s :obj:`min_fill`).
            (default: :obj:`0.5`)
        sparse_memberships (bool): the memberships' zeros are their
            parametrization's (a token in its top clusters, as
            :class:`~sbm_pyg.nn.StochasticBlockModel`'s :obj:`"sharp"`
            form): each call computes over the clusters some token of a
            head uses (:func:`~sbm_pyg.nn.support.compact_clusters`, their
            count read from the device once more): the same law and
            outputs, the straight-through gradients reaching the
            memberships on those clusters only, every product over the
            clusters as narrow as they are. (default: :obj:`False`)
        capacity (int, optional): a call of static shapes: the graph is
            sampled into buffers of :obj:`capacity` draws over all
            sequences and heads (:func:`~sbm_pyg.sampling.fastrg_static`,
            the same law while they fit), attended on the sparse path's
            fused kernel, and nothing is read to the host: the inputs'
            checks raise on the device (:func:`torch._assert_async`, a
            :class:`RuntimeError`), the result says whether the draws
            overflowed the capacity (:obj:`overflow`, the graph then lacks
            some). What :func:`torch.compile` with :obj:`fullgraph=True`
            and a captured CUDA graph need; without what reads the device
            or samples otherwise: the dense and tiled regimes, the PyTorch
            attention backend (:obj:`attention_backend="torch"`), the
            :obj:`"triton"` sampler (a static call samples a GPU's graph
            with :func:`~sbm_pyg.sampling.fastrg_static`'s :obj:`"torch"`
            backend; :obj:`"auto"` takes its :obj:`"cpp"` one on the CPU),
            each refused by name; dropout's seed is the sampler's, on the
            device (its streams are of their own purpose, so the mask is
            independent of the graph); :obj:`max_edges` bounds the
            capacity (refused above it: the draws past the capacity
            overflow, where the default route would raise). With
            :obj:`sparse_memberships` a static call keeps all :math:`k`
            clusters (the width kept would be read): the same law and
            outputs, the products over every cluster.
            (default: :obj:`None`, shapes follow the graph)

    Example:
        >>> from dataclasses import replace
        >>> opts = SBMAttentionOptions(mode="poisson", dropout=0.1)
        >>> replace(opts, exploration=0.01).exploration
        0.01
    """

    mode: str = "exact"
    exploration: float = 0.0
    self_loops: bool = False
    max_edges: Optional[int] = None
    ste: Optional[str] = "paper"
    dropout: float = 0.0
    sampler_backend: str = "auto"
    attention_backend: str = "auto"
    tile_size: int = 64
    tile_fill: float = 0.5
    sparse_memberships: bool = False
    capacity: Optional[int] = None

    def __post_init__(self) -> None:
        check_sampler_options(self.mode, self.exploration, self.max_edges)
        for name in ("self_loops", "sparse_memberships"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got "
                                f"{getattr(self, name)!r}")
        if self.ste is not None and self.ste not in STE_MODES:
            raise ValueError(f"ste must be one of {STE_MODES} or None, got "
                             f"{self.ste!r}")
        if not (isinstance(self.dropout, (int, float))
                and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must be in [0, 1), got "
                             f"{self.dropout!r}")
        for name, value, choices in (
                ("sampler_backend", self.sampler_backend, BACKENDS),
                ("attention_backend", self.attention_backend,
                 SBM_ATTENTION_BACKENDS)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got "
                                 f"{value!r}")
        check_tile_options(tile_size=self.tile_size, tile_fill=self.tile_fill)
        if self.capacity is not None:
            self._check_capacity()

    def _check_capacity(self) -> None:
        # A static call reads nothing: what needs a read is refused.
        capacity = self.capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1 or None (a layer's also "
                             f"'auto'), got {capacity!r}")
        if self.max_edges is not None and capacity > self.max_edges:
            raise ValueError(f"capacity ({capacity}) exceeds max_edges "
                             f"({self.max_edges}): a static call's buffers hold "
                             f"capacity draws, so max_edges bounds it")
        refused = dict(attention_backend=self.attention_backend in ("dense", "tiles", "torch"),
                       sampler_backend=self.sampler_backend == "triton")
        for name, bad in refused.items():
            if bad:
                raise ValueError(
                    f"capacity (static shapes) samples with fastrg_static and "
                    f"attends on the fused sparse kernel, reading nothing: "
                    f"{name}={getattr(self, name)!r} is not served there; "
                    f"leave it at its default or capacity at None")
