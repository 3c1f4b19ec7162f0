"""The calibrated SBMConv (n = 4096, fwd+bwd) with the expected densities
of the code before the float32 sums and with this change's, alternated
call by call in one process: median ms of 12 each."""
import time

import torch

from benchmarks.cases import calibrated_conv
from sbm_pyg.nn import _regimes, _sbm_attention
from sbm_pyg.nn import block_model as bm
from sbm_pyg.ops.csr import row_index

torch.set_num_threads(2)


def old_masses(seq, G, memb):
    return memb.new_zeros(G, *memb.shape[1:]).index_add(0, seq, memb)


def old_expected(ptr_q, ptr_k, q_memb, block, k_memb):
    pairs = (ptr_q.diff() * ptr_k.diff()).to(q_memb.dtype)
    G, Nq, Nk = ptr_q.numel() - 1, q_memb.size(0), k_memb.size(0)
    seq_q = row_index(ptr_q, Nq)
    seq_k = seq_q if ptr_k is ptr_q and Nk == Nq else row_index(ptr_k, Nk)
    expected = torch.einsum("ghu,huv,ghv->gh", old_masses(seq_q, G, q_memb), block,
                            old_masses(seq_k, G, k_memb))
    return expected / pairs.clamp(min=1)[:, None]


new_expected = bm.expected_densities


def use(f):
    for m in (bm, _regimes, _sbm_attention):
        m.expected_densities = f


dev = torch.device("cpu")
for density in (0.05, 0.01):
    conv = calibrated_conv(64, density, dev)
    x = torch.randn(4096, 64)
    res = {"old": [], "new": []}
    for _ in range(12):
        for name, f in (("old", old_expected), ("new", new_expected)):
            use(f)
            t = time.perf_counter()
            conv(x).sum().backward()
            res[name].append(time.perf_counter() - t)
    print(density, {k: round(sorted(v)[len(v) // 2] * 1e3, 1) for k, v in res.items()},
          "ms median fwd+bwd", flush=True)
