"""Prints the before/after table of docs/performance.md ("The whole layer,
part by part") from before-layer.json and bench-cpu.json:
``python docs/runs/cpu/layer-cost/table.py``."""
import json
from pathlib import Path

HERE = Path(__file__).parent


def rows(name):
    return {(r["n"], round(r["sampled_density"], 2)): r
            for r in json.loads((HERE / name).read_text())["layer"]}


def ms(t):
    return f"{t * 1e3:.1f}" if t < 1 else f"{t * 1e3:.0f}"


before, after = rows("before-layer.json"), rows("bench-cpu.json")
print("| n | density | before: SBMConv, ratio | after: SBMConv, ratio | after: "
      "sampler / attention fwd + bwd / products / glue (ms) | before: "
      "sampler / bwd / products / glue + fwd |")
print("|---|---|---|---|---|---|")
for key in sorted(after, key=lambda k: (k[0], k[1])):
    a, b = after[key], before[key]
    pa, pb = a["breakdown"], b["breakdown"]
    print(f"| {key[0]} | {key[1]:.0%} | {ms(b['sbmconv_time'])} ms, "
          f"{b['ratio']:.2f}× | {ms(a['sbmconv_time'])} ms, {a['ratio']:.2f}× | "
          f"{ms(pa['sampler'])} / {ms(pa['attention_forward'])} + "
          f"{ms(pa['attention_backward'])} / {ms(pa['products'])} / "
          f"{ms(pa['glue'])} | {ms(pb['sampler'])} / "
          f"{ms(pb['attention_backward'])} / {ms(pb['products'])} / "
          f"{ms(pb['glue'] + pb['attention_forward'])} |")

# The README's training-step table.
print()
print("| n | full attention | SBM 1% | SBM 5% | SBM 20% | SBM 50% | SBM 100% |")
print("|---|---|---|---|---|---|---|")
for row in json.loads((HERE / "bench-cpu.json").read_text())["training"]:
    full = row["full"]
    cells = [f"{full['time'] * 1e3:.1f} ms, {full['memory'] / 2**20:.1f} MiB"]
    for d in ("0.01", "0.05", "0.2", "0.5", "1.0"):
        c = row[f"sbm@{d}"]
        cell = (f"{c['time_vs_full']:.2f}× ({c['attention']}), "
                f"{c['memory_vs_full']:.1f}× mem")
        sparse = row.get(f"sbm-sparse@{d}")
        if sparse is not None and c["attention"] == "dense":
            cell += (f"; sparse {sparse['time_vs_full']:.2f}×, "
                     f"{sparse['memory_vs_full']:.1f}× mem")
        cells.append(cell)
    print(f"| {row['n']} | " + " | ".join(cells) + " |")
