"""The training step's peak memory split into what grows with the edges
and what grows with the tokens: the LRA model's step (2 layers, 2 heads of
32, k = 128, batch 1; benchmarks.training) measured in a fresh process per
case (peak resident set beyond the process's start), at n = 2048 and 4096
and three sparse-regime densities, then fitted as

    peak = a * edges + b * n + c

by least squares (edges summed over layers and heads). Run from the
repository root, with nothing else running:

    PYTHONPATH=. python docs/runs/cpu/layer-cost/memory_fit.py
"""
import json
import sys

import torch

from benchmarks.cases import HEADS
from benchmarks.measure import MEMORY
from benchmarks.training import LAYERS, step_memory, training_step

SIZES, DENSITIES = (2048, 4096), (0.01, 0.05, 0.2)


def main() -> None:
    torch.set_num_threads(2)
    MEMORY["method"] = "subprocess"
    cpu = torch.device("cpu")
    rows = []
    for n in SIZES:
        full = step_memory("full", n, 1.0, cpu, 2)
        for density in DENSITIES:
            sampled = training_step("sbm", n, density, cpu)()["density"]
            edges = sampled * LAYERS * HEADS * n * n
            peak = step_memory("sbm", n, density, cpu, 2)
            rows.append(dict(n=n, density=density, sampled=sampled, edges=edges,
                             peak=peak, full=full))
            print(f"n={n} density {sampled:.4f}: {edges / 1e6:.2f} M edges, "
                  f"peak {peak / 2**20:.1f} MiB (full attention {full / 2**20:.1f} MiB)",
                  flush=True)
    A = torch.tensor([[r["edges"], r["n"], 1.0] for r in rows], dtype=torch.float64)
    y = torch.tensor([float(r["peak"]) for r in rows], dtype=torch.float64)
    a, b, c = torch.linalg.lstsq(A, y[:, None]).solution.flatten().tolist()
    fit = (A @ torch.tensor([a, b, c], dtype=torch.float64)).tolist()
    for r, f in zip(rows, fit):
        r["fit"] = f
    print(f"fit: {a:.1f} bytes per edge, {b / 1024:.1f} KiB per token, "
          f"{c / 2**20:.1f} MiB fixed; worst residual "
          f"{max(abs(r['peak'] - r['fit']) for r in rows) / 2**20:.1f} MiB")
    json.dump(dict(rows=rows, bytes_per_edge=a, bytes_per_token=b, fixed=c),
              sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
