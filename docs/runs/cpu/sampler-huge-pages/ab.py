"""The C++ sampler before and after its scratch buffers asked for huge pages.

Two checkouts, each with its compiled kernels built in place
(`python setup.py build_ext --inplace`): BEFORE at the commit before the
change, AFTER at or past it. Their processes alternate, ROUNDS times; each
process times fastrg at n = 16384, H = 2, k = 128 (the sampler benchmark's
random sigmoid memberships scaled to the density), 1% and 5%, poisson and
exact, on 2 threads: the median of 5 calls after a warm-up, with the minor
page faults a call.

    git worktree add /tmp/before <commit before> && (cd /tmp/before && \
        python setup.py build_ext --inplace)
    OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-huge-pages/ab.py \
        --before /tmp/before --after . --out docs/runs/cpu/sampler-huge-pages/results.json

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
for density in (0.01, 0.05):
    q, b, k, ptr = sbm_memberships(16384, density, torch.device("cpu"))
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
        rows.append(dict(density=density, mode=mode, ms=1e3 * statistics.median(times),
                         edges=graph.num_edges, faults=faults))
print(json.dumps(rows))
"""


def run(root: Path) -> list:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        for arm in ("before", "after"):
            rows = run(getattr(args, arm).resolve())
            runs[arm].append(rows)
            print(f"round {r} {arm}: " + ", ".join(
                f"{x['density']:.0%} {x['mode']} {x['ms']:.1f} ms ({x['faults']:.0f} faults)"
                for x in rows), flush=True)
    summary = []
    for i, row in enumerate(runs["after"][0]):
        before = statistics.median(rr[i]["ms"] for rr in runs["before"])
        after = statistics.median(rr[i]["ms"] for rr in runs["after"])
        summary.append(dict(density=row["density"], mode=row["mode"], edges=row["edges"],
                            before_ms=before, after_ms=after, ratio=after / before,
                            before_m_edges_per_s=row["edges"] / before / 1e3,
                            after_m_edges_per_s=row["edges"] / after / 1e3))
        print(f"{row['density']:.0%} {row['mode']}: {before:.1f} -> {after:.1f} ms "
              f"({after / before:.3f}x), {row['edges'] / after / 1e3:.1f} M edges/s")
    args.out.write_text(json.dumps(dict(
        command=" ".join(["python"] + sys.argv), rounds=args.rounds, runs=runs,
        summary=summary), indent=1) + "\n")


if __name__ == "__main__":
    main()
