r"""``python -m sbm_pyg gps``: GraphGPS on PATTERN or CLUSTER
(:class:`~sbm_pyg.datasets.SBMBenchmarkDataset`) with one of four global
attentions, as GraphGPS trains and scores it: weighted cross-entropy,
AdamW with gradient clipping and a cosine schedule with warm-up stepped per
epoch, the mean per-class recall (``accuracy-SBM``) on the whole split, and
the test figure of the epoch with the best validation metric.

Per epoch ``OUT/metrics.jsonl`` gets the training and validation loss and
metric, the seconds, the peak memory and for SBM the validation density per
layer and head; ``OUT/checkpoint.pt`` allows ``--resume``,
``OUT/best.pt`` holds the best model, ``OUT/final.json`` the test result.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from sbm_pyg.datasets import SBMBenchmarkDataset, generate_sbm_graphs
from sbm_pyg.experiments.gps_arguments import (
    GPS_PRESETS,
    RESUMABLE,
    add_gps_arguments,
    validate_gps_arguments,
)
from sbm_pyg.experiments.gps_metrics import accuracy_sbm, weighted_cross_entropy
from sbm_pyg.experiments.optim import build_optimizer, build_schedule, clip_and_measure
from sbm_pyg.experiments.runs import PeakMemory, jsonable, load_checkpoint, save_checkpoint
from sbm_pyg.models import GPSNodeClassifier
from sbm_pyg.nn import AddLaplacianPE, DensityBudget

__all__ = ["GPS_PRESETS", "RESUMABLE", "add_gps_arguments", "validate_gps_arguments",
           "train_gps", "build_gps_model", "accuracy_sbm",
           "weighted_cross_entropy", "evaluate_gps"]

def _pe_k(args) -> int:
    return args.pe_k if args.pe_k is not None else (
        16 if args.dataset == "PATTERN" else 10)


def build_gps_model(args, in_channels: int, num_classes: int) -> GPSNodeClassifier:
    """The model a run trains, from its arguments."""
    sbm_kwargs = dict(num_clusters=args.num_clusters, sbm_init=args.sbm_init,
                      init_density=getattr(args, "init_density", None),
                      sbm_parametrization=getattr(args, "sbm_parametrization",
                                                  "paper"),
                      exploration=args.exploration)
    return GPSNodeClassifier(
        in_channels, num_classes, channels=args.channels,
        num_layers=args.num_layers, heads=args.heads, attention=args.attention,
        dropout=args.dropout, attn_dropout=args.attn_dropout,
        pe_channels=args.pe_channels if _pe_k(args) else 0,
        **(sbm_kwargs if args.attention == "sbm" else {}))


def _forward(model: GPSNodeClassifier, batch, generator) -> Tensor:
    return model(batch.x, batch.edge_index, batch.batch,
                 getattr(batch, "eigvecs", None), getattr(batch, "eigvals", None),
                 generator=generator, batch_size=batch.num_graphs)


@torch.no_grad()
def evaluate_gps(model: GPSNodeClassifier, loader: DataLoader,
                 device: torch.device, num_classes: int, seed: int) -> dict:
    """Loss, metric and (SBM) density per layer and head on a whole split,
    in eval mode, the attention sampled from a generator seeded with
    :obj:`seed` (the same figure at every evaluation of the same model)."""
    model.eval()
    generator = torch.Generator(device).manual_seed(seed)
    preds, targets, densities = [], [], []
    loss_sum = 0.0
    for batch in loader:
        batch = batch.to(device)
        logits = _forward(model, batch, generator)
        loss_sum += float(weighted_cross_entropy(logits, batch.y)) * batch.num_graphs
        preds.append(logits.argmax(1))
        targets.append(batch.y)
        d = model.densities()
        if d is not None:
            densities.append(d)
    result = dict(loss=loss_sum / len(loader.dataset),
                  metric=accuracy_sbm(torch.cat(preds), torch.cat(targets),
                                      num_classes))
    if densities:
        per = torch.stack(densities).mean(0)
        result.update(density=float(per.mean()), density_per_layer_head=per.tolist())
    return result


def _datasets(args) -> Tuple[Sequence[Data], ...]:
    pre = AddLaplacianPE(_pe_k(args)) if _pe_k(args) else None
    root = str(args.root / (f"pe{_pe_k(args)}" if pre else "plain"))
    splits: List[Sequence[Data]] = []
    for split in ("train", "val", "test"):
        count = getattr(args, f"{split}_graphs", None)
        if count is None:  # the whole split, generated once, cached under root
            splits.append(SBMBenchmarkDataset(root, args.dataset, split,
                                              seed=args.data_seed,
                                              pre_transform=pre))
            continue
        # Part of a split: generated in memory (seconds; the split's own
        # stream: the cached split's graphs), encoded for the graphs used
        # only, nothing written under root. Evenly spaced: PATTERN's graphs
        # come in runs of one pattern.
        graphs = generate_sbm_graphs(args.dataset, split, args.data_seed)
        index = (torch.arange(min(count, len(graphs)))
                 * (len(graphs) / min(count, len(graphs)))).long().tolist()
        splits.append([pre(graphs[i]) if pre else graphs[i] for i in index])
    return tuple(splits)


def _best_so_far(path: Path, epoch: int) -> Tuple[float, int]:
    # The best validation metric and its epoch among the logged epochs up
    # to `epoch` (dropping later ones, logged before a crash).
    best, best_epoch, kept = -1.0, 0, []
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["epoch"] <= epoch:
                kept.append(line)
                if record["val_metric"] > best:
                    best, best_epoch = record["val_metric"], record["epoch"]
        path.write_text("".join(line + "\n" for line in kept))
    return best, best_epoch


def train_gps(args) -> dict:
    """Trains and evaluates one run (see the module's docstring); returns
    the final record, also written to ``OUT/final.json``."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    train_set, val_set, test_set = _datasets(args)
    num_classes = 2 if args.dataset == "PATTERN" else 6
    data_generator = torch.Generator().manual_seed(args.seed)
    graph_generator = torch.Generator(device).manual_seed(args.seed + 1)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=data_generator)
    val_loader = DataLoader(val_set, batch_size=args.batch_size)
    test_loader = DataLoader(test_set, batch_size=args.batch_size)
    model = build_gps_model(args, train_set[0].num_features, num_classes).to(device)
    opt_args = SimpleNamespace(lr=args.lr, sbm_lr=None, optimizer="adamw",
                               adam_eps=1e-8, weight_decay=args.weight_decay,
                               steps=args.epochs, warmup_steps=args.warmup_epochs,
                               schedule="cosine")
    optimizer = build_optimizer(model, opt_args)
    schedule = build_schedule(optimizer, opt_args)  # stepped per epoch
    budget = None
    if args.target_density is not None:
        steps = args.epochs * len(train_loader)
        budget = DensityBudget(model, args.target_density, warmup=steps // 10)
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint, metrics = args.out / "checkpoint.pt", args.out / "metrics.jsonl"
    epoch = 0
    if args.resume:
        epoch = _resume(checkpoint, device, (model, optimizer, schedule, budget),
                        data_generator, graph_generator)
    best, best_epoch = _best_so_far(metrics, epoch)
    memory = PeakMemory(device)
    progress = None
    if not args.no_progress:
        from tqdm import tqdm
        # Counted in training batches: a small run moves at once.
        progress = tqdm(total=args.epochs * len(train_loader),
                        initial=epoch * len(train_loader), unit="batch",
                        desc=f"{args.dataset}/{args.attention}")
    while epoch < args.epochs:
        memory.start()
        start = time.perf_counter()
        train = _train_epoch(model, train_loader, optimizer, budget, args,
                             device, graph_generator, num_classes, progress)
        seconds = time.perf_counter() - start
        peak = memory.read()  # training's: not the evaluation's
        schedule.step()
        epoch += 1
        val = evaluate_gps(model, val_loader, device, num_classes, args.eval_seed)
        record = dict(epoch=epoch, lr=optimizer.param_groups[0]["lr"], **train,
                      val_loss=val["loss"], val_metric=val["metric"],
                      seconds=seconds,
                      eval_seconds=time.perf_counter() - start - seconds,
                      peak_memory_bytes=peak)
        if "density" in val:
            record.update(val_density=val["density"],
                          val_density_per_layer_head=val["density_per_layer_head"])
        if val["metric"] > best:
            best, best_epoch = val["metric"], epoch
            torch.save(dict(model=model.state_dict(), epoch=epoch),
                       args.out / "best.pt")
        with open(metrics, "a") as f:
            f.write(json.dumps(record) + "\n")
        rng = dict(torch=torch.get_rng_state(), data=data_generator.get_state(),
                   graph=graph_generator.get_state())
        save_checkpoint(model, optimizer, schedule, epoch, rng, 1, checkpoint, 0,
                        jsonable(args),
                        budget=None if budget is None else budget.state_dict())
        if progress is not None:
            progress.set_postfix(epoch=epoch, loss=f"{train['train_loss']:.3f}",
                                 val=f"{val['metric']:.4f}")
    if progress is not None:
        progress.close()
    graphs = dict(train=len(train_set), val=len(val_set), test=len(test_set))
    return _final(args, model, test_loader, device, num_classes, best,
                  best_epoch, graphs)


def _resume(checkpoint: Path, device: torch.device, trained: tuple,
            data_generator: torch.Generator,
            graph_generator: torch.Generator) -> int:
    # The state of (model, optimizer, schedule, budget or None) and the
    # generators from a checkpoint; returns its epoch.
    model, optimizer, schedule, budget = trained
    state = load_checkpoint(checkpoint, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    if budget is not None:
        budget.load_state_dict(state["budget"])
    rng = state["rng"][0]
    torch.set_rng_state(rng["torch"].cpu())
    data_generator.set_state(rng["data"].cpu())
    graph_generator.set_state(rng["graph"].cpu())
    return state["step"]


def _train_epoch(model, loader, optimizer, budget, args, device, generator,
                 num_classes, progress) -> dict:
    model.train()
    losses: List[Tensor] = []
    preds, targets, densities = [], [], []
    for batch in loader:
        batch = batch.to(device)
        logits = _forward(model, batch, generator)
        loss = weighted_cross_entropy(logits, batch.y)
        optimizer.zero_grad()
        if budget is not None:
            (loss + budget.penalty()).backward()
        elif args.lam > 0:
            from sbm_pyg.nn import density_loss
            (loss + args.lam * density_loss(model)).backward()
        else:
            loss.backward()
        clip_and_measure(optimizer, args.clip_grad_norm)
        optimizer.step()
        if budget is not None:
            budget.step()
        if progress is not None:
            progress.update(1)
        losses.append(loss.detach())
        preds.append(logits.detach().argmax(1))
        targets.append(batch.y)
        d = model.densities()
        if d is not None:
            densities.append(d.detach())
    record = dict(train_loss=float(torch.stack(losses).mean()),
                  train_metric=accuracy_sbm(torch.cat(preds), torch.cat(targets),
                                            num_classes))
    if densities:
        record["train_density"] = float(torch.stack(densities).mean())
    if budget is not None:
        record["lam"] = float(budget.lam.mean())
    return record


def _final(args, model, test_loader, device, num_classes, best: float,
           best_epoch: int, graphs: Dict[str, int]) -> dict:
    # The test figure of the best validation epoch's model.
    best_path = args.out / "best.pt"
    model.load_state_dict(torch.load(best_path, map_location=device,
                                     weights_only=True)["model"])
    test = evaluate_gps(model, test_loader, device, num_classes, args.eval_seed)
    records = [json.loads(line) for line in
               (args.out / "metrics.jsonl").read_text().splitlines()]
    final = dict(dataset=args.dataset, attention=args.attention, seed=args.seed,
                 epochs=len(records), best_epoch=best_epoch, val_metric=best,
                 test_accuracy=test["metric"], test_loss=test["loss"],
                 seconds_per_epoch=sum(r["seconds"] for r in records) / len(records),
                 peak_memory_bytes=max((r["peak_memory_bytes"] or 0) for r in records),
                 graphs=graphs, args=jsonable(args))
    if "density" in test:
        final.update(density=test["density"],
                     density_per_layer_head=test["density_per_layer_head"])
    (args.out / "final.json").write_text(json.dumps(final, indent=1))
    return final
