r"""Benchmarks: SBM edge attention, fastRG and the SBMConv layer vs dense
attention. Run as ``python -m benchmarks.attention`` (or ``make bench``).

Every timing is the median of ``--repeats`` runs after one warm-up; the
timings that a target compares (sbm vs SDPA, the samplers, SBMConv vs
MultiheadAttention) take turns repeat by repeat, and every ratio is taken
against torch's ``scaled_dot_product_attention`` (SDPA) from the same run.
Peak memory is what one forward+backward allocates beyond its inputs: on CPU
(Linux) each case runs in a fresh subprocess and reads the kernel's peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``); on CUDA
``max_memory_allocated``.

Sections:

* ``attention``: forward+backward on one fixed sampled graph per (n, density):
  sbm_pyg ``sparse_attention``, SDPA, dense math attention (the path that
  materializes the n x n scores) and a PyG gather/scatter reference
  (TransformerConv-style message, ``torch_geometric.utils.softmax``,
  aggregation) on the same edges.
* ``sampler``: ``fastrg`` in both modes vs the dense Bernoulli reference, in
  edges per second.
* ``scaling``: time and memory of ``sparse_attention`` and ``fastrg`` against
  the number of edges m at fixed n, with log-log slopes.
* ``layer``: the whole ``SBMConv`` (projections, SBM, sampling, attention)
  at about 5% density vs ``torch.nn.MultiheadAttention`` of the same width.

``--quick`` runs tiny sizes in seconds (the test suite runs it so that the
script cannot rot; timings are never pass/fail in tests).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from torch_geometric.utils import softmax as pyg_softmax

from sbm_pyg import _fastrg_compiled
from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.sampling import SampledGraph, bernoulli, fastrg

HEADS, HEAD_DIM, CLUSTERS = 2, 32, 128
# Cases whose dense [E, D] or [n, n] buffers would exceed this are skipped.
MEMORY_BUDGET = 8 * 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_times(fns: Dict[str, Callable[[], object]], device: torch.device,
                 repeats: int) -> Dict[str, float]:
    """Median wall time in seconds of each function, after one warm-up call
    each. The functions take turns, repeat by repeat, so that a slow phase
    of a shared machine hits all of them alike."""
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def median_time(fn: Callable[[], object], device: torch.device,
                repeats: int) -> float:
    """Median wall time of ``fn`` in seconds, after one warm-up call."""
    return median_times({"fn": fn}, device, repeats)["fn"]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _profiler_peak(fn: Callable[[], object]) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def _case(method: str, n: int, density: float, device: torch.device):
    """The inputs and the function of one attention case."""
    q, k, v = qkv(n, device)
    graph = fixed_graph(n, density, device) if method in ("sbm", "pyg") else None
    return lambda: METHODS[method](q, k, v, graph)


def _memory_case(spec: dict) -> int:
    """Runs in a fresh process: peak resident set of one call beyond the
    resident set before it (``VmHWM`` reset through ``/proc/self/clear_refs``).
    glibc's mmap threshold is pinned at 64 KiB first, so that tensors are
    mapped and unmapped and the resident set follows the live tensors."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 2**10)  # M_MMAP_THRESHOLD
    torch.set_num_threads(spec["threads"])
    sampler = spec["method"].startswith("fastrg")
    fn = (_sampler_case(spec, torch.device("cpu")) if sampler else
          _case(spec["method"], spec["n"], spec["density"], torch.device("cpu")))
    out = fn()  # warm-up: lazily built state (the graph's row index) is not counted
    edges = out.num_edges if sampler else None
    del out
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS:")
    fn()
    peak = max(_status("VmHWM:") - base, 0)
    return f"{peak} {edges}" if sampler else peak


MEMORY = {"method": "subprocess"}  # main() sets "profiler" for --quick


def peak_memory(method: str, n: int, density: float, device: torch.device,
                threads: int) -> int:
    """Bytes one forward+backward of ``method`` allocates at its peak, beyond
    its inputs.

    CUDA: ``max_memory_allocated``, in process. CPU on Linux: each case in a
    fresh subprocess (see :func:`_memory_case`): in one long-lived process,
    heap fragmentation left by earlier cases made the same case read 166 or
    346 MiB. Elsewhere: the torch profiler's allocation records, which miss
    allocations made inside the sparse kernels.
    """
    if device.type == "cuda":
        fn = _case(method, n, density, device)
        fn()
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    if MEMORY["method"] == "subprocess" and os.path.exists("/proc/self/clear_refs"):
        spec = dict(method=method, n=n, density=density, threads=threads)
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.attention", "--memory-case",
             json.dumps(spec)], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parent.parent)
        return int(result.stdout.strip().splitlines()[-1])
    fn = _case(method, n, density, device)
    fn()
    return _profiler_peak(fn)


def fixed_graph(n: int, density: float, device: torch.device,
                seed: int = 0) -> SampledGraph:
    """Each pair of each head is an edge with probability ``density``
    (constant memberships, exact mode)."""
    memb = torch.full((n, HEADS, 1), math.sqrt(density), device=device)
    block = torch.ones(HEADS, 1, 1, device=device)
    return fastrg(memb, block, memb, mode="exact",
                  generator=torch.Generator(device).manual_seed(seed))


def sbm_memberships(n: int, density: float, device: torch.device,
                    batch: int = 1, seed: int = 0):
    """Random k=128 memberships scaled so that the expected density is
    ``density`` (rates scale with the square of the memberships)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(batch * n, HEADS, CLUSTERS, generator=g)
    k = torch.rand(batch * n, HEADS, CLUSTERS, generator=g)
    block = torch.softmax(torch.randn(HEADS, CLUSTERS * CLUSTERS, generator=g),
                          -1).view(HEADS, CLUSTERS, CLUSTERS)
    mass = torch.einsum("hu,huv,hv->h", q[:n].sum(0), block, k[:n].sum(0))
    scale = torch.sqrt(density * n * n / mass.mean())
    ptr = torch.arange(batch + 1) * n
    return ((q * scale).to(device), block.to(device), (k * scale).to(device),
            ptr.to(device))


def qkv(n: int, device: torch.device, seed: int = 1) -> List[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, HEADS, HEAD_DIM, generator=g).to(device).requires_grad_()
            for _ in range(3)]


def _backward(out: Tensor, tensors: Sequence[Tensor]) -> None:
    torch.autograd.grad(out.sum(), tensors)


def run_sbm(q, k, v, graph):
    _backward(sparse_attention(q, k, v, graph), (q, k, v))


def run_sdpa(q, k, v, graph=None):
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                         v.transpose(0, 1))
    _backward(out, (q, k, v))


def run_math(q, k, v, graph=None):
    # Materializes the [H, n, n] scores and weights.
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(HEAD_DIM)
    out = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)
    _backward(out, (q, k, v))


def run_pyg(q, k, v, graph):
    # TransformerConv-style gather -> PyG softmax -> scatter, on the same edges.
    H, n = graph.num_heads, graph.num_queries
    row = graph.head * n + graph.edge_index[1]
    col = graph.head * graph.num_keys + graph.edge_index[0]
    qf, kf, vf = (t.transpose(0, 1).reshape(H * t.size(0), -1) for t in (q, k, v))
    score = (qf[row] * kf[col]).sum(-1) / math.sqrt(HEAD_DIM)
    alpha = pyg_softmax(score, row, num_nodes=H * n)
    out = torch.zeros_like(qf).index_add_(0, row, vf[col] * alpha[:, None])
    _backward(out, (q, k, v))


METHODS = {"sbm": run_sbm, "sdpa": run_sdpa, "math": run_math, "pyg": run_pyg}


def _fits(method: str, n: int, edges: int) -> bool:
    if method == "pyg":  # a few [E, D] float32 buffers live at once
        return 6 * edges * HEAD_DIM * 4 <= MEMORY_BUDGET
    if method == "math":  # scores, weights and their gradients
        return 4 * HEADS * n * n * 4 <= MEMORY_BUDGET
    return True


def bench_attention(sizes, densities, device, repeats, threads, log) -> List[dict]:
    """sbm_pyg and SDPA are timed in turns on every row (the ratio that the
    targets use); dense math attention once per n; the PyG reference on its
    own."""
    rows = []
    for n in sizes:
        q, k, v = qkv(n, device)
        math_case = None
        if _fits("math", n, 0):
            fn = lambda: run_math(q, k, v)  # noqa: E731
            math_case = dict(time=median_time(fn, device, repeats),
                             memory=peak_memory("math", n, 0.0, device, threads))
        for density in densities:
            graph = fixed_graph(n, density, device)
            row = dict(n=n, density=density, edges=graph.num_edges)
            fns = dict(sbm=lambda: run_sbm(q, k, v, graph),
                       sdpa=lambda: run_sdpa(q, k, v))
            times = median_times(fns, device, repeats)
            for method in fns:
                row[method] = dict(time=times[method], memory=peak_memory(
                    method, n, density, device, threads))
            if _fits("pyg", n, graph.num_edges):
                fn = lambda: run_pyg(q, k, v, graph)  # noqa: E731
                row["pyg"] = dict(time=median_time(fn, device, repeats),
                                  memory=peak_memory("pyg", n, density, device, threads))
            if math_case is not None:
                row["math"] = dict(math_case)
                row["sbm"]["memory_vs_math"] = row["sbm"]["memory"] / math_case["memory"]
            for method in METHODS:
                if method in row:
                    row[method]["vs_sdpa"] = row[method]["time"] / row["sdpa"]["time"]
            row["sbm"]["bytes_per_edge"] = row["sbm"]["memory"] / max(graph.num_edges, 1)
            rows.append(row)
            log(format_attention_row(row))
            graph = None  # free it before the next one is sampled
    return rows


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


def kaiming_sbm(batch: int, n: int, device: torch.device, seed: int = 0):
    """A random SBM-Transformer head at initialization: memberships
    sigmoid(N(0, 1)) and the block softmax(C C^T) of kaiming-normal cluster
    embeddings C [k, D]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch * n, HEADS, CLUSTERS, generator=g).sigmoid()
    k = torch.randn(batch * n, HEADS, CLUSTERS, generator=g).sigmoid()
    C = torch.randn(HEADS, CLUSTERS, HEAD_DIM, generator=g) * math.sqrt(2 / HEAD_DIM)
    block = (C @ C.transpose(1, 2)).flatten(1).softmax(-1).view(HEADS, CLUSTERS, CLUSTERS)
    ptr = torch.arange(batch + 1) * n
    return q.to(device), block.to(device), k.to(device), ptr.to(device)


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
        fn = _sampler_case(spec, device)
        edges = fn().num_edges
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.attention", "--memory-case",
             json.dumps(spec)], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parent.parent)
        peak, edges = map(int, result.stdout.strip().splitlines()[-1].split())
    return dict(n=n, density=density, mode=mode, peak=peak, edges=edges,
                bytes_per_edge=peak / max(edges, 1))


def _sampler_case(spec: dict, device: torch.device):
    q, b, k, ptr = sbm_memberships(spec["n"], spec["density"], device)
    gen = torch.Generator(device).manual_seed(0)
    mode = spec["method"].split("_", 1)[1]
    return lambda: fastrg(q, b, k, ptr_q=ptr, ptr_k=ptr, mode=mode, generator=gen)


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    lx, ly = [math.log(a) for a in x], [math.log(b) for b in y]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return (sum((a - mx) * (b - my) for a, b in zip(lx, ly))
            / sum((a - mx) ** 2 for a in lx))


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


def calibrated_conv(channels: int, density: float, device: torch.device,
                    steps: int = 300) -> SBMConv:
    """An SBMConv whose expected density on N(0, 1) inputs is about
    ``density``: its SBM is fitted to that target with Adam on the
    closed-form expected density (no sampling needed)."""
    torch.manual_seed(0)
    conv = SBMConv(channels, HEAD_DIM, heads=HEADS, num_clusters=CLUSTERS,
                   root_weight=False, exploration=0.0).to(device)
    opt = torch.optim.Adam(conv.sbm.parameters(), lr=1e-2)
    x = torch.randn(512, channels, device=device)
    for _ in range(steps):
        q = conv.lin_query(x).view(-1, HEADS, HEAD_DIM)
        k = conv.lin_key(x).view(-1, HEADS, HEAD_DIM)
        qm, block, km = conv.sbm(q, k)
        expected = torch.einsum("hu,huv,hv->h", qm.sum(0), block, km.sum(0)) / 512**2
        loss = (expected.log() - math.log(density)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return conv


def bench_layer(n: int, density: float, device: torch.device, repeats: int,
                log) -> dict:
    channels = HEADS * HEAD_DIM
    conv = calibrated_conv(channels, density, device)
    mha = torch.nn.MultiheadAttention(channels, HEADS, batch_first=True).to(device)
    x = torch.randn(n, channels, device=device, requires_grad=True)
    gen = torch.Generator(device).manual_seed(0)

    def run_conv():
        out = conv(x, generator=gen)
        torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))

    def run_mha():
        out, _ = mha(x[None], x[None], x[None], need_weights=False)
        torch.autograd.grad(out.sum(), [x] + list(mha.parameters()))

    times = median_times(dict(sbmconv=run_conv, mha=run_mha), device, repeats)
    result = dict(n=n, channels=channels, heads=HEADS, clusters=CLUSTERS,
                  sbmconv_time=times["sbmconv"],
                  sampled_density=float(conv.sampled_density.mean()),
                  mha_time=times["mha"])
    result["ratio"] = result["sbmconv_time"] / result["mha_time"]
    log(f"  SBMConv {result['sbmconv_time'] * 1e3:.1f} ms at density "
        f"{result['sampled_density']:.4f} vs MultiheadAttention "
        f"{result['mha_time'] * 1e3:.1f} ms: {result['ratio']:.3f}x")
    return result


def bench_ext(n: int, densities: Sequence[float], device: torch.device,
              repeats: int, log) -> dict:
    """The optional PyG kernels (torch-scatter, torch-sparse) against the ones
    sbm_pyg uses, per operation of the attention, on one sampled graph."""
    import torch_geometric.typing as pyg_typing
    if not (pyg_typing.WITH_TORCH_SCATTER and pyg_typing.WITH_TORCH_SPARSE):
        log("  skipped: torch-scatter / torch-sparse not installed")
        return dict(skipped="torch-scatter / torch-sparse not installed")
    import torch_scatter
    import torch_sparse
    from sbm_pyg.sparse import spmm
    rows = []
    for density in densities:
        graph = fixed_graph(n, density, device)
        rowptr, col = graph.csr()
        g = torch.Generator(device).manual_seed(0)
        values = torch.rand(graph.num_edges, generator=g, device=device)
        dense = torch.randn(HEADS * n, HEAD_DIM, generator=g, device=device)
        adj = torch_sparse.SparseTensor(rowptr=rowptr, col=col, value=values,
                                        sparse_sizes=(HEADS * n, HEADS * n),
                                        is_sorted=True, trust_data=True)
        cases = {
            "segment_max": (
                lambda: torch.segment_reduce(values, "max", offsets=rowptr,
                                             unsafe=True),
                lambda: torch_scatter.segment_csr(values, rowptr, reduce="max")),
            "segment_sum": (
                lambda: torch.segment_reduce(values, "sum", offsets=rowptr,
                                             unsafe=True),
                lambda: torch_scatter.segment_csr(values, rowptr, reduce="sum")),
            "spmm": (lambda: spmm(rowptr, col, values, dense),
                     lambda: torch_sparse.matmul(adj, dense)),
        }
        row = dict(n=n, density=density, edges=graph.num_edges)
        for name, (ours, theirs) in cases.items():
            t = median_times(dict(ours=ours, theirs=theirs), device, repeats)
            row[name] = dict(ours=t["ours"], ext=t["theirs"],
                             ratio=t["theirs"] / t["ours"])
            log(f"  density {density} {name}: ours {t['ours'] * 1e3:.2f} ms, "
                f"ext {t['theirs'] * 1e3:.2f} ms ({row[name]['ratio']:.2f}x)")
        rows.append(row)
    return dict(rows=rows)


def _fmt(case: Optional[dict], key: str = "time") -> str:
    if case is None:
        return f"{'skipped':>9}"
    return f"{case[key] * 1e3:9.1f}"


def format_attention_row(row: dict) -> str:
    ratios = "  ".join(f"{m}/sdpa {row[m]['vs_sdpa']:.3f}" for m in ("sbm", "pyg")
                       if m in row and "vs_sdpa" in row[m])
    mem = "  ".join(f"{m} {row[m]['memory'] / 2**20:.1f} MiB" for m in METHODS
                    if m in row)
    return (f"  n={row['n']:>6} density={row['density']:<6} E={row['edges']:>10}  "
            f"ms: sbm {_fmt(row.get('sbm'))} sdpa {_fmt(row.get('sdpa'))} "
            f"math {_fmt(row.get('math'))} pyg {_fmt(row.get('pyg'))}  {ratios}  "
            f"memory: {mem}")


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


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, runs in seconds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads (default 2)")
    sections = ["attention", "sampler", "published", "exact", "memory",
                "scaling", "layer", "ext"]
    parser.add_argument("--sections", nargs="+", default=sections,
                        choices=sections)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default benchmarks/results-DEVICE.json)")
    parser.add_argument("--memory", choices=["subprocess", "profiler"], default=None,
                        help="CPU memory measurement (default: subprocess, "
                             "profiler with --quick)")
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_case:  # child process of peak_memory()
        print(_memory_case(json.loads(args.memory_case)))
        return {}
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    MEMORY["method"] = args.memory or ("profiler" if args.quick else "subprocess")
    if args.quick:
        sizes, densities, scaling_n = [256, 512], [0.01, 0.05], 512
        scaling_densities, layer_n, batch_case = [0.01, 0.1], 256, (4, 128)
        published_case, exact_n, memory_n = (2, 128), 256, 512
    else:
        sizes, densities, scaling_n = [1024, 4096, 16384], [0.005, 0.01, 0.05, 0.2], 4096
        scaling_densities = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2]
        layer_n, batch_case = 4096, (32, 1024)
        published_case, exact_n, memory_n = (8, 1024), 4096, 16384

    results = dict(device=str(device), threads=args.threads,
                   torch=torch.__version__, machine=platform.machine(),
                   processor=platform.processor() or platform.machine(),
                   cpu_count=os.cpu_count(), memory_method="cuda" if device.type == "cuda" else MEMORY["method"],
                   gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                   heads=HEADS, head_dim=HEAD_DIM, repeats=args.repeats,
                   quick=args.quick,
                   fastrg_backend="compiled" if _fastrg_compiled.available()
                   and device.type == "cpu" else "torch")
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"sbm_pyg benchmarks on {device} ({args.threads} threads), H={HEADS}, "
        f"D={HEAD_DIM}, forward+backward, median of {args.repeats}, fastrg "
        f"backend {results['fastrg_backend']}")
    if "attention" in args.sections:
        log("\n[attention] fixed sampled graph, time in ms")
        results["attention"] = bench_attention(sizes, densities, device,
                                               args.repeats, args.threads, log)
    if "sampler" in args.sections:
        log(f"\n[sampler] k={CLUSTERS}, distinct edges per second")
        results["sampler"] = bench_sampler(sizes, densities[1:3], device,
                                           args.repeats, log, batch_case)
    if "published" in args.sections:
        log("\n[published] fastrg vs the published-style batched fastRG, "
            "random kaiming-initialized SBM")
        results["published"] = bench_published(device, args.repeats, log,
                                               *published_case)
    if "exact" in args.sections:
        log("\n[exact] time per distinct edge, exact vs poisson mode")
        results["exact"] = bench_exact_dense(exact_n, 0.9, device,
                                             args.repeats, log)
    if "memory" in args.sections:
        log(f"\n[memory] fastrg peak bytes per distinct edge, output included, n={memory_n}")
        results["memory"] = []
        for density in densities[1:3]:
            for mode in ("poisson", "exact"):
                row = sampler_memory(memory_n, density, mode, device, args.threads)
                results["memory"].append(row)
                log(f"  density {density} {mode}: {row['peak'] / 2**20:.1f} MiB for "
                    f"{row['edges']} edges, {row['bytes_per_edge']:.1f} B/edge")
    if "scaling" in args.sections:
        log(f"\n[scaling] n={scaling_n}")
        results["scaling"] = bench_scaling(scaling_n, scaling_densities, device,
                                           args.repeats, args.threads, log)
    if "layer" in args.sections:
        results["layer"] = []
        for density in (0.05, 0.01):
            log(f"\n[layer] n={layer_n}, width {HEADS * HEAD_DIM}, calibrated to "
                f"~{density:.0%} expected density")
            results["layer"].append(bench_layer(layer_n, density, device,
                                                args.repeats, log))
    if "ext" in args.sections:
        log(f"\n[ext] torch-scatter / torch-sparse kernels vs ours, n={memory_n}, "
            f"time ratio ext / ours")
        results["ext"] = bench_ext(memory_n, densities[1:3], device,
                                   args.repeats, log)
    out = args.out or Path(__file__).parent / f"results-{device.type}.json"
    out.write_text(json.dumps(results, indent=1))
    log(f"\nwritten to {out}")
    return results


if __name__ == "__main__":
    main()
