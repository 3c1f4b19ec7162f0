r"""How sharp trained SBM heads are: whether a head's graph, its tokens
sorted by their main cluster, is a few dense tiles.

For each head of each layer of a trained model, on fresh batches of its
task, per sequence: the expected edge mass :math:`\sum_{ij} p_{ij}`, and

- **cluster pairs**: queries and keys grouped by their top cluster, the
  fewest (query-cluster, key-cluster) pairs that hold :obj:`share` of the
  mass, the pairs of tokens they span (a fraction of all pairs) and their
  fill (expected edges per pair in them);
- **tiles**: queries and keys sorted by their top cluster and cut into
  :obj:`tile` x :obj:`tile` tiles, the fewest tiles that hold :obj:`share`
  of the mass, their pairs (a fraction of all pairs) and their fill.

A tiled path computes every pair of its tiles; an edge path pays per edge.
Tiles pay where their fill exceeds the ratio of a pair's cost in a dense
tile to an edge's cost (docs/performance.md gives both per device).

The probabilities are formed densely, :math:`O(n^2)` per sequence: a
diagnostic for task-sized inputs, not a training path.

``python -m sbm_pyg.experiments.sharpness RUN [RUN ...] --out FILE`` (a run
directory or a checkpoint file) writes the table as JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sbm_pyg.experiments.runs import load_run
from sbm_pyg.experiments.tasks import make_task
from sbm_pyg.models import SBMTransformer

__all__ = ["tile_profile", "model_sharpness"]


def _cover(mass: Tensor, pairs: Tensor, total: Tensor, share: float
           ) -> Tuple[int, float, float]:
    # The fewest of the groups (heaviest first) holding `share` of `total`:
    # their count, the pairs they span and their expected edges.
    order = mass.argsort(descending=True)
    held = mass[order].cumsum(0)
    count = min(int((held < share * total).sum()) + 1, mass.numel())
    return count, float(pairs[order[:count]].sum()), float(held[count - 1])


@torch.no_grad()
def tile_profile(q_memb: Tensor, block: Tensor, k_memb: Tensor, tile: int,
                 share: float = 0.9) -> Dict[str, float]:
    r"""One sequence and head: :obj:`q_memb [n, k]`, :obj:`block [k, k]`,
    :obj:`k_memb [m, k]`. Returns the density, and for the cluster pairs
    and the :obj:`tile`-token tiles that hold :obj:`share` of the expected
    edges: their count, the fraction of all pairs they span and their fill
    (see the module's docstring)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    if tile < 1:
        raise ValueError(f"tile must be a positive int, got {tile}")
    n, k = q_memb.shape
    m = k_memb.size(0)
    if n == 0 or m == 0:
        raise ValueError("tile_profile needs a sequence with queries and keys")
    p = (q_memb.double() @ block.double() @ k_memb.double().T).clamp(max=1.0)
    total = p.sum()
    cq, ck = q_memb.argmax(1), k_memb.argmax(1)
    cell = (cq[:, None] * k + ck[None, :]).flatten()
    cluster_mass = torch.zeros(k * k, dtype=p.dtype).index_add_(0, cell, p.flatten())
    cluster_pairs = (torch.bincount(cq, minlength=k)[:, None]
                     * torch.bincount(ck, minlength=k)[None, :]).flatten().double()
    num_c, pairs_c, held_c = _cover(cluster_mass, cluster_pairs, total, share)
    # Tokens sorted by their top cluster, the pairs cut into tiles (the
    # padding's pairs count for nothing).
    p = p[cq.argsort(stable=True)][:, ck.argsort(stable=True)]
    tn, tm = -(-n // tile), -(-m // tile)
    padded = torch.nn.functional.pad(p, (0, tm * tile - m, 0, tn * tile - n))
    tile_mass = padded.view(tn, tile, tm, tile).sum((1, 3)).flatten()
    rows = torch.full((tn,), tile, dtype=p.dtype)
    rows[-1] = n - (tn - 1) * tile
    cols = torch.full((tm,), tile, dtype=p.dtype)
    cols[-1] = m - (tm - 1) * tile
    num_t, pairs_t, held_t = _cover(tile_mass, (rows[:, None] * cols).flatten(),
                                    total, share)
    return dict(density=float(total) / (n * m), cluster_pairs=num_c,
                cluster_pair_fraction=pairs_c / (n * m),
                cluster_pair_fill=held_c / max(pairs_c, 1.0),
                tiles=num_t, tile_fraction=pairs_t / (n * m),
                tile_fill=held_t / max(pairs_t, 1.0))


@torch.no_grad()
def model_sharpness(model: SBMTransformer, task, batches: int,
                    tiles: Sequence[int], share: float = 0.9
                    ) -> List[Dict[str, object]]:
    r"""Every SBM head of :obj:`model` on :obj:`batches` fresh batches of
    :obj:`task` (its :meth:`batch`): per layer, head and tile size the
    means over the sequences of :func:`tile_profile`."""
    convs = [block.attention.conv for block in model.blocks]
    seen: List[Tuple[int, Tensor, Tuple[Tensor, Tensor, Tensor]]] = []
    handles = []
    for index, conv in enumerate(convs):
        ptrs: List[Tensor] = []
        handles.append(conv.register_forward_pre_hook(
            lambda module, args, kwargs, ptrs=ptrs: ptrs.append(kwargs["ptr"]),
            with_kwargs=True))
        handles.append(conv.sbm.register_forward_hook(
            lambda module, args, out, index=index, ptrs=ptrs:
            seen.append((index, ptrs[-1], out))))
    sums: Dict[Tuple[int, int, int], Dict[str, float]] = {}
    counts: Dict[Tuple[int, int, int], int] = {}
    try:
        for b in range(batches):
            tokens, mask, _ = task.batch("test")
            seen.clear()
            model(tokens, mask, generator=torch.Generator().manual_seed(b),
                  output=task.output)
            for index, ptr, (q_memb, block, k_memb) in seen:
                bounds = ptr.tolist()
                for lo, hi in zip(bounds[:-1], bounds[1:]):
                    if hi == lo:
                        continue
                    for h in range(q_memb.size(1)):
                        for tile in tiles:
                            row = tile_profile(q_memb[lo:hi, h], block[h],
                                               k_memb[lo:hi, h], tile, share)
                            key = (index, h, tile)
                            acc = sums.setdefault(key, dict.fromkeys(row, 0.0))
                            for name, value in row.items():
                                acc[name] += value
                            counts[key] = counts.get(key, 0) + 1
    finally:
        for handle in handles:
            handle.remove()
    return [dict(layer=index, head=h, tile=tile, sequences=counts[index, h, tile],
                 **{name: value / counts[index, h, tile] for name, value in acc.items()})
            for (index, h, tile), acc in sorted(sums.items())]


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="run directories or checkpoint files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--share", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for run in args.runs:
        model, run_args = load_run(run)
        if run_args["attention"] != "sbm":
            parser.error(f"{run}: attention is {run_args['attention']!r}, not 'sbm'")
        task = make_task(argparse.Namespace(**run_args),
                         torch.Generator().manual_seed(args.seed))
        for row in model_sharpness(model, task, args.batches, args.tiles, args.share):
            rows.append(dict(run=str(run), task=run_args["task"],
                             parametrization=run_args.get("sbm_parametrization",
                                                          "paper"), **row))
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(command=vars(args) | dict(
        runs=[str(r) for r in args.runs], out=str(args.out)), rows=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
