"""The C++ sampler in several checkouts, their processes in turns.

Each ARM is NAME=PATH, a checkout with its compiled kernels built in place
(`python setup.py build_ext --inplace`). Their processes alternate, ROUNDS
times; each process times fastrg at n = 16384 (or --n), H = 2, k = 128 (the sampler
benchmark's random sigmoid memberships scaled to the density), 1% and 5%,
poisson and exact, on 2 threads: the median of 5 calls after a warm-up,
with the minor page faults a call. With --memory, each arm's last round
also measures the benchmark's peak bytes per distinct edge
(`benchmarks.sampler.sampler_memory`: a fresh process's resident set).

    git worktree add /tmp/before <commit> && (cd /tmp/before && \
        python setup.py build_ext --inplace)
    OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-huge-pages/ab.py \
        --arm before=/tmp/before --arm after=. --memory --out results.json

Run with nothing else on the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, statistics, sys, time
import torch
from benchmarks.cases import sbm_memberships
from sbm_pyg.sampling import fastrg
torch.set_num_threads(2)
rows = []
n = int(sys.argv[2])
for density in (0.01, 0.05):
    q, b, k, ptr = sbm_memberships(n, density, torch.device("cpu"))
    for mode in ("poisson", "exact"):
        gen = torch.Generator().manual_seed(0)
        call = lambda: fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)
        graph = call()
        times = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            start = time.perf_counter()
            graph = call()
            times.append(time.perf_counter() - start)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 5
        row = dict(density=density, mode=mode, ms=1e3 * statistics.median(times),
                   edges=graph.num_edges, faults=faults)
        if sys.argv[1] == "memory":
            from benchmarks.sampler import sampler_memory
            row["bytes_per_edge"] = sampler_memory(n, density, mode,
                                                   torch.device("cpu"), 2)["bytes_per_edge"]
        rows.append(row)
print(json.dumps(rows))
"""


def run(root: Path, memory: bool, n: int) -> list:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", CHILD, "memory" if memory else "time", str(n)],
                         cwd=root, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    arms = dict(arm.split("=", 1) for arm in args.arm)
    runs = {name: [] for name in arms}
    for r in range(args.rounds):
        for name, root in arms.items():
            rows = run(Path(root).resolve(), args.memory and r == args.rounds - 1, args.n)
            runs[name].append(rows)
            print(f"round {r} {name}: " + ", ".join(
                f"{x['density']:.0%} {x['mode']} {x['ms']:.1f} ms ({x['faults']:.0f} faults)"
                for x in rows), flush=True)
    first = next(iter(arms))
    summary = []
    for i, row in enumerate(runs[first][0]):
        entry = dict(density=row["density"], mode=row["mode"], edges=row["edges"])
        for name in arms:
            ms = statistics.median(rr[i]["ms"] for rr in runs[name])
            entry[name] = dict(ms=ms, m_edges_per_s=row["edges"] / ms / 1e3,
                               ratio_to_first=ms / statistics.median(
                                   rr[i]["ms"] for rr in runs[first]),
                               faults=statistics.median(rr[i]["faults"] for rr in runs[name]))
            if "bytes_per_edge" in runs[name][-1][i]:
                entry[name]["bytes_per_edge"] = runs[name][-1][i]["bytes_per_edge"]
        summary.append(entry)
        print(f"{row['density']:.0%} {row['mode']}: " + ", ".join(
            f"{name} {entry[name]['ms']:.1f} ms ({entry[name]['ratio_to_first']:.3f}x, "
            f"{entry[name]['m_edges_per_s']:.1f} M/s)" for name in arms), flush=True)
    args.out.write_text(json.dumps(dict(
        command=" ".join(["python"] + sys.argv), arms=arms, rounds=args.rounds, runs=runs,
        summary=summary), indent=1) + "\n")


if __name__ == "__main__":
    main()
