"""One sequence's cluster masses (H = 2, k = 128), fwd+bwd: the code before
the float32 sums (one index_add in the memberships' dtype) and this
change's (pieces of 256 rows, float32), in turns: median ms of 30."""
import time

import torch

from sbm_pyg.nn import block_model as bm

torch.manual_seed(0)


def old(seq, G, memb):
    return memb.new_zeros(G, *memb.shape[1:]).index_add(0, seq, memb)


new = bm._masses
for N in (4096, 16384):
    memb = torch.rand(N, 2, 128, requires_grad=True)
    seq = torch.zeros(N, dtype=torch.long)
    res = {"old": [], "new": []}
    for _ in range(30):
        for name, f in (("old", old), ("new", new)):
            t = time.perf_counter()
            f(seq, 1, memb).sum().backward()
            res[name].append(time.perf_counter() - t)
    print(N, {k: round(sorted(v)[len(v) // 2] * 1e3, 3) for k, v in res.items()},
          "ms median fwd+bwd")
