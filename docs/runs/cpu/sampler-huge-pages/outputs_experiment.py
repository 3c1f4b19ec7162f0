"""Which of the sampler's buffers gain from huge pages: arms in turns within
one process. It needs a temporary build in which advise_huge_pages returns
early where the environment variable names its buffer (SBM_NO_HUGE_TAB: the
key tables and the column sort's scratch; SBM_NO_HUGE_OUT: the outputs col,
perm and row_t, allocated with at::empty and then advised); the committed
kernel has no such switch and advises the first group only. Each arm's name
says which buffers keep huge pages. Output: median/min ms of each arm.

    PYTHONPATH=. OMP_NUM_THREADS=2 python outputs_experiment.py 0.05 poisson 6
"""
import os
import statistics
import sys
import time

import torch

from benchmarks.cases import sbm_memberships
from sbm_pyg.sampling import fastrg

torch.set_num_threads(2)
SWITCHES = ("SBM_NO_HUGE_OUT", "SBM_NO_HUGE_TAB")
ARMS = {"both-huge": (), "tables-huge": ("SBM_NO_HUGE_OUT",),
        "out-huge": ("SBM_NO_HUGE_TAB",), "small": SWITCHES}
density, mode, reps = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
q, b, k, ptr = sbm_memberships(16384, density, torch.device("cpu"))
gen = torch.Generator().manual_seed(0)


def call():
    return fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)


call()
times = {arm: [] for arm in ARMS}
for _ in range(reps):
    for arm, off in ARMS.items():
        for name in SWITCHES:
            os.environ.pop(name, None)
        os.environ.update({name: "1" for name in off})
        start = time.perf_counter()
        call()
        times[arm].append(time.perf_counter() - start)
print(f"{density:.0%} {mode}: " + "  ".join(
    f"{arm} {1e3 * statistics.median(t):.0f}/{1e3 * min(t):.0f}" for arm, t in times.items()),
    flush=True)
