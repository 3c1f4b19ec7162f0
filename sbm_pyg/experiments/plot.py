"""``python -m sbm_pyg plot DIR...``: loss, accuracy and density curves of
several runs in one PNG."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence


def read_metrics(run: Path) -> List[dict]:
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (not a training run?)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_runs(runs: Sequence[Path], out: Path) -> Path:
    # A Figure of its own, not pyplot's: saving needs no GUI, and the caller's
    # backend (a notebook's inline one) is left as it is.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.6))
    axes = fig.subplots(1, 3)
    for run in runs:
        records = [r for r in read_metrics(run) if r.get("split") == "train"]
        steps = [r["step"] for r in records]
        for ax, key in zip(axes, ("loss", "accuracy", "density")):
            ax.plot(steps, [r[key] for r in records], label=Path(run).name)
    for ax, title in zip(axes, ("training loss", "training accuracy",
                                "sampled attention density")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[2].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
