"""The accuracy-against-budget figure of docs/experiments.md: ``python
docs/runs/budget/budget_figure.py`` reads the runs ``docs/runs/budget/{repeat64,listops}-
{budget-RHO,lam-LAMBDA}`` and writes ``docs/figures/budget.png`` and
``docs/runs/budget/budget.json`` (per run: test accuracy, test density, and the mean
expected training density over the last 20% of steps with its ratio to the
budget)."""
import json
from pathlib import Path

from matplotlib.figure import Figure

RUNS = Path(__file__).parent
TASKS = {"repeat64": "repeated tokens, N = 64, 800 steps",
         "listops": "ListOps, CPU scale, 1500 steps"}


def summary(run: Path) -> dict:
    final = json.loads((run / "final.json").read_text())
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if line.strip() and json.loads(line)["split"] == "train"]
    steps = final["steps"]
    tail = [r["expected_density"] for r in train if r["step"] > 0.8 * steps]
    args = final["args"]
    row = dict(run=run.name, target=args.get("target_density"), lam=args["lam"],
               test_accuracy=final["accuracy"], test_density=final["density"],
               tail_expected_density=sum(tail) / len(tail),
               tail_min=min(tail), tail_max=max(tail),
               lam_max=max((r.get("lam", 0.0) for r in train), default=0.0),
               lam_floor_max=max((r.get("lam_floor", 0.0) for r in train), default=0.0))
    if row["target"] is not None:
        row["tail_ratio"] = row["tail_expected_density"] / row["target"]
    return row


def main() -> None:
    rows = {task: [summary(run) for run in sorted(RUNS.glob(f"{task}-budget-*"))
                   + sorted(RUNS.glob(f"{task}-lam-*"))
                   if (run / "final.json").exists()] for task in TASKS}
    (RUNS / "budget.json").write_text(json.dumps(rows, indent=1))
    fig = Figure(figsize=(11, 7.6))
    axes = fig.subplots(2, 2)
    for col, (task, title) in enumerate(TASKS.items()):
        budget = [r for r in rows[task] if r["target"] is not None]
        sweep = [r for r in rows[task] if r["target"] is None]
        ax = axes[0, col]
        ax.scatter([r["test_density"] for r in budget],
                   [100 * r["test_accuracy"] for r in budget], label="budget ρ")
        for r in budget:
            ax.annotate(f"ρ={r['target']}", (r["test_density"], 100 * r["test_accuracy"]),
                        fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.scatter([max(r["test_density"], 1e-6) for r in sweep],
                   [100 * r["test_accuracy"] for r in sweep], marker="s",
                   label="fixed λ")
        for r in sweep:
            ax.annotate(f"λ={r['lam']:g}", (max(r["test_density"], 1e-6),
                                           100 * r["test_accuracy"]),
                        fontsize=8, xytext=(3, -9), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("test density")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1, col]
        targets = [r["target"] for r in budget]
        ax.errorbar(targets, [r["tail_expected_density"] for r in budget],
                    yerr=[[r["tail_expected_density"] - r["tail_min"] for r in budget],
                          [r["tail_max"] - r["tail_expected_density"] for r in budget]],
                    fmt="o", capsize=3, label="last 20% of steps: mean (range)")
        ax.scatter(targets, [r["test_density"] for r in budget], marker="x",
                   label="test density")
        line = [0.03, 0.35]
        ax.plot(line, line, color="gray", linewidth=0.8)
        ax.fill_between(line, [0.9 * v for v in line], [1.1 * v for v in line],
                        color="gray", alpha=0.15, label="ρ ± 10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_ticks(sorted(set(targets)), [f"{t:g}" for t in sorted(set(targets))])
            axis.set_ticks([], minor=True)
        ax.set_xlabel("budget ρ (--target-density)")
        ax.set_ylabel("expected density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = RUNS.parents[1] / "figures" / "budget.png"
    fig.savefig(out, dpi=110)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
