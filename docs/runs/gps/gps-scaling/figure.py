"""The GPS scaling figure and table of docs/gps.md: ``python
docs/runs/gps/gps-scaling/figure.py`` reads ``results.json`` (written by
``python -m benchmarks.gps_scaling --json docs/runs/gps/gps-scaling/results.json``)
and writes ``docs/figures/gps-scaling.png`` (step time and peak memory
against nodes per graph, log-log) and prints a Markdown table. For the SBM
variants the table adds the sampled attention edges (the sampled density
times n^2, over every head and layer) and the peak memory beyond
Performer's (the same model with an attention linear in n) per sampled
edge, which stays flat where the SBM's memory is linear in edges."""
import json
import re
from pathlib import Path

from matplotlib.figure import Figure

from sbm_pyg.experiments.gps import GPS_PRESETS

HERE = Path(__file__).resolve().parent
FIGURE = HERE.parents[2] / "figures" / "gps-scaling.png"
PRESET = GPS_PRESETS["graphgps-cpu"]
STYLE = {"multihead": ("tab:blue", "o"), "multihead-nodrop": ("tab:cyan", "s"),
         "performer": ("tab:green", "^"), "sbm": ("tab:orange", "v"),
         "sbm-1%": ("tab:red", "D")}


def short(status: str) -> str:
    """A failed case's status in a few words."""
    m = re.search(r"tried to allocate (\d+) bytes", status)
    if m:
        return f"out of memory (an allocation of {int(m[1]) / 2**30:.0f} GiB)"
    m = re.search(r"drew (\d+) edges .*more than max_edges", status)
    if m:
        return f"over max_edges ({int(m[1]):,} edges in a layer)"
    m = re.search(r"drew (\d+) edges .*needs about (\S+) GiB but only (\S+) GiB", status)
    if m:
        return (f"memory guard ({int(m[1]):,} edges in a layer need {m[2]} GiB, "
                f"{m[3]} GiB left)")
    return status


def main() -> None:
    result = json.loads((HERE / "results.json").read_text())
    rows = result["rows"]
    sizes = sorted({r["n"] for r in rows})
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for variant, (color, marker) in STYLE.items():
        ok = [r for r in rows if r["variant"] == variant and "step_s" in r]
        if not ok:
            continue
        n = [r["n"] for r in ok]
        axes[0].plot(n, [r["step_s"] for r in ok], color=color, marker=marker,
                     label=variant)
        axes[1].plot(n, [r["peak_memory_bytes"] / 2**30 for r in ok], color=color,
                     marker=marker, label=variant)
    for ax, label in zip(axes, ("seconds per training step", "peak memory of a step (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [f"{n // 1024}k" for n in sizes])
        ax.set_xlabel("nodes per graph (one graph per step)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"GPS CPU preset, one training step, {result['threads']} CPU threads; "
                 "missing points: out of memory or time (table)", fontsize=10)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)

    print("| nodes | variant | step (s) | peak memory (MiB) | SBM density | "
          "sampled edges (all heads and layers) | bytes beyond Performer's per edge |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['n']:,} | {r['variant']} | — | — | — | — | {short(r['status'])} |")
            continue
        step = f"{r['step_s']:.3f}" if "step_s" in r else "—"
        mib = f"{r['peak_memory_bytes'] / 2**20:,.0f}"
        if r.get("density") is None:
            print(f"| {r['n']:,} | {r['variant']} | {step} | {mib} | — | — | — |")
            continue
        base = next(b["peak_memory_bytes"] for b in rows
                    if b["n"] == r["n"] and b["variant"] == "performer")
        edges = r["density"] * r["n"] ** 2 * PRESET["heads"] * PRESET["num_layers"]
        print(f"| {r['n']:,} | {r['variant']} | {step} | {mib} | {r['density']:.4f} | "
              f"{edges:,.0f} | {(r['peak_memory_bytes'] - base) / edges:.1f} |")


if __name__ == "__main__":
    main()
