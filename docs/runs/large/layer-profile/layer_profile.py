"""Where one fwd+bwd of the large-graph layer spends its time, by operator,
at each size: benchmarks.large's layer (a fresh SBMConv(64, 32, heads=2,
init_density=32 / n), training mode, n nodes, one graph), its second call
under torch.profiler, each size in a fresh process.

    python docs/runs/large/layer-profile/layer_profile.py --sizes 10000 100000 1000000 \
        --out docs/runs/large/layer-profile/profile.json

Also the unprofiled call's minor page faults and user and system time
(getrusage), and GLIBC_TUNABLES as it was set.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch


def one(n: int, degree: float, threads: int) -> dict:
    from sbm_pyg.nn import SBMConv
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    conv = SBMConv(64, 32, heads=2, init_density=min(degree / n, 0.5))
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)

    def call():
        conv.zero_grad(set_to_none=True)
        conv(x, generator=g).square().mean().backward()

    call()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    call()
    plain = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    ops = {}
    for e in prof.key_averages():
        ops[e.key] = dict(self_ms=e.self_cpu_time_total / 1e3, count=e.count)
    total = sum(o["self_ms"] for o in ops.values())
    return dict(n=n, time_s=plain, minor_faults=after.ru_minflt - before.ru_minflt,
                system_s=after.ru_stime - before.ru_stime,
                user_s=after.ru_utime - before.ru_utime,
                peak_bytes=after.ru_maxrss * 1024, profiled_self_ms=total,
                edges=float(conv.sampled_density.sum()) * n * n, ops=ops)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--degree", type=float, default=32.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--one", type=int)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.degree, a.threads)))
        return
    rows = []
    for n in a.sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--degree",
                              str(a.degree), "--threads", str(a.threads)],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        top = sorted(row["ops"].items(), key=lambda kv: -kv[1]["self_ms"])[:12]
        print(f"n={n}: {row['time_s']:.2f} s unprofiled ({row['user_s']:.2f} s user, "
              f"{row['system_s']:.2f} s system, {row['minor_faults']} minor faults), "
              f"{row['profiled_self_ms']:.0f} ms self time profiled, "
              f"{row['edges']:.3g} edges", flush=True)
        for k, v in top:
            print(f"   {v['self_ms']:10.1f} ms  x{v['count']:<4} {k}", flush=True)
    a.out.write_text(json.dumps(dict(command=" ".join(["python"] + sys.argv),
                                     glibc_tunables=os.environ.get("GLIBC_TUNABLES"),
                                     degree=a.degree, threads=a.threads,
                                     torch=torch.__version__, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
