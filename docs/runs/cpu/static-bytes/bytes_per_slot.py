"""Peak bytes a slot of fastrg_static's buffers takes with each backend,
the graph included: each case in a fresh process, one call whose draws
nearly fill the capacity (expected draws 90% of it, n = 16384: every
row sampled sparsely), the growth of the process's peak resident memory
(ru_maxrss) over the call, per slot; the
"cpp" backend's key tables (H k N_k 12 bytes) counted apart.

    python docs/runs/cpu/static-bytes/bytes_per_slot.py \
        --out docs/runs/cpu/static-bytes/results.json
"""
import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch


def one(backend: str, mode: str, slots: int, n: int, k: int) -> dict:
    from sbm_pyg.sampling import expected_draws, fastrg_static
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    H = 2
    q = torch.rand(n, H, k, generator=g)
    kk = torch.rand(n, H, k, generator=g)
    b = torch.rand(H, k, k, generator=g)
    ptr = torch.tensor([0, n])
    # The draws' mean brought to 90% of the capacity by rescaling the block
    # (a few rounds: the mean is not linear in it where rows turn dense or
    # exact mode's inflation moves).
    for _ in range(30):
        mean = float(expected_draws(q, b, kk, ptr, ptr, mode=mode, backend=backend))
        if abs(mean / (0.9 * slots) - 1) < 1e-3:
            break
        b = b * (0.9 * slots / mean)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res = fastrg_static(q, b, kk, ptr, ptr, capacity=slots, seed=torch.tensor(1),
                        mode=mode, backend=backend)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tables = H * k * n * 12 if backend == "cpp" else 0
    return dict(backend=backend, mode=mode, slots=slots, n=n, k=k, expected_draws=mean,
                overflow=bool(res.overflow), edges=int(res.edges.sum()),
                growth_bytes=peak - before, tables_bytes=tables,
                bytes_per_slot=(peak - before - tables) / slots)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--slots", type=int, default=4 * 2**20)
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--out", type=Path)
    p.add_argument("--one", nargs=2)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.slots, a.n, a.k)))
        return
    rows = []
    for backend in ("cpp", "torch"):
        for mode in ("poisson", "exact"):
            out = subprocess.run([sys.executable, __file__, "--one", backend, mode,
                                  "--slots", str(a.slots), "--n", str(a.n), "--k", str(a.k)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{backend:5s} {mode:7s}: {row['bytes_per_slot']:.1f} B a slot "
                  f"({row['growth_bytes'] / 2**20:.0f} MiB over the call, tables "
                  f"{row['tables_bytes'] / 2**20:.1f} MiB, {row['edges']} edges, "
                  f"overflow {row['overflow']})", flush=True)
    a.out.write_text(json.dumps(dict(command=" ".join(["python"] + sys.argv), rows=rows),
                                indent=1) + "\n")


if __name__ == "__main__":
    main()
