"""Where the C++ sampler's time goes, stage by stage, on the CPU.

For each case (n = 16384, H = 2, k = 128, the sampler benchmark's random
sigmoid memberships scaled to the density; 1% and 5%, poisson and exact):
the median time of a fastrg call (2 threads), its distinct edges and its
draws, then `perf record -e cpu-clock` attached to this process for a loop
of calls after the warm-up, and each stage's share of the samples, by the
symbol perf finds them in (the OpenMP regions of the kernel's passes).

    PYTHONPATH=. OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-stages/measure.py \
        --out docs/runs/cpu/sampler-stages/results.json

Run with nothing else on the machine (the shares and times move with the
caches another process shares).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.cases import sbm_memberships
from sbm_pyg.sampling import fastrg

# A symbol's stage: the first pattern it matches (perf's symbol names).
STAGES = (
    ("key masses", r"key_masses"),
    ("row degrees (plan)", r"plan_rows"),
    ("key tables", r"build_tables"),
    ("rows: draws and merge", r"sample_impl.*_omp_fn\.0|Sampler.*row|poisson"),
    ("CSR columns", r"sample_impl.*_omp_fn\.1"),
    ("column order (counting sort)", r"sample_impl.*_omp_fn\.2"),
    ("sampler, outside its regions", r"sample_impl|dot"),
    ("OpenMP (waiting at barriers)", r"libgomp"),
    ("kernel (page faults, zeroing)", r"^\[k\]"),
    ("memory (malloc, memset, memmove)", r"malloc|free|memset|memmove|memcpy"),
)


def stage_of(kind: str, dso: str, symbol: str) -> str:
    text = f"[{kind}] {symbol}" if kind == "k" else f"{dso} {symbol}"
    for name, pattern in STAGES:
        if re.search(pattern, text):
            return name
    return "other (torch, Python)"


def profile(fn, seconds: float) -> dict:
    # perf attached to this process for the loop only: no import or warm-up.
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000",
                                 "-p", str(os.getpid()), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        end, calls = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            fn()
            calls += 1
        perf.send_signal(signal.SIGINT)
        perf.wait()
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                                 "--sort", "dso,symbol", "--no-demangle"],
                                capture_output=True, text=True).stdout
    shares, symbols = {}, []
    for line in report.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$", line)
        if not m:
            continue
        share, dso, kind, symbol = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        stage = stage_of(kind, dso, symbol)
        shares[stage] = shares.get(stage, 0.0) + share
        if share >= 0.5:
            symbols.append(dict(share=share, dso=dso, kind=kind, symbol=symbol[:160],
                                stage=stage))
    return dict(calls=calls, shares={k: round(v, 2) for k, v in sorted(
        shares.items(), key=lambda kv: -kv[1])}, symbols=symbols)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.05])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for density in args.densities:
        q, b, k, ptr = sbm_memberships(args.n, density, torch.device("cpu"))
        for mode in ("poisson", "exact"):
            gen = torch.Generator().manual_seed(0)

            def call():
                return fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)

            graph = call()  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                graph = call()
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            row = dict(n=args.n, heads=q.size(1), clusters=q.size(2), density=density,
                       mode=mode, threads=torch.get_num_threads(), ms=1e3 * seconds,
                       edges=graph.num_edges, draws=int(graph.num_draws),
                       edges_per_s=graph.num_edges / seconds,
                       ns_per_edge=1e9 * seconds / graph.num_edges,
                       profile=profile(call, args.profile_seconds))
            rows.append(row)
            print(f"{density:.0%} {mode}: {row['ms']:.1f} ms, {row['edges']} edges "
                  f"({row['edges_per_s'] / 1e6:.1f} M/s), {row['draws']} draws; "
                  f"{row['profile']['shares']}", flush=True)
    args.out.write_text(json.dumps(dict(command="PYTHONPATH=. OMP_NUM_THREADS=2 python "
                                        "docs/runs/cpu/sampler-stages/measure.py --out "
                                        + str(args.out), torch=torch.__version__,
                                        cpu=os.cpu_count(), rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
