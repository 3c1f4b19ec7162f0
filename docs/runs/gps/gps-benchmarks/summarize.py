"""Collects every run's final.json under this directory into results.json
(one object per run: dataset, attention, seed, epochs, test_accuracy (GraphGPS's
accuracy-SBM at the best validation epoch), best_epoch, val_metric,
seconds_per_epoch, peak_memory_bytes, and density for SBM) and prints a
Markdown table of the means over seeds."""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEYS = ("dataset", "attention", "seed", "epochs", "test_accuracy", "best_epoch",
        "val_metric", "seconds_per_epoch", "peak_memory_bytes", "density")

rows = []
for final in sorted(HERE.glob("*/final.json")):
    record = json.loads(final.read_text())
    rows.append({k: record[k] for k in KEYS if k in record} | {"run": final.parent.name})
(HERE / "results.json").write_text(json.dumps(rows, indent=1) + "\n")

print("| dataset | attention | seeds | test metric (%) | s / epoch | peak MiB | density |")
print("|---|---|---|---|---|---|---|")
groups = {}
for r in rows:
    groups.setdefault((r["dataset"], r["attention"]), []).append(r)
for (dataset, attention), rs in sorted(groups.items()):
    acc = [100 * r["test_accuracy"] for r in rs]
    shown = " / ".join(f"{a:.2f}" for a in acc)
    dens = [r["density"] for r in rs if "density" in r]
    print(f"| {dataset} | {attention} | {len(rs)} | {shown} | "
          f"{statistics.mean(r['seconds_per_epoch'] for r in rs):.1f} | "
          f"{max(r['peak_memory_bytes'] for r in rs) / 2**20:.0f} | "
          f"{statistics.mean(dens):.3f} |" if dens else
          f"| {dataset} | {attention} | {len(rs)} | {shown} | "
          f"{statistics.mean(r['seconds_per_epoch'] for r in rs):.1f} | "
          f"{max(r['peak_memory_bytes'] for r in rs) / 2**20:.0f} | — |")
