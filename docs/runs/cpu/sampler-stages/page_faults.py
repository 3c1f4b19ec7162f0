"""The sampler at n = 16384, 5%, poisson (the stage profile's case): wall
time, system time and minor page faults a call (medians of 5 after a
warm-up), in this process as it is started. Run it twice, with and without
glibc's mmap turned off (`GLIBC_TUNABLES=glibc.malloc.mmap_max=0:
glibc.malloc.trim_threshold=<large>`), to see what the buffers' fresh pages
cost:

    PYTHONPATH=. OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-stages/page_faults.py LABEL
"""
import json
import resource
import statistics
import sys
import time

import torch

from benchmarks.cases import sbm_memberships
from sbm_pyg.sampling import fastrg

q, b, k, ptr = sbm_memberships(16384, 0.05, torch.device("cpu"))
gen = torch.Generator().manual_seed(0)


def call():
    return fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, generator=gen)


call()
rows = []
for _ in range(5):
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    edges = call().num_edges
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    rows.append(dict(wall_ms=1e3 * wall, system_ms=1e3 * (after.ru_stime - before.ru_stime),
                     user_ms=1e3 * (after.ru_utime - before.ru_utime),
                     minor_faults=after.ru_minflt - before.ru_minflt, edges=edges))
print(json.dumps(dict(label=sys.argv[1], **{key: statistics.median(r[key] for r in rows)
                                            for key in rows[0]})))
