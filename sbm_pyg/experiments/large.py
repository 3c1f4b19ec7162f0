r"""One harness for global attention on one large graph: community
classification (:func:`~sbm_pyg.datasets.communities.community_task`) on an
LFR graph or CLUSTER's recipe at scale, by the GNN alone, GPS with SBM,
Performer or BigBird attention, and PyG's :class:`~torch_geometric.nn.models.SGFormer`
(also with its global attention weighted out: its GNN alone, the control
that says what the global attention adds; and with SBM attention in place
of its linear one) and
:class:`~torch_geometric.nn.models.Polynormer`: accuracy, time per epoch
and peak memory, full-batch or on random node batches (as SGFormer trains
on large graphs), ``python -m sbm_pyg large``.

Every model reads the same one-hot seed features (with ``--features``, also
noisy features of each node's community) and the same edges; the
GPS models share everything but the global attention (GatedGCN local
layers, no positional encoding: eigenvectors of a :math:`10^5`-node graph
are a cost of their own).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from sbm_pyg.datasets.communities import cluster_graph, community_task
from sbm_pyg.datasets.lfr import lfr_graph
from sbm_pyg.experiments.budget_arguments import check_budget_numbers
from sbm_pyg.experiments.runs import PeakMemory, jsonable
from sbm_pyg.models import GPSNodeClassifier
from sbm_pyg.nn import DensityBudget, SBMConv, SBMMultiheadAttention

__all__ = ["LARGE_MODELS", "GRAPHS", "add_large_arguments", "validate_large",
           "large_graph", "build_large_model", "batch_statistics", "node_batches",
           "train_large"]

LARGE_MODELS = ("gnn", "gps-sbm", "gps-performer", "gps-bigbird", "sgformer", "sgformer-gnn",
                "sgformer-sbm", "polynormer")
GRAPHS = ("lfr", "cluster")
_GPS = {"gnn": "none", "gps-sbm": "sbm", "gps-performer": "performer",
        "gps-bigbird": "bigbird"}


def add_large_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m sbm_pyg large``."""
    add = parser.add_argument
    add("--graph", choices=GRAPHS, default="lfr",
        help="LFR (power-law degrees and communities) or CLUSTER's recipe at scale")
    add("--nodes", type=int, default=10_000)
    add("--mu", type=float, default=0.5, help="lfr: the mixing")
    add("--average-degree", type=float, default=20.0, help="lfr: the mean degree")
    add("--min-community", type=int, default=50, help="lfr: the smallest community")
    add("--max-community", type=int, default=1000, help="lfr: the largest community")
    add("--seeds", type=int, default=3,
        help="nodes of each community whose community is a feature")
    add("--features", type=int, default=0,
        help="noisy features of each node's community: its community's random "
             "centre in this many dimensions plus noise (0: none)")
    add("--feature-noise", type=float, default=1.0,
        help="the features' noise, in units of a centre's spread")
    add("--model", choices=LARGE_MODELS, default="gps-sbm")
    add("--channels", type=int, default=64)
    add("--layers", type=int, default=3, help="GPS layers; SGFormer's and "
        "Polynormer's local layers (their global: one and two)")
    add("--heads", type=int, default=2)
    add("--degree", type=float, default=32.0,
        help="gps-sbm, sgformer-sbm: the SBM heads' starting expected degree "
             "(init_density = degree / nodes of the graph or batch); gps-bigbird: "
             "its pattern's degree")
    add("--num-clusters", type=int, default=128,
        help="gps-sbm, sgformer-sbm: the SBM's clusters per head (its "
             "memberships hold this many numbers per node and head)")
    add("--target-density", type=float, default=None,
        help="gps-sbm, sgformer-sbm: hold every SBM head's expected density at "
             "this budget (sbm_pyg.nn.DensityBudget, per head, with its floor; "
             "default: no budget, the density goes where training takes it)")
    add("--budget-ki", type=float, default=0.05,
        help="the budget's integral gain per step (DensityBudget's ki)")
    add("--budget-lam", type=float, default=1.0,
        help="the budget's starting (and least) multipliers lambda_0: a full-batch "
             "run takes one step an epoch, too few for DensityBudget's default 1e-3 "
             "to grow to where it acts (the heads then swing about the budget)")
    add("--epochs", type=int, default=100)
    add("--batch-nodes", type=int, default=0,
        help="random node batches of this size (their induced subgraphs; 0: "
             "the whole graph at once)")
    add("--lr", type=float, default=1e-3)
    add("--dropout", type=float, default=0.1)
    add("--eval-every", type=int, default=5)
    add("--seed", type=int, default=0)
    add("--out", type=Path, required=True, help="run directory")


def validate_large(args) -> None:
    """Raises :class:`ValueError` naming the first bad option."""
    for name in ("nodes", "seeds", "channels", "layers", "heads", "epochs", "eval_every",
                 "num_clusters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.channels % args.heads:
        raise ValueError(f"--heads ({args.heads}) must divide --channels ({args.channels})")
    if args.batch_nodes < 0 or args.lr <= 0 or not 0 <= args.dropout < 1 \
            or not args.degree > 0:
        raise ValueError("--batch-nodes must be >= 0, --lr and --degree > 0, "
                         "--dropout in [0, 1)")
    if args.features < 0 or not args.feature_noise > 0:
        raise ValueError("--features must be >= 0 and --feature-noise > 0")
    if args.target_density is not None:
        if args.model not in ("gps-sbm", "sgformer-sbm"):
            raise ValueError(f"--target-density holds SBM heads: --model gps-sbm or "
                             f"sgformer-sbm, got {args.model}")
    check_budget_numbers(args.target_density, budget_ki=args.budget_ki,
                         budget_lam=args.budget_lam)
    if args.out.is_dir() and any(args.out.iterdir()):
        raise ValueError(f"--out {args.out} is not empty")


def large_graph(args, generator: torch.Generator) -> Data:
    """The run's graph and task (:func:`community_task`)."""
    if args.graph == "lfr":
        graph = lfr_graph(args.nodes, mu=args.mu, average_degree=args.average_degree,
                          min_community=args.min_community,
                          max_community=min(args.max_community, args.nodes),
                          max_degree=max(min(args.max_community - 1, args.nodes // 10), 2),
                          generator=generator)
    else:
        graph = cluster_graph(args.nodes, generator=generator)
    return community_task(graph, seeds=args.seeds, generator=generator,
                          features=args.features, noise=args.feature_noise)


def build_large_model(name: str, in_channels: int, num_classes: int, channels: int,
                      layers: int, heads: int, dropout: float,
                      init_density: Optional[float] = None,
                      num_clusters: int = 128) -> torch.nn.Module:
    r"""The model :obj:`name` (one of :data:`LARGE_MODELS`) for
    :obj:`in_channels` features and :obj:`num_classes` classes; for
    :obj:`"gps-sbm"` and :obj:`"sgformer-sbm"` the heads start at
    :obj:`init_density` with
    :obj:`num_clusters` clusters each, and
    :obj:`"gps-bigbird"` attends that density of the pairs. Its batch norms
    normalise by the batch's statistics in evaluation too
    (:func:`batch_statistics`)."""
    return batch_statistics(_large_model(name, in_channels, num_classes, channels,
                                         layers, heads, dropout, init_density,
                                         num_clusters))


def batch_statistics(model: torch.nn.Module) -> torch.nn.Module:
    r""":obj:`model` with every batch norm normalising by the batch's own
    statistics in evaluation as in training (no running averages). On one
    graph trained full-batch a running average gets one update an epoch
    and lags far behind the features' statistics: the GNN alone on the
    10^4-node LFR graph scored 0.6% validation accuracy in evaluation mode
    where the same epoch's training forward, one update earlier, scored
    52.8% (epoch 30). The evaluation's batch is the training's (the graph,
    or node batches of the same size)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.track_running_stats = False
            module.running_mean = module.running_var = None
            module.num_batches_tracked = None
    return model


def _large_model(name: str, in_channels: int, num_classes: int, channels: int,
                 layers: int, heads: int, dropout: float,
                 init_density: Optional[float], num_clusters: int) -> torch.nn.Module:
    if name in _GPS:
        extra: Dict[str, float] = {}
        if name == "gps-sbm":
            extra = dict(num_clusters=num_clusters)
            if init_density is not None:
                extra.update(init_density=init_density)
        elif name == "gps-bigbird" and init_density is not None:
            extra = dict(bigbird_density=init_density)
        return GPSNodeClassifier(in_channels, num_classes, channels=channels,
                                 num_layers=layers, heads=heads, attention=_GPS[name],
                                 dropout=dropout, attn_dropout=0.0, pe_channels=0,
                                 **extra)
    if name in ("sgformer", "sgformer-gnn", "sgformer-sbm", "polynormer"):
        # PyG ships them from 2.6 on; the package asks only for 2.5.
        try:
            from torch_geometric.nn.models import Polynormer, SGFormer
        except ImportError as e:
            raise ImportError(f"model {name!r} needs torch_geometric >= 2.6 (its "
                              f"SGFormer and Polynormer)") from e
    if name.startswith("sgformer"):
        # "sgformer-gnn": SGFormer's own control, its global attention's
        # output weighted 0 (graph_weight 1): its GNN branch alone, so that
        # the two differ by the global attention only. "sgformer-sbm": its
        # global attention SBM attention, everything else SGFormer's.
        model = SGFormer(in_channels, channels, num_classes, trans_num_layers=1,
                         trans_num_heads=heads, trans_dropout=dropout,
                         gnn_num_layers=layers, gnn_dropout=dropout,
                         graph_weight=1.0 if name == "sgformer-gnn" else 0.5)
        if name == "sgformer-sbm":
            attns = model.trans_conv.attns
            for i in range(len(attns)):
                attns[i] = _MaskByKeyword(SBMMultiheadAttention(
                    channels, heads, head_channels=channels // heads,
                    num_clusters=num_clusters, init_density=init_density, eval_seed=0))
        return model
    if name == "polynormer":
        # One head: PyG 2.8.1's global layers take hidden_channels inputs
        # while its local layers give heads * hidden_channels.
        return Polynormer(in_channels, channels, num_classes, local_layers=layers,
                          global_layers=2, heads=1, in_dropout=dropout,
                          dropout=dropout, global_dropout=dropout)
    raise ValueError(f"model must be one of {LARGE_MODELS}, got {name!r}")


class _MaskByKeyword(torch.nn.Module):
    # SGFormer's global module calls attn(x, mask) on its dense batch;
    # SBMMultiheadAttention takes its mask by keyword.
    def __init__(self, attn: SBMMultiheadAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.attn(x, mask=mask)


def node_batches(n: int, size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """A random partition of the :obj:`n` nodes into batches of
    :obj:`size` (the last may be smaller); one batch of all for size 0."""
    if size <= 0 or size >= n:
        yield torch.arange(n)
        return
    yield from torch.randperm(n, generator=generator).split(size)


def _logits(model: torch.nn.Module, data: Data, nodes: Tensor,
            generator: torch.Generator) -> Tensor:
    # The model on the subgraph the nodes induce (all of it: the graph).
    if nodes.numel() == data.num_nodes:
        x, edge_index = data.x, data.edge_index
    else:
        edge_index, _ = subgraph(nodes, data.edge_index, relabel_nodes=True,
                                 num_nodes=data.num_nodes)
        x = data.x[nodes]
    batch = torch.zeros(x.size(0), dtype=torch.long)
    if isinstance(model, GPSNodeClassifier):
        return model(x, edge_index, batch, generator=generator, batch_size=1)
    return model(x, edge_index, batch)


@torch.no_grad()
def _evaluate(model, data: Data, args, generator: torch.Generator) -> Dict[str, float]:
    model.eval()
    correct = {"val": 0, "test": 0}
    for nodes in node_batches(data.num_nodes, args.batch_nodes, generator):
        pred = _logits(model, data, nodes, generator).argmax(-1)
        for split in correct:
            mask = data[f"{split}_mask"][nodes]
            correct[split] += int((pred[mask] == data.y[nodes][mask]).sum())
    return {split: correct[split] / int(data[f"{split}_mask"].sum()) for split in correct}


def train_large(args, log: Optional[Callable[[dict], None]] = None) -> dict:
    """Trains :obj:`args.model` on the run's graph; writes
    ``OUT/metrics.jsonl`` and ``OUT/final.json`` (the test accuracy at the
    best validation, time per epoch, peak memory) and returns the final."""
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    data = large_graph(args, torch.Generator().manual_seed(args.seed))
    num_classes = int(data.y.max()) + 1
    nodes_seen = args.batch_nodes if 0 < args.batch_nodes < args.nodes else args.nodes
    model = build_large_model(args.model, data.x.size(1), num_classes, args.channels,
                              args.layers, args.heads, args.dropout,
                              init_density=min(args.degree / nodes_seen, 0.5),
                              num_clusters=args.num_clusters)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sbm_convs = [m for m in model.modules() if isinstance(m, SBMConv)]
    budget = None
    if args.target_density is not None:
        # Per head, so that no head takes the edges another needs; no warm-up:
        # the heads start at --degree, near the budget.
        budget = DensityBudget(model, args.target_density, per_head=True,
                               ki=args.budget_ki, lam=args.budget_lam)
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = args.out / "metrics.jsonl"
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    best = dict(val=-1.0, test=0.0, epoch=0)
    seconds = 0.0
    for epoch in range(1, args.epochs + 1):
        if args.model == "polynormer" and epoch > args.epochs // 2:
            model._global = True  # its recipe: local epochs first, then global
        model.train()
        start, losses = time.perf_counter(), []
        for nodes in node_batches(data.num_nodes, args.batch_nodes, generator):
            mask = data.train_mask[nodes]
            if not bool(mask.any()):
                continue
            out = _logits(model, data, nodes, generator)
            loss = F.cross_entropy(out[mask], data.y[nodes][mask])
            optimizer.zero_grad()
            (loss if budget is None else loss + budget.penalty()).backward()
            optimizer.step()
            if budget is not None:
                budget.step()
            losses.append(float(loss.detach()))
        seconds += time.perf_counter() - start
        record: Dict[str, Any] = dict(epoch=epoch, loss=sum(losses) / max(len(losses), 1),
                                      seconds=seconds)
        if sbm_convs:  # the SBM heads' sampled density in the epoch's last step
            heads = torch.stack([m.sampled_density for m in sbm_convs  # type: ignore[misc]
                                 ]).detach()
            record["density"] = float(heads.mean())
            # Each head's, [layers, heads]: what a per-head budget holds.
            record["head_density"] = heads.tolist()
        if budget is not None:  # the multipliers, the ceiling's and the floor's
            record["lam"], record["lam_floor"] = budget.lams.tolist()
        if epoch % args.eval_every == 0 or epoch == args.epochs:
            record.update(_evaluate(model, data, args, generator))
            if record["val"] > best["val"]:
                best = dict(val=record["val"], test=record["test"], epoch=epoch)
        with metrics.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if log is not None:
            log(record)
    final = dict(accuracy=best["test"], val_accuracy=best["val"], best_epoch=best["epoch"],
                 seconds_per_epoch=seconds / args.epochs, peak_memory_bytes=peak.read(),
                 density=record.get("density"), head_density=record.get("head_density"),
                 classes=num_classes, edges=data.num_edges,
                 parameters=sum(p.numel() for p in model.parameters()), args=jsonable(args))
    (args.out / "final.json").write_text(json.dumps(final, indent=1) + "\n")
    return final
