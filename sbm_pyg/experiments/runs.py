r"""A training run on disk: the model its arguments build, its checkpoint
(model, optimizer, step, every rank's random state, arguments), and the
trained model loaded back."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Tuple, Union

import torch

from sbm_pyg.experiments.tasks import VOCAB
from sbm_pyg.models import SBMTransformer

__all__ = ["build_model", "load_run", "save_checkpoint", "jsonable"]


def build_model(args) -> SBMTransformer:
    """The model a run trains, from its arguments (token and sequence heads
    for both tasks; the vocabulary and length follow from the task)."""
    if args.task == "listops":
        num_tokens, max_len = len(VOCAB), args.seq_len - 1
    else:
        num_tokens, max_len = args.seq_len + 1, args.seq_len
    return SBMTransformer(
        num_tokens, max_len,
        channels=args.channels, num_layers=args.num_layers,
        heads=args.heads, attention=args.attention,
        num_clusters=args.num_clusters,
        token_classes=1, seq_classes=10, dropout=args.dropout,
        **(dict(exploration=args.exploration, mode=args.mode,
                ste=args.ste, sbm_init=args.sbm_init)
           if args.attention == "sbm" else {}),
    )


def load_run(run: Union[str, Path]) -> Tuple[SBMTransformer, dict]:
    """The trained model of a run directory (from its last checkpoint) in
    eval mode, and the run's arguments."""
    path = Path(run) / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (not a training run?)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    args = argparse.Namespace(**state["args"])
    model = build_model(args)
    model.load_state_dict(state["model"])
    return model.eval(), state["args"]


def jsonable(args: argparse.Namespace) -> dict:
    """The arguments as JSON values (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def save_checkpoint(model, optimizer, step: int, rng: dict, world: int,
                    path: Path, rank: int, args: dict) -> None:
    """Writes the checkpoint atomically (rank 0; every rank takes part)."""
    # Every rank's RNG states go into the one checkpoint that rank 0 writes.
    states = [rng]
    if world > 1:
        states = [None] * world
        torch.distributed.all_gather_object(states, rng)
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                        step=step, rng=states, args=args), tmp)
        tmp.replace(path)
