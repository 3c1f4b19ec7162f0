r"""The scaling suite: time and memory of ``sparse_attention`` and ``fastrg``
against the number of edges m at fixed n, with log-log slopes."""
from __future__ import annotations

import math

import torch

from benchmarks.attention import peak_memory, run_sbm
from benchmarks.cases import HEADS, fixed_graph, qkv
from benchmarks.measure import loglog_slope, median_time
from sbm_pyg.sampling import fastrg


def bench_scaling(n, densities, device, repeats, threads, log) -> dict:
    """Time and peak memory against m at fixed n. The empty graph (m = 0)
    gives the fixed O(N H D) part that any attention pays (inputs, outputs,
    gradients); slopes are reported for the raw values and for the part
    above it."""
    q, k, v = qkv(n, device)
    points = []
    for density in [0.0] + list(densities):
        graph = fixed_graph(n, density, device)
        fn = lambda: run_sbm(q, k, v, graph)  # noqa: E731
        memb = torch.full((n, HEADS, 1), math.sqrt(density), device=device)
        ones = torch.ones(HEADS, 1, 1, device=device)
        gen = torch.Generator(device).manual_seed(0)
        sample = lambda: fastrg(memb, ones, memb, generator=gen)  # noqa: E731
        points.append(dict(density=density, edges=graph.num_edges,
                           attention_time=median_time(fn, device, repeats),
                           attention_memory=peak_memory("sbm", n, density, device, threads),
                           sampler_time=median_time(sample, device, repeats)))
        log(f"  m={graph.num_edges:>10}  attention {points[-1]['attention_time'] * 1e3:8.1f} ms "
            f"{points[-1]['attention_memory'] / 2**20:8.1f} MiB   fastrg "
            f"{points[-1]['sampler_time'] * 1e3:8.1f} ms")
    empty, points = points[0], points[1:]
    m = [p["edges"] for p in points]
    result = dict(n=n, empty=empty, points=points)
    for key in ("attention_time", "attention_memory", "sampler_time"):
        values = [p[key] for p in points]
        result[f"slope_{key}"] = loglog_slope(m, values)
        above = [value - empty[key] for value in values]
        result[f"slope_{key}_above_empty"] = (loglog_slope(m, above)
                                              if min(above) > 0 else None)
    log(f"  log-log slopes over m = {m[0]}..{m[-1]} ({m[-1] / m[0]:.0f}x), raw / "
        f"above the empty graph: " + ", ".join(
            f"{key} {result[f'slope_{key}']:.3f} / "
            + (f"{result[f'slope_{key}_above_empty']:.3f}"
               if result[f"slope_{key}_above_empty"] is not None else "n/a")
            for key in ("attention_time", "attention_memory", "sampler_time")))
    return result
