r"""The layer on one large graph: a fresh ``SBMConv(64, 32, heads=2,
init_density=degree / n)`` (training mode, its default exploration), one
forward and backward on n nodes of unit features, each size in a fresh
process: the time of the second call (the first warms the allocator), the
process's peak resident memory, and the sampled density against the one
it was started at; the log-log slope of time and memory against n.

    python -m benchmarks.large --sizes 10000 100000 1000000 --degree 32 \
        --out docs/runs/large/layer-scaling.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from benchmarks.measure import loglog_slope

__all__ = ["one_size", "main"]


def one_size(n: int, degree: float, threads: int, seed: int = 0) -> dict:
    """One size, in this process (see the module's text)."""
    from sbm_pyg.nn import SBMConv
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rho = min(degree / n, 0.5)
    conv = SBMConv(64, 32, heads=2, init_density=rho)
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    times = []
    for _ in range(2):
        conv.zero_grad(set_to_none=True)
        start = time.perf_counter()
        conv(x, generator=g).square().mean().backward()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return dict(n=n, init_density=rho, exploration=conv.exploration,
                expected_density=conv.expected_density.detach().tolist(),
                sampled_density=conv.sampled_density.tolist(),
                first_s=times[0], time_s=times[1], peak_bytes=peak,
                backends=conv.last_backends)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--degree", type=float, default=32.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:  # the child process of one size
        row = one_size(args.one, args.degree, args.threads)
        print(json.dumps(row))
        return row
    rows: List[dict] = []
    for n in args.sizes:
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.large", "--one", str(n), "--degree",
             str(args.degree), "--threads", str(args.threads), "--out", "-"],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
        if child.returncode != 0:
            rows.append(dict(n=n, error=child.stderr.strip().splitlines()[-1:]))
            print(f"n={n}: failed: {rows[-1]['error']}", flush=True)
            continue
        row = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(row)
        sampled = sum(row["sampled_density"]) / len(row["sampled_density"])
        print(f"n={n}: {row['time_s']:.2f} s fwd+bwd (first call "
              f"{row['first_s']:.2f} s), peak {row['peak_bytes'] / 2**30:.2f} GiB, "
              f"sampled density {sampled:.3g} = {sampled / row['init_density']:.2f}x "
              f"the start {row['init_density']:.3g} (exploration "
              f"{row['exploration']:.2g})", flush=True)
    done = [r for r in rows if "error" not in r]
    result = dict(command="python -m benchmarks.large " + " ".join(
        sys.argv[1:] if argv is None else argv), degree=args.degree,
        threads=args.threads, torch=torch.__version__, machine=platform.machine(),
        cpu_count=os.cpu_count(), rows=rows)
    if len(done) > 1:
        ns = [r["n"] for r in done]
        result["time_slope"] = loglog_slope(ns, [r["time_s"] for r in done])
        result["memory_slope"] = loglog_slope(ns, [r["peak_bytes"] for r in done])
        print(f"log-log slopes against n: time {result['time_slope']:.2f}, "
              f"peak memory {result['memory_slope']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
