r"""Which regime each (sequence, head) of an SBM attention call takes,
chosen before anything is sampled or read to the host: the sparse path or
the dense-regime kernel, by the expected density against the device's
crossover; and the share of the sparse pairs' expected edges that the
tiled regime's tiles would hold."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.utils.sparse import ptr2index

from sbm_pyg.nn.block_model import check_exact_densities, expected_densities
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.ops import backend_info
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend
from sbm_pyg.sampling.checks import PtrLike, check_pointers
from sbm_pyg.sampling.tiles import tile_edges
from sbm_pyg.validation import Check

__all__ = ["regimes", "tiles_share", "backend_notes", "TILES_MIN_SHARE", "DenseChoice",
           "MixedChoice", "TiledChoice"]

#: The least share of a call's expected edges that the tiles must hold for
#: :obj:`attention_backend="auto"` to take the tiled regime. Below it the
#: rest's fastRG, over twice the clusters, costs more than the tiles save:
#: on the CPU benchmark's sharp head at n = 4096 and 1% the tiles held 45%
#: of the edges and the tiled regime took twice the edge path's time; at
#: n = 16384 and 1% they held 77% and the two were level, at 5% (99%) the
#: tiled regime took a third of it (docs/performance.md).
TILES_MIN_SHARE = 0.5


# What the choice, read at the call's one sync, found.
class DenseChoice(NamedTuple):
    # What the dense regime's guard needs, read at the one sync: the pairs
    # and the mask's bytes; the first seed.
    num_pairs: float
    num_bytes: float
    seed: Optional[int]


class MixedChoice(NamedTuple):
    # A batch of both regimes: the first seed (the dense part's); the tiles'
    # share of the sparse pairs' expected edges where the tiled regime takes
    # them (else None).
    seed: Optional[int]
    tiles: Optional[float] = None


class TiledChoice(NamedTuple):
    # No pair dense, and the tiles hold this share of the expected edges.
    share: float


@torch.compiler.disable  # data-dependent: the pointers' checks and the choice
def regimes(query: Tensor, sbm: Tuple[Tensor, Tensor, Tensor],
            ptr_q: PtrLike, ptr_k: PtrLike, Nk: int,
            opts: SBMAttentionOptions, custom: bool
            ) -> Tuple[Tensor, Tensor, List[Check], Optional[Tensor],
                       Optional[Tensor]]:
    r"""The pointers :obj:`[G + 1]` and their checks (raised at the
    regime's one sync; until then the pointers are made valid), which
    (sequence, head) pairs take the dense regime (:obj:`[G, H]` bool), or
    :obj:`None` where the choice is not the expected density's, and the
    expected densities :obj:`[G, H]` where they made the choice or the
    exact mode checks them (with their gradient: the layer reports them
    too). :obj:`custom`: an attention of the caller's runs (no dense
    regime). Nothing is read to the host here."""
    Nq, device = query.size(0), query.device
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk, device)
    backend = opts.attention_backend
    auto = backend == "auto" and not custom and dense_runs(device)
    per = (expected_densities(ptr_q, ptr_k, *sbm)
           if auto or opts.mode == "exact" else None)
    if per is not None and opts.mode == "exact":
        checks.append(check_exact_densities(per))
    if per is None or not auto:
        if backend == "dense":
            resolve_backend("attention", "dense", device)
        return ptr_q, ptr_k, checks, None, per
    dense = (per.detach().double() + opts.exploration
             >= backend_info.dense_crossover(device)[0])
    pairs = ptr_q.diff() * ptr_k.diff()
    # Empty sequences join the other regime: no split for them.
    return (ptr_q, ptr_k, checks,
            dense | ((pairs == 0)[:, None] & dense.any()), per)


def tiles_share(sbm: Tuple[Tensor, Tensor, Tensor], ptr_q: Tensor, ptr_k: Tensor,
                pairs: Tensor, per: Tensor, opts: SBMAttentionOptions,
                dense: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The share of the expected edges of a call's sparse (sequence, head)
    pairs (:obj:`per` :obj:`[G, H]`, the expected densities, plus the
    exploration, where :obj:`dense` :obj:`[G, H]` is not set; :obj:`pairs`
    :obj:`[G]`, each sequence's query-key pairs) that the
    tiled regime's tiles would hold on them
    (:func:`~sbm_pyg.sampling.tiles.tile_edges` with the :obj:`opts`' tiles,
    the dense pairs' queries zeroed), and those expected edges: 0-dim
    tensors on the device, nothing read."""
    rate = per.detach() + opts.exploration if opts.exploration else per.detach()
    total = (rate * pairs.to(per.dtype)[:, None] * ~dense).sum()
    q_memb, block, k_memb = (x.detach() for x in sbm)
    q_memb = q_memb * (~dense)[ptr2index(ptr_q, q_memb.size(0))][:, :, None]
    tiled = tile_edges(q_memb, block, k_memb, ptr_q, ptr_k,
                       tile_q=opts.tile_size, tile_k=opts.tile_size,
                       min_fill=opts.tile_fill).sum()
    return tiled / total.clamp_min(torch.finfo(total.dtype).tiny), tiled


def backend_notes(device: torch.device, chose: bool, opts: SBMAttentionOptions,
                  width: int, num_clusters: int) -> Dict[str, str]:
    r"""What a call's :obj:`backends` says beside its kernels: on a GPU,
    the crossover that :obj:`chose` the regimes (the GPU's or the CPU's
    figure); with :obj:`sparse_memberships`, the clusters kept of the
    memberships' (:func:`~sbm_pyg.nn.support.compact_clusters`), as
    :obj:`"k'/k"`."""
    notes = {}
    if chose and device.type != "cpu":
        crossover, source = backend_info.dense_crossover(device)
        notes["crossover"] = f"{crossover:g} ({source})"
    if opts.sparse_memberships:
        notes["clusters"] = f"{width}/{num_clusters}"
    return notes
