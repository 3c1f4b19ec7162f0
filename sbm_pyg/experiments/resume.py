r"""What ``--resume`` takes from a run's checkpoint, and what it may
change."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["RESUMABLE", "LEGACY_OPTIMIZER", "resolve_resume"]

#: The optimizer settings of a run checkpointed before they were options.
LEGACY_OPTIMIZER = dict(optimizer="adam", weight_decay=0.0, clip_grad_norm=0.0,
                        schedule="constant", warmup_steps=0)

# Settings a resumed run may change: how far it runs, where, and what it
# logs. Any other setting is the checkpoint's.
RESUMABLE = {"steps", "out", "resume", "device", "log_every", "eval_every",
             "checkpoint_every", "eval_batches", "no_progress",
             "diagnose_every", "data_dir", "preset", "keep_checkpoints"}


def _given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set:
    # The destinations of the options written on the command line.
    return {action.dest for action in parser._actions
            for option in action.option_strings
            if any(t == option or t.startswith(option + "=") for t in argv)}


def resolve_resume(parser: argparse.ArgumentParser, args,
                   argv: Sequence[str], resumable: Optional[set] = None) -> None:
    """With --resume the checkpoint's settings hold: those not given on the
    command line are taken from it, and one given with another value is
    refused (a new learning rate would not reach the restored optimizer, a
    new model size would not load). :obj:`resumable`: the settings a
    resumed run may change (default: :obj:`RESUMABLE`, the train command's)."""
    from sbm_pyg.experiments.runs import load_checkpoint
    try:
        saved = load_checkpoint(args.out / "checkpoint.pt")["args"]
    except ValueError as e:
        parser.error(f"--resume: {e}")
    saved = {**LEGACY_OPTIMIZER, **saved}
    given, differ = _given(parser, argv), []
    for key, value in saved.items():
        if key in (RESUMABLE if resumable is None else resumable) or not hasattr(args, key):
            continue
        current = getattr(args, key)
        shown = str(current) if isinstance(current, Path) else current
        if key not in given:
            setattr(args, key, Path(value) if isinstance(current, Path) else value)
        elif shown != value:
            differ.append(f"--{key.replace('_', '-')} {shown} (the run has "
                          f"{value})")
    if differ:
        parser.error("--resume continues a run with its own settings, and "
                     "these differ from them: " + "; ".join(differ) +
                     ". Start a new run in another --out to change them")
