r"""The attention suite: forward+backward on one fixed sampled graph per
(n, density): sbm_pyg ``sparse_attention`` (its default backend, and the
PyTorch path), SDPA, dense math attention (the path that materializes the
n x n scores) and a PyG gather/scatter reference (TransformerConv-style
message, ``torch_geometric.utils.softmax``, aggregation) on the same edges.

SDPA is timed at its best: on contiguous 4-D ``[1, H, n, D]`` input. Given
3-D ``[H, n, D]`` input, torch 2.13 on the CPU takes a path 2.5-3x slower
(340-440 ms vs 130-136 ms at n = 4096), which made earlier ratios read
about 3x too favourable."""
from __future__ import annotations

import math
import os
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax as pyg_softmax

from benchmarks.cases import HEAD_DIM, HEADS, backward, fixed_graph, qkv
from benchmarks.measure import (
    MEMORY,
    MEMORY_BUDGET,
    _profiler_peak,
    cuda_peak,
    median_time,
    median_times,
    subprocess_peak,
)
from sbm_pyg.nn.functional import sparse_attention


def attention_case(method: str, n: int, density: float, device: torch.device):
    """The inputs and the function of one attention case."""
    q, k, v = qkv(n, device)
    if method == "sdpa":
        q, k, v = batched(q, k, v)
    graph = fixed_graph(n, density, device) if method != "sdpa" and method != "math" else None
    return lambda: METHODS[method](q, k, v, graph)


def run_sbm(q, k, v, graph):
    backward(sparse_attention(q, k, v, graph), (q, k, v))


def run_sbm_torch(q, k, v, graph):
    backward(sparse_attention(q, k, v, graph, backend="torch"), (q, k, v))


def batched(q, k, v):
    """[n, H, D] -> contiguous [1, H, n, D] leaves, SDPA's fast layout."""
    return [t.detach().transpose(0, 1)[None].contiguous().requires_grad_()
            for t in (q, k, v)]


def run_sdpa(q, k, v, graph=None):
    # q, k, v from batched().
    backward(F.scaled_dot_product_attention(q, k, v), (q, k, v))


def sdpa_backend(device: torch.device) -> str:
    """The kernel SDPA dispatches to for the benchmark's inputs, read off the
    profiler (e.g. ``_scaled_dot_product_flash_attention_for_cpu``)."""
    q, k, v = batched(*qkv(64, device))
    with torch.profiler.profile() as prof:
        F.scaled_dot_product_attention(q, k, v)
    names = [e.name for e in prof.events() if "scaled_dot_product" in e.name
             and e.name != "aten::scaled_dot_product_attention"]
    return names[0].removeprefix("aten::") if names else "unknown"


def run_math(q, k, v, graph=None):
    # Materializes the [H, n, n] scores and weights.
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(HEAD_DIM)
    out = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)
    backward(out, (q, k, v))


def run_pyg(q, k, v, graph):
    # TransformerConv-style gather -> PyG softmax -> scatter, on the same edges.
    H, n = graph.num_heads, graph.num_queries
    row, col = graph.csr.row().long(), graph.csr.col.long()
    qf, kf, vf = (t.transpose(0, 1).reshape(H * t.size(0), -1) for t in (q, k, v))
    score = (qf[row] * kf[col]).sum(-1) / math.sqrt(HEAD_DIM)
    alpha = pyg_softmax(score, row, num_nodes=H * n)
    out = torch.zeros_like(qf).index_add_(0, row, vf[col] * alpha[:, None])
    backward(out, (q, k, v))


METHODS = {"sbm": run_sbm, "sbm_torch": run_sbm_torch, "sdpa": run_sdpa,
           "math": run_math, "pyg": run_pyg}


def _fits(method: str, n: int, edges: int) -> bool:
    if method == "pyg":  # a few [E, D] float32 buffers live at once
        return 6 * edges * HEAD_DIM * 4 <= MEMORY_BUDGET
    if method == "math":  # scores, weights and their gradients
        return 4 * HEADS * n * n * 4 <= MEMORY_BUDGET
    return True


def peak_memory(method: str, n: int, density: float, device: torch.device,
                threads: int) -> int:
    """Bytes one forward+backward of ``method`` allocates at its peak, beyond
    its inputs.

    CUDA: ``max_memory_allocated``, in process. CPU on Linux: each case in a
    fresh subprocess (see :func:`benchmarks.measure.peak_rss`): in one long-lived process,
    heap fragmentation left by earlier cases made the same case read 166 or
    346 MiB. Elsewhere: the torch profiler's allocation records, which miss
    allocations made inside the sparse kernels.
    """
    if device.type == "cuda":
        fn = attention_case(method, n, density, device)
        fn()
        return cuda_peak(fn, device)
    if MEMORY["method"] == "subprocess" and os.path.exists("/proc/self/clear_refs"):
        spec = dict(method=method, n=n, density=density, threads=threads)
        return int(subprocess_peak(spec))
    fn = attention_case(method, n, density, device)
    fn()
    return _profiler_peak(fn)


def bench_attention(sizes, densities, device, repeats, threads, log) -> List[dict]:
    """sbm_pyg (both paths) and SDPA are timed in turns on every row (the
    ratio that the targets use); dense math attention once per n; the PyG
    reference on its own."""
    rows = []
    for n in sizes:
        q, k, v = qkv(n, device)
        q4, k4, v4 = batched(q, k, v)
        math_case = None
        if _fits("math", n, 0):
            fn = lambda: run_math(q, k, v)  # noqa: E731
            math_case = dict(time=median_time(fn, device, repeats),
                             memory=peak_memory("math", n, 0.0, device, threads))
        for density in densities:
            graph = fixed_graph(n, density, device)
            row = dict(n=n, density=density, edges=graph.num_edges)
            fns = dict(sbm=lambda: run_sbm(q, k, v, graph),
                       sbm_torch=lambda: run_sbm_torch(q, k, v, graph),
                       sdpa=lambda: run_sdpa(q4, k4, v4))
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


def _fmt(case: Optional[dict], key: str = "time") -> str:
    if case is None:
        return f"{'skipped':>9}"
    return f"{case[key] * 1e3:9.1f}"


def format_attention_row(row: dict) -> str:
    ratios = "  ".join(f"{m}/sdpa {row[m]['vs_sdpa']:.3f}" for m in ("sbm", "sbm_torch", "pyg")
                       if m in row and "vs_sdpa" in row[m])
    mem = "  ".join(f"{m} {row[m]['memory'] / 2**20:.1f} MiB" for m in METHODS
                    if m in row)
    return (f"  n={row['n']:>6} density={row['density']:<6} E={row['edges']:>10}  "
            f"ms: sbm {_fmt(row.get('sbm'))} sbm_torch {_fmt(row.get('sbm_torch'))} "
            f"sdpa {_fmt(row.get('sdpa'))} "
            f"math {_fmt(row.get('math'))} pyg {_fmt(row.get('pyg'))}  {ratios}  "
            f"memory: {mem}")
