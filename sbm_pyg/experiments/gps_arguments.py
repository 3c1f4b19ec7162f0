r"""The arguments of ``python -m sbm_pyg gps``: its presets, its parser
and their validation."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict

import torch

from sbm_pyg.experiments.arguments import default_exploration
from sbm_pyg.models import GPS_ATTENTIONS
from sbm_pyg.nn.block_model import INITS, PARAMETRIZATIONS

__all__ = ["GPS_PRESETS", "RESUMABLE", "add_gps_arguments",
           "validate_gps_arguments"]

#: Named configurations for ``--preset``; the command line overrides them.
GPS_PRESETS: Dict[str, dict] = {
    # GraphGPS's configs/GPS/pattern-GPS.yaml and cluster-GPS.yaml:
    # GatedGCN + Transformer, batch norm, attention dropout 0.5, LapPE
    # (16 / 10 eigenvectors, DeepSet to 16), AdamW 5e-4, weight decay 1e-5,
    # clipping at 1, cosine schedule with 5 warm-up epochs, 100 epochs.
    "graphgps-pattern": dict(dataset="PATTERN", channels=64, num_layers=6,
                             heads=4, dropout=0.0, attn_dropout=0.5,
                             batch_size=32, epochs=100, warmup_epochs=5,
                             lr=5e-4, weight_decay=1e-5, clip_grad_norm=1.0,
                             pe_k=16, train_graphs=None),
    "graphgps-cluster": dict(dataset="CLUSTER", channels=48, num_layers=16,
                             heads=8, dropout=0.1, attn_dropout=0.5,
                             batch_size=16, epochs=100, warmup_epochs=5,
                             lr=5e-4, weight_decay=1e-5, clip_grad_norm=1.0,
                             pe_k=10, train_graphs=None),
    # The CPU scale (about 20-25 minutes a run on one core): GraphGPS's
    # recipe at width 32 with 4 layers and 4 heads, on 2,000 of the 10,000
    # training graphs (every fifth: all of PATTERN's patterns) for 30
    # epochs; validation and test splits whole. Either dataset.
    "graphgps-cpu": dict(channels=32, num_layers=4, heads=4, dropout=0.0,
                         attn_dropout=0.5, batch_size=32, epochs=30,
                         warmup_epochs=3, lr=5e-4, weight_decay=1e-5,
                         clip_grad_norm=1.0, train_graphs=2000),
}

# Settings a resumed run may change; any other is the checkpoint's.
RESUMABLE = {"epochs", "out", "resume", "device", "no_progress", "root",
             "preset"}


def add_gps_arguments(parser: argparse.ArgumentParser) -> None:
    def add(*names, **kwargs):
        kwargs.setdefault("help", "(default: %(default)s)")
        return parser.add_argument(*names, **kwargs)

    add("--preset", choices=sorted(GPS_PRESETS), default=None,
        help="a named configuration; explicit arguments override it")
    add("--dataset", choices=["PATTERN", "CLUSTER"], default=None,
        help="required unless a --preset sets it")
    add("--attention", choices=GPS_ATTENTIONS, default="sbm",
        help="the global attention; everything else is the same")
    add("--channels", type=int, default=64)
    add("--num-layers", type=int, default=6)
    add("--heads", type=int, default=4)
    add("--dropout", type=float, default=0.0)
    add("--attn-dropout", type=float, default=0.5,
        help="dropout on the attention weights")
    add("--pe-k", type=int, default=None,
        help="Laplacian eigenvectors (default: 16 on PATTERN, 10 on CLUSTER "
             "as GraphGPS; 0: no positional encoding)")
    add("--pe-channels", type=int, default=16)
    add("--num-clusters", type=int, default=32, help="SBM clusters per head")
    add("--sbm-init", choices=INITS, default="paper")
    add("--init-density", type=float, default=None,
        help="start the SBMs near this expected density instead of "
             "--sbm-init's (e.g. an expected degree over the nodes)")
    add("--sbm-parametrization", choices=PARAMETRIZATIONS, default="paper")
    add("--exploration", type=float, default=None,
        help="SBM exploration rate in training (default: 0.01, or a tenth "
             "of --target-density, else of --init-density, where that is less)")
    add("--lam", type=float, default=0.0, help="density penalty lambda (sbm)")
    add("--target-density", type=float, default=None,
        help="hold the SBM heads' mean expected density at this budget "
             "(sbm_pyg.nn.DensityBudget); replaces --lam")
    add("--batch-size", type=int, default=32)
    add("--epochs", type=int, default=100)
    add("--warmup-epochs", type=int, default=5)
    add("--lr", type=float, default=5e-4)
    add("--weight-decay", type=float, default=1e-5)
    add("--clip-grad-norm", type=float, default=1.0)
    for split in ("train", "val", "test"):
        add(f"--{split}-graphs", type=int, default=None,
            help=f"use this many graphs of the {split} split, evenly spaced "
                 f"over it, generated in memory (default: all, cached under "
                 f"--root)")
    add("--eval-seed", type=int, default=12345,
        help="the attention's sampling seed in every evaluation, so that a "
             "figure does not move between evaluations")
    add("--seed", type=int, default=0, help="model, data order and sampling")
    add("--data-seed", type=int, default=0, help="the datasets' generator")
    add("--root", type=Path, default=Path("data"),
        help="where the generated datasets are cached")
    add("--out", type=Path, required=True, help="run directory")
    add("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    add("--device", default="cpu")
    add("--no-progress", action="store_true")


def validate_gps_arguments(args) -> None:
    """Raises :class:`ValueError` naming the first bad argument."""
    if args.dataset is None:
        raise ValueError("--dataset is required (or a --preset that sets it)")
    for name in ("channels", "num_layers", "heads", "batch_size", "epochs",
                 "pe_channels", "num_clusters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.channels % args.heads:
        raise ValueError("--heads must divide --channels")
    if args.pe_k is not None and args.pe_k < 0:
        raise ValueError("--pe-k must be >= 0")
    if args.pe_channels >= args.channels:
        raise ValueError("--pe-channels must be below --channels")
    for split in ("train", "val", "test"):
        count = getattr(args, f"{split}_graphs", None)
        if count is not None and count < 1:
            raise ValueError(f"--{split}-graphs must be >= 1")
    if not 0 <= args.dropout < 1 or not 0 <= args.attn_dropout < 1:
        raise ValueError("--dropout and --attn-dropout must lie in [0, 1)")
    if args.lr <= 0 or args.weight_decay < 0 or args.clip_grad_norm < 0:
        raise ValueError("--lr must be > 0, --weight-decay and "
                         "--clip-grad-norm >= 0")
    if args.exploration is None:
        args.exploration = default_exploration(
            args.target_density if args.target_density is not None
            else args.init_density)
    if args.warmup_epochs < 0 or args.lam < 0 or args.exploration < 0:
        raise ValueError("--warmup-epochs, --lam and --exploration must be >= 0")
    if args.init_density is not None and args.attention != "sbm":
        raise ValueError("--init-density needs --attention sbm")
    if args.target_density is not None:
        if not 0 < args.target_density <= 1:
            raise ValueError(f"--target-density must lie in (0, 1], got "
                             f"{args.target_density}")
        if args.attention != "sbm" or args.lam != 0:
            raise ValueError("--target-density needs --attention sbm and "
                             "sets lambda itself: leave --lam at 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available")
    if args.resume and not (args.out / "checkpoint.pt").exists():
        raise ValueError(f"--resume: no checkpoint at {args.out / 'checkpoint.pt'}")
    if not args.resume and args.out.is_dir() and any(args.out.iterdir()):
        raise ValueError(f"--out {args.out} is not empty: pass --resume to "
                         f"continue the run in it, or choose another directory")
