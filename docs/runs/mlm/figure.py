"""Masked bytes: bits per masked byte on the held-out files against the
test density, one point a model, from each finished run's final.json
(a stopped run's holds no test result).

    python docs/runs/mlm/figure.py

writes docs/figures/mlm.png and docs/runs/mlm/summary.json.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ("full", "sbm-0.05", "bigbird-0.05", "random-0.05")


def summary(run: Path) -> dict:
    final = json.loads((run / "final.json").read_text())
    return dict(run=run.name, bits_per_byte=final["bits_per_byte"],
                accuracy=final["accuracy"], density=final.get("density", 1.0),
                density_per_layer_head=final.get("density_per_layer_head"),
                steps=final["steps"], seconds=final["seconds"])


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    finals = {name: HERE / name / "final.json" for name in RUNS}
    runs = [summary(HERE / name) for name, path in finals.items()
            if path.exists() and not json.loads(path.read_text()).get("stopped")]
    (HERE / "summary.json").write_text(json.dumps(runs, indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for r in runs:
        ax.scatter(r["density"], r["bits_per_byte"])
        ax.annotate(r["run"], (r["density"], r["bits_per_byte"]), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlim(0.02, 2.5)
    ax.set_xlabel("test density (fraction of query-key pairs attended)")
    ax.set_ylabel("bits per masked byte (held-out files)")
    ax.set_title("Masked bytes, N = 1024, 2 layers, 1500 steps")
    fig.tight_layout()
    out = HERE.parents[1] / "figures" / "mlm.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
