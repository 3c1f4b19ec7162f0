"""``python -m sbm_pyg plot DIR...``: loss, accuracy and density curves of
several runs in one PNG (and the selector's recall, where validation
measured it)."""
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

    records_of = {run: read_metrics(run) for run in runs}
    data = {run: [r for r in records if r.get("split") == "train"]
            for run, records in records_of.items()}
    # The selector's recall, measured by the validation passes.
    recall = {run: [r for r in records if r.get("split") == "val" and "recall" in r]
              for run, records in records_of.items()}
    panels = [("loss", "training loss"), ("accuracy", "training accuracy"),
              ("density", "sampled attention density")]
    # Runs that log their optimizer steps get a fourth panel: the gradient
    # norm, on a log scale, where an unstable step shows.
    if any("grad_norm" in r for records in data.values() for r in records):
        panels.append(("grad_norm", "gradient norm (before clipping)"))
    # Runs held to a density budget log the penalty the controller set.
    if any("lam" in r for records in data.values() for r in records):
        panels.append(("lam", "budget's λ (dashed: floor)"))
    if any(recall.values()):
        panels.append(("recall", "selector recall (val; dashed: oracle)"))
    fig = Figure(figsize=(4.3 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels))
    for run, records in data.items():
        for ax, (key, _) in zip(axes, panels):
            # The recall from the validation records, the rest from training's.
            kept = recall[run] if key == "recall" else [r for r in records if key in r]
            line, = ax.plot([r["step"] for r in kept], [r[key] for r in kept],
                            label=Path(run).name)
            if key == "lam":  # the budget's floor, dashed, where it has one
                floor = [r for r in kept if "lam_floor" in r]
                ax.plot([r["step"] for r in floor], [r["lam_floor"] for r in floor],
                        linestyle="--", color=line.get_color())
            if key == "recall":  # beside the oracle's at the same edge count
                ax.plot([r["step"] for r in kept], [r["oracle_recall"] for r in kept],
                        linestyle="--", color=line.get_color())
    for ax, (key, title) in zip(axes, panels):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if key in ("grad_norm", "lam"):
            ax.set_yscale("log")
    for ax, (key, _) in zip(axes, panels):
        if key in ("density", "recall"):
            ax.set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
