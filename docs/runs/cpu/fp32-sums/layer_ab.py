"""The calibrated SBMConv (n = 4096, fwd+bwd) with the cluster masses of
the code before the float32 sums (one index_add in the memberships' dtype,
no autocast guard around the expected densities' product: in float32 the
code before the change) and with this change's, alternated call by call
in one process: median ms of 12 each."""
import contextlib
import time

import torch

from benchmarks.cases import calibrated_conv
from sbm_pyg.nn import block_model as bm

torch.set_num_threads(2)


def old_masses(seq, G, memb):
    return memb.new_zeros(G, *memb.shape[1:]).index_add(0, seq, memb)


versions = {"old": (old_masses, lambda device: contextlib.nullcontext()),
            "new": (bm._masses, bm.full_precision)}
dev = torch.device("cpu")
for density in (0.05, 0.01):
    conv = calibrated_conv(64, density, dev)
    x = torch.randn(4096, 64)
    res = {"old": [], "new": []}
    for _ in range(12):
        for name, (masses, precision) in versions.items():
            bm._masses, bm.full_precision = masses, precision
            t = time.perf_counter()
            conv(x).sum().backward()
            res[name].append(time.perf_counter() - t)
    print(density, {k: round(sorted(v)[len(v) // 2] * 1e3, 1) for k, v in res.items()},
          "ms median fwd+bwd", flush=True)
