r"""The sharp-head suite: SBM attention heads whose memberships concentrate on
one of V clusters (0.98 on a token's own, the rest spread evenly over the
other k - 1) and whose block gives p = 0.8 inside a cluster and about 3e-4
across, so that each head's graph is V nearly complete blocks of about n / V
random tokens each (expected density about 0.8 / V). That is what the
heads that learned to separate their blocks look like (docs/performance.md,
"How sharp trained heads are"), and the case a tiled path would serve.

Timed through the public :func:`~sbm_pyg.nn.sbm_attention` (exact mode,
sampling and the straight-through backward into the memberships and the
block, fwd+bwd) against SDPA on the same queries, keys and values, in
turns; the regime that ran is recorded (``backends``), and on the CPU the
profiler's parts: the sampler, the attention's forward and its backward
(the estimator's membership gradients included). Beside them the tiled
path, the same law and estimator, fwd+bwd from the plan
(:func:`~sbm_pyg.sampling.tiles.plan_tiles`, 64 x 64 tiles) on: the tiles
drawn and attended by the dense-regime kernel
(:func:`~sbm_pyg.nn.tiled_sbm_attention`, ``tiles``; ``tiles_kernel`` says
which ran), and its PyTorch fallback, the draw
(:func:`~sbm_pyg.sampling.tiles.draw_tiled`) and
:func:`~sbm_pyg.nn.tiled_attention` (``tiles_torch``)."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.attention import batched, run_sdpa
from benchmarks.cases import CLUSTERS, HEADS, backward, qkv
from benchmarks.layer import breakdown, format_breakdown
from benchmarks.measure import median_times
from sbm_pyg.nn import (
    SBMAttentionOptions,
    sbm_attention,
    tiled_attention,
    tiled_sbm_attention,
)
from sbm_pyg.ops.backend_info import dense_runs
from sbm_pyg.sampling.tiles import draw_tiled, in_tiles, plan_tiles

#: A token's membership of its own cluster, and the edge probability inside
#: a cluster.
OWN, INSIDE = 0.98, 0.8
#: The tiled path's tiles and the least expected fill of a tiled cluster pair.
TILE, MIN_FILL = 64, 0.5


def num_clusters(density: float) -> int:
    """V, the clusters of a sharp head of expected density about
    :obj:`density`: 0.8 / density, within 1 and k."""
    return max(1, min(CLUSTERS, round(INSIDE / density)))


def sharp_sbm(n: int, density: float, device: torch.device,
              seed: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """Memberships :obj:`[n, H, k]` (queries and keys alike) and a block
    :obj:`[H, k, k]` of V = round(0.8 / density) clusters, each token in one
    drawn at random, as leaves that take gradients."""
    V = num_clusters(density)
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randint(V, (n, HEADS, 1), generator=g)
    memb = torch.full((n, HEADS, CLUSTERS), (1 - OWN) / (CLUSTERS - 1))
    memb.scatter_(2, cluster, OWN)
    block = torch.zeros(HEADS, CLUSTERS, CLUSTERS)
    block[:, torch.arange(V), torch.arange(V)] = INSIDE / OWN**2
    return tuple(t.to(device).requires_grad_() for t in (memb, block, memb.clone()))


def tile_figures(sbm: Tuple[Tensor, Tensor, Tensor], q: Tensor, k: Tensor,
                 v: Tensor, tile: int, gen: torch.Generator) -> dict:
    """The tiled path's figures on one draw (not timed): its tiles, their
    edges and the rest's, the density."""
    fixed = [t.detach() for t in sbm]
    plan = plan_tiles(*fixed, tile_q=tile, tile_k=tile, min_fill=MIN_FILL)
    with torch.no_grad():
        _, graph = tiled_sbm_attention(q, k, v, fixed, plan, mode="exact",
                                       generator=gen, return_graph=True)
    key, query = graph.edge_index
    tile_edges = int(in_tiles(plan, graph.head, query, key).sum())
    n = q.size(0)
    return dict(tiles=plan.num_tiles, tile_edges=tile_edges,
                rest_edges=graph.num_edges - tile_edges,
                tiled_density=graph.num_edges / (HEADS * n * n))


def bench_sharp(sizes: Sequence[Tuple[int, float]], device: torch.device,
                repeats: int, log, tile: int = TILE) -> List[dict]:
    """One row per (n, density): the sharp head's fwd+bwd against SDPA's,
    the tiled path's with tiles of :obj:`tile` tokens."""
    rows = []
    options = SBMAttentionOptions(mode="exact")
    for n, density in sizes:
        q, k, v = qkv(n, device)
        q4, k4, v4 = batched(q, k, v)
        sbm = sharp_sbm(n, density, device)
        gen = torch.Generator(device).manual_seed(0)
        last: dict = {}

        def run_sbm() -> None:
            res = sbm_attention(q, k, v, sbm, options=options, training=True,
                                generator=gen)
            last.update(density=float(res.sampled_density.mean()),
                        backends=dict(res.backends))
            backward(res.out, (q, k, v, *sbm))

        def run_tiles() -> None:
            plan = plan_tiles(*(t.detach() for t in sbm), tile_q=tile,
                              tile_k=tile, min_fill=MIN_FILL)
            backward(tiled_sbm_attention(q, k, v, sbm, plan, mode="exact",
                                         generator=gen), (q, k, v, *sbm))

        def run_tiles_torch() -> None:
            fixed = [t.detach() for t in sbm]
            plan = plan_tiles(*fixed, tile_q=tile, tile_k=tile, min_fill=MIN_FILL)
            tiled = draw_tiled(*fixed, plan, mode="exact", generator=gen)
            backward(tiled_attention(q, k, v, tiled, sbm=sbm), (q, k, v, *sbm))

        times = median_times(dict(sbm=run_sbm, tiles=run_tiles,
                                  tiles_torch=run_tiles_torch,
                                  sdpa=lambda: run_sdpa(q4, k4, v4)),
                             device, repeats)
        last.update(tile_figures(sbm, q, k, v, tile, gen))
        row = dict(n=n, density=density, clusters=num_clusters(density),
                   sampled_density=last["density"], backends=last["backends"],
                   sbm_time=times["sbm"], sdpa_time=times["sdpa"],
                   ratio=times["sbm"] / times["sdpa"],
                   tiles_time=times["tiles"],
                   tiles_ratio=times["tiles"] / times["sdpa"],
                   tiles_kernel="dense" if dense_runs(device) else "torch",
                   tiles_torch_time=times["tiles_torch"],
                   tiles_torch_ratio=times["tiles_torch"] / times["sdpa"],
                   tiles=last["tiles"], tiled_density=last["tiled_density"],
                   tile_fill=last["tile_edges"] / max(last["tiles"] * tile**2, 1),
                   rest_share=last["rest_edges"] / max(
                       last["rest_edges"] + last["tile_edges"], 1))
        log(f"  n={n:>6} target {density:<5} sampled {row['sampled_density']:.4f} "
            f"({row['backends']['sampler']}/{row['backends']['attention']}): "
            f"sbm_attention {row['sbm_time'] * 1e3:.1f} ms vs SDPA "
            f"{row['sdpa_time'] * 1e3:.1f} ms: {row['ratio']:.3f}x; tiled "
            f"({row['tiles_kernel']}) {row['tiles_time'] * 1e3:.1f} ms "
            f"({row['tiles_ratio']:.3f}x; in PyTorch {row['tiles_torch_ratio']:.3f}x, "
            f"density {row['tiled_density']:.4f}, {row['tiles']} tiles filled "
            f"{row['tile_fill']:.2f}, rest {row['rest_share']:.3f} of the edges)")
        if device.type == "cpu":
            parts = breakdown(run_sbm, calls=1)
            row["breakdown"] = parts
            forward = parts["attention_forward"]
            row["backward_vs_forward"] = (parts["attention_backward"] / forward
                                          if forward > 0 else None)
            log(f"  parts: {format_breakdown(parts)}")
        rows.append(row)
    return rows
