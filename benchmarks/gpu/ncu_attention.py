r"""One sparse attention case, forward+backward, for a profiler: run as
``ncu -k regex:_kernel python -m benchmarks.gpu.ncu_attention`` to read each
Triton kernel's time, L2 and HBM traffic (``docs/performance.md``).

Arguments: n, heads, dim, density, dtype (defaults 16384 2 32 0.01
bfloat16); three calls, the first one warms up."""
from __future__ import annotations

import sys

import torch

from benchmarks.cuda import attention_inputs, grad, mask_keys
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.sampling import SampledGraph


def main(argv=None) -> None:
    args = (argv if argv is not None else sys.argv[1:]) + [None] * 5
    n, heads, dim = (int(a) if a else d for a, d in zip(args[:3], (16384, 2, 32)))
    density = float(args[3]) if args[3] else 0.01
    dtype = getattr(torch, args[4] or "bfloat16")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graph = SampledGraph.from_keys(mask_keys(n, heads, density, device), heads, n, n)
    graph.csr.row_t()
    q, k, v = attention_inputs(n, heads, dim, dtype, device)
    for _ in range(3):
        grad(sparse_attention(q, k, v, graph), (q, k, v))
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"n={n} H={heads} D={dim} density={density} {dtype}: {graph.num_edges} edges")


if __name__ == "__main__":
    main()
