"""The sampler with and without PyTorch's transparent huge
pages for large CPU allocations (THP_MEM_ALLOC_ENABLE=1; the kernel's THP
setting here is "madvise"): each configuration in its own process, the two
alternating round by round, 2 threads, nothing else running.

    python docs/runs/cpu/huge-pages/measure.py > docs/runs/cpu/huge-pages/results.json

One process (``--child``) times fastrg at n = 16384, H = 2, k = 128 (1% and
5%, both modes; benchmarks.cases.sbm_memberships), reporting the median of 5
calls after a warm-up (distinct edges per second) and the process's user and
system CPU seconds over the whole run.
"""
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = 3
ROOT = Path(__file__).resolve().parents[4]


def child() -> None:
    import torch

    from benchmarks.cases import sbm_memberships
    from sbm_pyg.sampling import fastrg

    torch.set_num_threads(2)
    out = {}
    for density in (0.01, 0.05):
        q, b, k, ptr = sbm_memberships(16384, density, torch.device("cpu"))
        for mode in ("poisson", "exact"):
            gen = torch.Generator().manual_seed(0)
            fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)
            times, edges = [], 0
            for _ in range(5):
                start = time.perf_counter()
                graph = fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)
                times.append(time.perf_counter() - start)
                edges = graph.num_edges
            seconds = sorted(times)[2]
            out[f"fastrg-16384-{density}-{mode}"] = dict(ms=1e3 * seconds, edges=edges,
                                                        edges_per_s=edges / seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["user_s"], out["system_s"] = usage.ru_utime, usage.ru_stime
    print(json.dumps(out))


def main() -> None:
    runs = {"default": [], "thp": []}
    for _ in range(ROUNDS):
        for name in runs:
            env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
            env.pop("THP_MEM_ALLOC_ENABLE", None)
            if name == "thp":
                env["THP_MEM_ALLOC_ENABLE"] = "1"
            done = subprocess.run([sys.executable, __file__, "--child"], env=env,
                                  capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps(dict(rounds=ROUNDS, runs=runs), indent=1))


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
