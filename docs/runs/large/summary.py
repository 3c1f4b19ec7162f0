"""The large-graph comparison's tables: each model's test accuracy (mean and
sample standard deviation over the seeds run), seconds per epoch and peak
memory, from the runs' final.json in each folder under docs/runs/large/lfr-*
that holds runs (lfr-1e4-features/mu0.7-noise3 too).

    python docs/runs/large/summary.py

writes summary.json in each of those folders and prints a Markdown table
for each.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("gnn", "gps-sbm", "gps-performer", "gps-bigbird", "sgformer", "sgformer-gnn",
          "sgformer-sbm", "polynormer")


def main() -> None:
    folders = {run.parent.parent for run in HERE.glob("lfr-*/**/final.json")}
    for folder in sorted(folders):
        print(f"\n{folder.relative_to(HERE)}\n")
        summarise(folder)


def summarise(folder: Path) -> None:
    table = {}
    for model in MODELS:
        # "-s<seed>": sgformer's runs, not sgformer-sbm's.
        runs = [json.loads(p.read_text())
                for p in sorted(folder.glob(f"{model}-s[0-9]*/final.json"))]
        if not runs:
            continue
        accuracy = [100 * r["accuracy"] for r in runs]
        table[model] = dict(
            seeds=[r["args"]["seed"] for r in runs], accuracy=accuracy,
            accuracy_mean=statistics.mean(accuracy),
            accuracy_std=statistics.stdev(accuracy) if len(runs) > 1 else None,
            seconds_per_epoch=[r["seconds_per_epoch"] for r in runs],
            peak_gib=[r["peak_memory_bytes"] / 2**30 for r in runs],
            best_epoch=[r["best_epoch"] for r in runs],
            # The SBM heads' sampled density at the end (runs that log it).
            density=[r.get("density") for r in runs])
    if not table:  # runs of other names (e.g. budget-gains/): nothing to sum
        print("(no MODEL-sSEED runs)")
        return
    (folder / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
    print("| model | seeds | test accuracy (%) | s / epoch | peak (GiB) |")
    print("|---|---|---|---|---|")
    for model, row in table.items():
        std = "" if row["accuracy_std"] is None else f" ± {row['accuracy_std']:.2f}"
        print(f"| {model} | {len(row['seeds'])} | {row['accuracy_mean']:.2f}{std} | "
              f"{statistics.median(row['seconds_per_epoch']):.2f} | "
              f"{max(row['peak_gib']):.2f} |")


if __name__ == "__main__":
    main()
