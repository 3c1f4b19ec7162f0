"""The calibrated SBMConv (fwd+bwd) with Q̂Ŝ as one product per head (the
code before) and in chunks of ROW_CHUNK rows (this change), alternated
call by call in one process: median ms of 12 each, 2 threads.

    python docs/runs/cpu/row-chunks-qs/layer_ab.py > docs/runs/cpu/row-chunks-qs/layer_ab.log
"""
import time

import torch

from benchmarks.cases import calibrated_conv
from sbm_pyg.nn import functional as F

torch.set_num_threads(2)


def one_product(q_memb, block):
    return torch.bmm(q_memb.transpose(0, 1), block).reshape(-1, block.size(-1))


versions = {"one product": one_product, "row chunks": F._query_block}
dev = torch.device("cpu")
for n, density in ((4096, 0.05), (4096, 0.01), (16384, 0.01)):
    conv = calibrated_conv(64, density, dev)
    x = torch.randn(n, 64)
    res = {name: [] for name in versions}
    for _ in range(12):
        for name, query_block in versions.items():
            F._query_block = query_block
            t = time.perf_counter()
            conv(x).sum().backward()
            res[name].append(time.perf_counter() - t)
    print(n, density, {k: round(sorted(v)[len(v) // 2] * 1e3, 1) for k, v in res.items()},
          "ms median fwd+bwd", flush=True)
