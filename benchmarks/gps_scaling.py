r"""Where sparse global attention pays: one training step of the GPS CPU
preset's model (``python -m sbm_pyg gps --preset graphgps-cpu``: width 32,
4 layers, 4 heads, GatedGCN, attention dropout 0.5) on one PATTERN-like
graph of 1k to 65k nodes, for each global attention, in turns:
``python -m benchmarks.gps_scaling``.

The graphs follow PATTERN's recipe scaled up: 5 communities and a planted
pattern of about :math:`n / 6` nodes each, with every edge probability
(:math:`p = 0.5`, :math:`q = 0.35`, pattern 0.5, pattern-base 0.5) divided
by :math:`n / 117`, so that the expected degree stays near PATTERN's
(about 50). They are sampled block by block (a binomial count of pairs,
then that many pairs, deduplicated), as the dense recipe cannot be at
these sizes. One graph per step. The Laplacian PE's input is random
eigenvectors of the right shape (the eigendecomposition is preprocessing,
not part of a step).

Variants: ``multihead`` (PyTorch's attention on the padded batch, with the
preset's attention dropout 0.5), ``multihead-nodrop`` (dropout 0: PyTorch's
fused kernel), ``performer``, ``sbm`` (the preset's SBM as initialised) and
``sbm-1%`` (the SBM of a model trained at 1k nodes with
:class:`~sbm_pyg.nn.DensityBudget` held at 1%, its weights used at every
size; its measured density is reported: the expected density held at
1%, and in a training step the exploration on top, a tenth of the budget
as in a budgeted run). Each variant's
peak memory is
measured first in a fresh process with an address-space limit and a time
limit; a variant that runs out of either is reported so and left out of
the timing, which then takes the rest in turns in one process.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch_geometric.data import Data

from benchmarks.measure import median_times, peak_rss, pin_mmap_threshold

VARIANTS = ("multihead", "multihead-nodrop", "performer", "sbm", "sbm-1%")
ROOT = Path(__file__).resolve().parents[1]
# The defaults, shared with ``make bench``'s ``gps`` section.
SIZES = (1024, 4096, 16384, 65536)
MEMORY_LIMIT_GIB = 20.0
TIMEOUT_S = 600.0
WEIGHTS = ROOT / "docs" / "runs" / "gps" / "gps-scaling" / "sbm-1pct.pt"


def scaled_pattern_graph(n: int, generator: torch.Generator) -> Data:
    """A PATTERN-like graph of about :obj:`n` nodes (see the module's
    docstring): ``x`` one-hot features (3), ``y`` pattern membership."""
    f = n / 117.0
    sizes = [max(1, round(n / 6))] * 5
    n_pat = n - sum(sizes)
    comm = torch.cat([torch.full((s,), c) for c, s in enumerate(sizes)]
                     + [torch.full((n_pat,), 5)])
    starts = [0]
    for s in sizes + [n_pat]:
        starts.append(starts[-1] + s)
    rows, cols = [], []
    for a in range(6):
        for b in range(a, 6):
            # Within a community or the pattern, and pattern-base: 0.5;
            # between communities 0.35.
            p = (0.5 if a == b or b == 5 else 0.35) / f
            na, nb = starts[a + 1] - starts[a], starts[b + 1] - starts[b]
            pairs = na * nb if a != b else na * (na - 1) // 2
            m = int(torch.binomial(torch.tensor(float(pairs)), torch.tensor(p),
                                   generator=generator))
            i = torch.randint(starts[a], starts[a + 1], (m,), generator=generator)
            j = torch.randint(starts[b], starts[b + 1], (m,), generator=generator)
            keep = i != j
            rows.append(i[keep])
            cols.append(j[keep])
    i, j = torch.cat(rows), torch.cat(cols)
    edges = torch.stack([torch.cat([i, j]), torch.cat([j, i])])
    edges = torch.unique(edges[0] * n + edges[1])
    edge_index = torch.stack([edges // n, edges % n])
    feat = torch.randint(0, 3, (n,), generator=generator)
    return Data(x=torch.nn.functional.one_hot(feat, 3).float(), edge_index=edge_index,
                y=(comm == 5).long(), num_nodes=n)


def _model(variant: str):
    from sbm_pyg.experiments.arguments import default_exploration
    from sbm_pyg.experiments.gps import GPS_PRESETS
    from sbm_pyg.models import GPSNodeClassifier
    cfg = GPS_PRESETS["graphgps-cpu"]
    attention = variant.split("-")[0]
    # The budgeted variant explores as a budgeted run does: a tenth of its
    # 1% (sbm_pyg.experiments.arguments.default_exploration).
    sbm_kwargs = dict(num_clusters=32, max_edges=2**31 - 1,
                      exploration=default_exploration(
                          0.01 if variant == "sbm-1%" else None))
    torch.manual_seed(0)
    return GPSNodeClassifier(
        3, 2, channels=cfg["channels"], num_layers=cfg["num_layers"],
        heads=cfg["heads"], attention=attention, dropout=cfg["dropout"],
        attn_dropout=0.0 if variant == "multihead-nodrop" else cfg["attn_dropout"],
        **(sbm_kwargs if attention == "sbm" else {}))


def budget_weights(path: Path, steps: int = 400) -> Path:
    """Trains the preset's SBM model on 1k-node graphs with the density held
    at 1% (:class:`~sbm_pyg.nn.DensityBudget`, warm-up over the first
    third of the steps) and saves its weights to :obj:`path`."""
    from sbm_pyg.experiments.gps_metrics import weighted_cross_entropy
    from sbm_pyg.nn import DensityBudget
    if path.exists():
        return path
    model = _model("sbm")
    budget = DensityBudget(model, 0.01, warmup=steps // 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=1e-5)
    g = torch.Generator().manual_seed(1)
    graphs = [scaled_pattern_graph(1024, g) for _ in range(8)]
    for step in range(steps):
        data = graphs[step % len(graphs)]
        logits = _forward(model, data, g)
        loss = weighted_cross_entropy(logits, data.y) + budget.penalty()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        budget.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def _forward(model, data: Data, generator: torch.Generator):
    n = data.num_nodes
    g = torch.Generator().manual_seed(n)  # the PE input: random, fixed
    eigvecs = torch.randn(n, 16, generator=g)
    eigvals = torch.rand(n, 16, generator=g).expand(n, 16)
    return model(data.x, data.edge_index, torch.zeros(n, dtype=torch.long),
                 eigvecs, eigvals, generator=generator)


def _setup(variant: str, n: int, weights: Optional[str]):
    from sbm_pyg.experiments.gps_metrics import weighted_cross_entropy
    data = scaled_pattern_graph(n, torch.Generator().manual_seed(n))
    model = _model(variant)
    if variant == "sbm-1%":
        model.load_state_dict(torch.load(weights, weights_only=True))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    g = torch.Generator().manual_seed(0)
    density: List[float] = []

    def step() -> None:
        logits = _forward(model, data, g)
        loss = weighted_cross_entropy(logits, data.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        d = model.densities()
        if d is not None:
            density.append(float(d.mean()))

    return step, density, data


def memory_case(spec: dict) -> dict:
    """In a fresh process: the peak resident memory of one step beyond what
    the graph and model hold, and the step's time and SBM density."""
    pin_mmap_threshold()
    limit = int(spec["memory_limit"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.set_num_threads(spec["threads"])
    step, density, data = _setup(spec["variant"], spec["n"], spec.get("weights"))
    step()  # warm-up
    start = time.perf_counter()
    peak = peak_rss(step)
    return dict(peak_memory_bytes=peak, first_step_s=time.perf_counter() - start,
                density=density[-1] if density else None,
                edges=int(data.edge_index.size(1)))


def _run_memory_case(spec: dict, timeout: float) -> dict:
    try:
        res = subprocess.run(
            [sys.executable, "-m", "benchmarks.gps_scaling", "--memory-case",
             json.dumps(spec)], capture_output=True, text=True, cwd=ROOT,
            timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(status=f"over the time limit ({timeout:.0f} s for a "
                           f"warm-up and a step)")
    if res.returncode != 0:
        err = res.stderr.strip().splitlines()
        last = err[-1] if err else f"exit code {res.returncode}"
        memory = any(s in res.stderr for s in ("MemoryError", "allocate",
                                              "out of memory", "max_edges"))
        return dict(status=("out of memory" if memory else "failed") + f": {last[:200]}")
    return dict(status="ok", **json.loads(res.stdout.strip().splitlines()[-1]))


def bench_gps_scaling(sizes, variants, repeats: int, threads: int,
                      memory_limit: int, timeout: float, weights: Path,
                      log) -> List[dict]:
    """Per size: each variant's memory in a fresh process, then the
    variants that ran timed in turns (median of :obj:`repeats` steps)."""
    torch.set_num_threads(threads)
    if "sbm-1%" in variants:
        budget_weights(weights)
    rows = []
    for n in sizes:
        cases: Dict[str, dict] = {}
        for variant in variants:
            spec = dict(variant=variant, n=n, threads=threads,
                        memory_limit=memory_limit, weights=str(weights))
            cases[variant] = _run_memory_case(spec, timeout)
            log(f"  n={n:6d} {variant:17s} {cases[variant]}")
        runnable = [v for v in variants if cases[v]["status"] == "ok"]
        steps = {v: _setup(v, n, str(weights))[0] for v in runnable}
        times = median_times(steps, torch.device("cpu"), repeats) if steps else {}
        for variant in variants:
            row = dict(n=n, variant=variant, **cases[variant])
            if variant in times:
                row.update(step_s=times[variant], repeats=repeats)
            rows.append(row)
            log(f"  n={n:6d} {variant:17s} step {row.get('step_s', float('nan')):.3f} s")
        del steps
    return rows


def main(argv=None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=list(SIZES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        choices=VARIANTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-limit-gib", type=float, default=MEMORY_LIMIT_GIB,
                        help="address-space limit of each memory case")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds for a memory case (warm-up and a step)")
    parser.add_argument("--weights", type=Path,
                        default=WEIGHTS)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_case:
        print(json.dumps(memory_case(json.loads(args.memory_case))))
        return []
    rows: List[dict] = []
    for n in args.sizes:  # the JSON written after every size: the large ones take long
        rows += bench_gps_scaling([n], args.variants, args.repeats, args.threads,
                                  int(args.memory_limit_gib * 2**30), args.timeout,
                                  args.weights, lambda s: print(s, flush=True))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(dict(threads=args.threads, rows=rows),
                                            indent=1))
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
