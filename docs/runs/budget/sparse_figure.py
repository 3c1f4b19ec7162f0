"""The figure and table of "Sparse and right" (docs/experiments.md): test
accuracy against the test density and against the step time, every model,
on the repeated-token task (N = 64) and MQAR (N = 256), from the runs'
final.json and metrics.jsonl.

    python docs/runs/budget/sparse_figure.py

writes docs/figures/sparse.png and docs/runs/budget/sparse.json.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = {
    "repeat, N = 64": sorted(HERE.glob("repeat64-budget-0.05")) + sorted(
        HERE.glob("repeat64-*distill-*")) + sorted(HERE.glob("repeat64-lam-0")),
    "MQAR, N = 256": sorted(p for p in (HERE.parent / "mqar256").iterdir() if p.is_dir()),
}


def summary(run: Path) -> dict:
    final = json.loads((run / "final.json").read_text())
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r.get("split") == "train"]
    # Seconds per step: the median over logged intervals (runs shared the
    # cores with others, so this is a rough figure, not a benchmark).
    steps = [(b["seconds"] - a["seconds"]) / (b["step"] - a["step"])
             for a, b in zip(train, train[1:]) if b["step"] > a["step"]]
    # named as before the runs moved into study folders: the budget runs by
    # their names, the MQAR runs under mqar256/
    name = run.relative_to(HERE if run.is_relative_to(HERE) else HERE.parent)
    return dict(run=str(name), accuracy=final["accuracy"],
                density=final.get("density", 1.0),
                seconds_per_step=statistics.median(steps) if steps else None,
                steps=final["steps"])


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    table = {task: [summary(r) for r in runs if (r / "final.json").exists()]
             for task, runs in TASKS.items()}
    (HERE / "sparse.json").write_text(json.dumps(table, indent=1))
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for row, (task, runs) in enumerate(table.items()):
        for col, key in enumerate(("density", "seconds_per_step")):
            ax = axes[row][col]
            for r in runs:
                ax.scatter(r[key], 100 * r["accuracy"])
                ax.annotate(r["run"].split("/")[-1], (r[key], 100 * r["accuracy"]),
                            fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel("test density" if key == "density"
                          else "seconds per training step (shared cores)")
            ax.set_ylabel("test accuracy (%)")
            ax.set_title(task)
    fig.tight_layout()
    out = HERE.parents[1] / "figures" / "sparse.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
