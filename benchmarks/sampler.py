r"""The sampler suites: fastrg in both modes vs the dense Bernoulli
reference (edges per second), against a published-style batched fastRG,
exact vs poisson mode per distinct edge, and peak bytes per edge."""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from benchmarks.cases import CLUSTERS, HEADS, kaiming_sbm, sbm_memberships
from benchmarks.measure import MEMORY_BUDGET, cuda_peak, median_times, subprocess_peak
from sbm_pyg.sampling import bernoulli, fastrg


def sampler_case(spec: dict, device: torch.device):
    """The function of one fastrg memory case, ``spec["method"]`` being
    ``fastrg_poisson`` or ``fastrg_exact``."""
    q, b, k, ptr = sbm_memberships(spec["n"], spec["density"], device)
    gen = torch.Generator(device).manual_seed(0)
    mode = spec["method"].split("_", 1)[1]
    return lambda: fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)


def bench_sampler(sizes, densities, device, repeats, log,
                  batch_case=(32, 1024)) -> List[dict]:
    rows = []
    cases = [(n, 1, d) for n in sizes for d in densities]
    cases += [(batch_case[1], batch_case[0], d) for d in densities]
    for n, batch, density in cases:
        q, b, k, ptr = sbm_memberships(n, density, device, batch)
        gen = torch.Generator(device).manual_seed(0)
        kwargs = dict(ptr_q=ptr, ptr_k=ptr, generator=gen)
        fns = dict(fastrg_poisson=lambda: fastrg(q, b, k, **kwargs),
                   fastrg_exact=lambda: fastrg(q, b, k, mode="exact", **kwargs))
        # The dense reference holds [H, N, N] float64 probabilities.
        if 3 * HEADS * (batch * n) ** 2 * 8 <= MEMORY_BUDGET:
            fns["bernoulli"] = lambda: bernoulli(q, b, k, **kwargs)
        row = dict(n=n, batch=batch, density=density)
        for name, seconds in median_times(fns, device, repeats).items():
            edges = fns[name]().num_edges
            row[name] = dict(time=seconds, edges=edges,
                             edges_per_s=edges / seconds)
        if "bernoulli" in row:
            for name in ("fastrg_poisson", "fastrg_exact"):
                row[name]["speedup_vs_bernoulli"] = (row["bernoulli"]["time"]
                                                     / row[name]["time"])
        rows.append(row)
        log(format_sampler_row(row))
    return rows


def published_fastrg(q_memb: Tensor, block: Tensor, k_memb: Tensor, batch: int,
                     n: int, generator: torch.Generator) -> int:
    """Baseline written from the description of the published SBM-Transformer
    sampler: a Python loop over sequences x heads; per (sequence, head) a
    Poisson edge count, a multinomial over the k^2 cluster pairs, then the
    endpoints of all draws from a cluster by one padded ``torch.multinomial``
    (k rows, as many samples as the busiest cluster needs) and duplicates
    merged. Returns the number of distinct edges."""
    kc = block.size(-1)
    edges = 0
    for b in range(batch):
        for h in range(block.size(0)):
            X = q_memb[b * n:(b + 1) * n, h]
            Y = k_memb[b * n:(b + 1) * n, h]
            rate = X.sum(0)[:, None] * block[h] * Y.sum(0)[None, :]
            m = int(torch.poisson(rate.sum(), generator=generator))
            if m == 0:
                continue
            cell = torch.multinomial(rate.flatten(), m, replacement=True,
                                     generator=generator)
            ends = []
            for side, memb in ((cell // kc, X), (cell % kc, Y)):
                count = torch.bincount(side, minlength=kc)
                pad = torch.multinomial(memb.t(), int(count.max()),
                                        replacement=True, generator=generator)
                order = torch.argsort(side, stable=True)
                start = torch.cumsum(count, 0) - count
                rank = torch.empty_like(order)
                rank[order] = torch.arange(m) - start[side[order]]
                ends.append(pad[side, rank])
            edges += torch.unique(ends[0] * n + ends[1]).numel()
    return edges


def bench_published(device, repeats, log, batch=8, n=1024) -> dict:
    """fastrg against the published-style batched sampler on the same random
    kaiming-initialized SBM, in turns."""
    q, b, k, ptr = kaiming_sbm(batch, n, device)
    gen = torch.Generator(device).manual_seed(0)
    fns = dict(fastrg=lambda: fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, generator=gen),
               published=lambda: published_fastrg(q, b, k, batch, n, gen))
    times = median_times(fns, device, repeats)
    result = dict(batch=batch, n=n, heads=HEADS, clusters=CLUSTERS,
                  edges=fns["fastrg"]().num_edges,
                  published_edges=fns["published"](),
                  fastrg_time=times["fastrg"], published_time=times["published"])
    result["speedup"] = result["published_time"] / result["fastrg_time"]
    log(f"  B={batch} H={HEADS} n={n} k={CLUSTERS}: fastrg {times['fastrg'] * 1e3:.1f} ms "
        f"({result['edges']} edges), published-style {times['published'] * 1e3:.1f} ms "
        f"({result['published_edges']} edges): {result['speedup']:.1f}x")
    return result


def bench_exact_dense(n, density, device, repeats, log) -> dict:
    """Time per distinct edge of exact vs poisson mode on the same SBM at a
    high expected density, in turns."""
    q, b, k, ptr = sbm_memberships(n, density, device)
    gen = torch.Generator(device).manual_seed(0)
    fns = {mode: (lambda mode=mode: fastrg(q, b, k, mode=mode, generator=gen))
           for mode in ("poisson", "exact")}
    times = median_times(fns, device, repeats)
    result = dict(n=n, expected_density=density)
    for mode, fn in fns.items():
        edges = fn().num_edges
        result[mode] = dict(time=times[mode], edges=edges,
                            ns_per_edge=1e9 * times[mode] / edges)
    result["ratio"] = result["exact"]["ns_per_edge"] / result["poisson"]["ns_per_edge"]
    log(f"  n={n} expected density {density}: poisson {result['poisson']['ns_per_edge']:.1f} "
        f"ns/edge ({result['poisson']['edges']} edges), exact "
        f"{result['exact']['ns_per_edge']:.1f} ns/edge ({result['exact']['edges']} edges): "
        f"exact/poisson {result['ratio']:.2f}")
    return result


def sampler_memory(n: int, density: float, mode: str, device: torch.device,
                   threads: int) -> dict:
    """Peak bytes of one fastrg call per distinct edge, output included
    (subprocess resident set on Linux CPU, max_memory_allocated on CUDA)."""
    spec = dict(method=f"fastrg_{mode}", n=n, density=density, threads=threads)
    if device.type == "cuda":
        fn = sampler_case(spec, device)
        edges = fn().num_edges
        peak = cuda_peak(fn, device)
    else:
        peak, edges = map(int, subprocess_peak(spec).split())
    return dict(n=n, density=density, mode=mode, peak=peak, edges=edges,
                bytes_per_edge=peak / max(edges, 1))


def format_sampler_row(row: dict) -> str:
    parts = []
    for name in ("fastrg_poisson", "fastrg_exact", "bernoulli"):
        if name in row:
            r = row[name]
            extra = (f" ({r['speedup_vs_bernoulli']:.1f}x vs dense)"
                     if "speedup_vs_bernoulli" in r else "")
            parts.append(f"{name} {r['time'] * 1e3:.1f} ms "
                         f"{r['edges_per_s'] / 1e6:.2f} M edges/s{extra}")
    return (f"  n={row['n']:>6} batch={row['batch']:>3} density={row['density']:<6} "
            + "; ".join(parts))
