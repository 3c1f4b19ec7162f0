r"""A training run on disk: the model its arguments build, its checkpoint
(model, optimizer, step, every rank's random state, arguments), and the
trained model loaded back."""
from __future__ import annotations

import argparse
import ctypes
import pickle
import shutil
from pathlib import Path
from typing import Optional, Tuple, Union

import torch

from sbm_pyg.experiments.tasks import VOCAB
from sbm_pyg.experiments.text import BYTE_CLASSES
from sbm_pyg.models import SBMTransformer

__all__ = ["build_model", "load_run", "save_checkpoint", "load_checkpoint",
           "jsonable", "PeakMemory"]


def build_model(args) -> SBMTransformer:
    """The model a run trains, from its arguments (token and sequence heads
    for both tasks; the vocabulary and length follow from the task)."""
    token_classes = 1
    if args.task == "listops":
        num_tokens, max_len = len(VOCAB), args.seq_len - 1
    elif args.task == "mqar":
        num_tokens = token_classes = args.vocab_size
        max_len = args.seq_len
    elif args.task == "mlm":  # the bytes, and the mask token
        num_tokens, token_classes, max_len = BYTE_CLASSES + 1, BYTE_CLASSES, args.seq_len
    else:
        num_tokens, max_len = args.seq_len + 1, args.seq_len
    # getattr: runs saved before these options lack them.
    return SBMTransformer(
        num_tokens, max_len,
        channels=args.channels, num_layers=args.num_layers,
        heads=args.heads, attention=args.attention,
        num_clusters=args.num_clusters,
        token_classes=token_classes, seq_classes=10, dropout=args.dropout,
        attn_dropout=getattr(args, "attn_dropout", 0.0),
        short_conv=getattr(args, "short_conv", 0),
        bigbird_density=getattr(args, "bigbird_density", 0.05),
        **(dict(exploration=args.exploration, mode=args.mode,
                ste=None if args.ste == "none" else args.ste, sbm_init=args.sbm_init,
                init_density=getattr(args, "init_density", None),
                sbm_parametrization=getattr(args, "sbm_parametrization",
                                            "paper"),
                distill=getattr(args, "distill", 0.0),
                distill_edges=getattr(args, "distill_edges", 0.0),
                distill_recall=getattr(args, "distill_recall", 0.0),
                sink=getattr(args, "sink", False),
                capacity=getattr(args, "capacity", None))
           if args.attention == "sbm" else {}),
    )


def load_run(run: Union[str, Path]) -> Tuple[SBMTransformer, dict]:
    """The trained model of a run directory (from its last checkpoint) or
    of a checkpoint file, in eval mode, and the run's arguments."""
    path = Path(run) if Path(run).is_file() else Path(run) / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (not a training run?)")
    state = load_checkpoint(path)
    args = argparse.Namespace(**state["args"])
    model = build_model(args)
    model.load_state_dict(state["model"])
    return model.eval(), state["args"]


def jsonable(args: argparse.Namespace) -> dict:
    """The arguments as JSON values (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def save_checkpoint(model, optimizer, schedule, step: int, rng: dict,
                    world: int, path: Path, rank: int, args: dict,
                    keep: int = 0, budget: Optional[dict] = None) -> None:
    """Writes the checkpoint atomically (rank 0; every rank takes part):
    tensors and plain values only, which :func:`load_checkpoint` reads
    without running code. With :obj:`keep` > 0 a copy named
    ``checkpoint-STEP.pt`` is kept beside it, the last :obj:`keep` of them;
    :obj:`budget` is a :class:`~sbm_pyg.nn.DensityBudget`'s state."""
    # Every rank's RNG states go into the one checkpoint that rank 0 writes.
    states = [rng]
    if world > 1:
        states = [None] * world
        torch.distributed.all_gather_object(states, rng)
    if rank != 0:
        return
    tmp = path.with_suffix(".tmp")
    torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                    schedule=schedule.state_dict(), step=step, rng=states,
                    args=args, **({} if budget is None else dict(budget=budget))),
               tmp)
    if keep > 0:
        shutil.copyfile(tmp, path.with_name(f"checkpoint-{step}.pt"))
        kept = sorted(path.parent.glob("checkpoint-*.pt"),
                      key=lambda p: int(p.stem.split("-")[1]))
        for old in kept[:-keep]:
            old.unlink()
    tmp.replace(path)


#: What a checkpoint must hold; ``schedule`` is optional (older checkpoints lack it).
CHECKPOINT_KEYS = {"model", "optimizer", "step", "rng", "args"}


def load_checkpoint(path: Union[str, Path],
                    map_location: Union[str, torch.device] = "cpu") -> dict:
    """A checkpoint written by :func:`save_checkpoint`, read with
    ``torch.load(weights_only=True)``: tensors, numbers, strings and
    containers of them, never code. Raises :class:`ValueError` for a file
    whose pickle asks for anything else (a crafted or foreign file), or
    that lacks a checkpoint's entries."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path} is not a checkpoint of sbm_pyg: its pickle asks for more "
            f"than tensors and plain values, so it was not loaded (nothing in "
            f"it was run). {str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or not CHECKPOINT_KEYS <= set(state):
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path} is not a checkpoint of sbm_pyg: it holds "
                         f"{found}, not {sorted(CHECKPOINT_KEYS)}")
    return state


class PeakMemory:
    """Peak memory over a stretch of a run (:meth:`start` to :meth:`read`)
    beyond what was held at its start (model, optimizer, datasets): the CUDA
    allocator's, or on Linux the process's resident set (VmHWM, reset at
    the start; freed heap returned first), as
    ``benchmarks.measure.peak_rss``; :obj:`None` where neither is read."""

    def __init__(self, device: torch.device):
        self.device, self.base = device, 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = self._status("VmRSS:")
        except OSError:
            self.base = -1

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise OSError(key)

    def read(self) -> Optional[int]:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.base
        if self.base < 0:
            return None
        return max(self._status("VmHWM:") - self.base, 0)
