r"""The CUDA suite: forward+backward of the sparse attention against SDPA,
FlexAttention and PyG's message passing on the same edges, the kernels
against their L2-gather bound, the fastRG sampler's distinct edges per
second, ``SBMConv`` against ``nn.MultiheadAttention`` and a training step of
the LRA model against full attention. Run on a GPU as

    python -m benchmarks.cuda --out benchmarks/results-cuda.json

Timings are medians of CUDA-event intervals after a warm-up; the methods of
one row take turns, repeat by repeat, so their ratios come from one run.
Memory is ``max_memory_allocated`` beyond the inputs, per method.

The graphs of the attention rows are i.i.d. Bernoulli masks at the given
density (drawn in row chunks, so that no :obj:`[H, n, n]` tensor is needed);
the sampler rows draw from a k = 128 SBM calibrated to the density.
``--quick`` runs tiny sizes (also on the CPU, under Triton's interpreter,
so that the script cannot rot).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax as pyg_softmax

from benchmarks.cases import CLUSTERS, sbm_memberships
from benchmarks.measure import cuda_peak, median_times
from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.ops import triton_runs
from sbm_pyg.sampling import SampledGraph, fastrg

# H100: the L2 bandwidth the work model uses (docs/performance.md).
L2_BYTES_PER_S = 5.5e12
# The head width of the dense-regime rows.
CASE_DIM = 32
# The int32 CSR of a graph: the benchmark keeps edge counts well inside it.
MAX_EDGES = 1_200_000_000


def mask_keys(n: int, heads: int, density: float, device: torch.device,
              seed: int = 0, chunk: int = 2**28) -> torch.Tensor:
    """Sorted keys :math:`(h n + i) n + j` of an i.i.d. Bernoulli(density)
    mask over :obj:`[heads, n, n]`, drawn ``chunk`` pairs at a time."""
    g = torch.Generator(device).manual_seed(seed)
    rows = max(chunk // n, 1)
    keys = []
    for r0 in range(0, heads * n, rows):
        r1 = min(r0 + rows, heads * n)
        hit = torch.rand((r1 - r0) * n, generator=g, device=device) < density
        keys.append(hit.nonzero().view(-1) + r0 * n)
    return torch.cat(keys)


def attention_inputs(n: int, heads: int, dim: int, dtype: torch.dtype,
                     device: torch.device, seed: int = 1):
    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn(n, heads, dim, generator=g, device=device)
            .to(dtype).requires_grad_() for _ in range(3)]


def four_d(*ts):
    """[n, H, D] -> contiguous [1, H, n, D] leaves, SDPA's fast layout."""
    return [t.detach().transpose(0, 1)[None].contiguous().requires_grad_() for t in ts]


def grad(out, inputs):
    torch.autograd.grad(out.float().sum(), inputs)


def pyg_attention(q, k, v, graph: SampledGraph):
    """TransformerConv's attention on the graph's edges: gather, score,
    ``torch_geometric.utils.softmax`` by query, weighted scatter-sum."""
    H, n, D = graph.num_heads, graph.num_queries, q.size(-1)
    row, col = graph.csr.row().long(), graph.csr.col.long()
    qf, kf, vf = (t.transpose(0, 1).reshape(H * t.size(0), -1) for t in (q, k, v))
    score = (qf[row] * kf[col]).sum(-1) / math.sqrt(D)
    alpha = pyg_softmax(score, row, num_nodes=H * n)
    return torch.zeros_like(qf).index_add_(0, row, vf[col] * alpha[:, None])


def sdpa_kernel(q4, k4, v4) -> str:
    """The kernel SDPA dispatches to for these inputs, read off the profiler."""
    with torch.profiler.profile() as prof:
        F.scaled_dot_product_attention(q4, k4, v4)
    names = [e.name.removeprefix("aten::") for e in prof.events()
             if "scaled_dot_product" in e.name
             and e.name != "aten::scaled_dot_product_attention"]
    return names[0] if names else "unknown"


def flex_case(keys: torch.Tensor, n: int, heads: int):
    """FlexAttention with the graph's mask as a BlockMask (None where it
    cannot run)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    dense = torch.zeros(heads * n * n, dtype=torch.bool, device=keys.device)
    dense[keys] = True
    dense = dense.view(heads, n, n)

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[h, q_idx, kv_idx]

    block_mask = create_block_mask(mask_mod, None, heads, n, n, device=keys.device)
    flex = torch.compile(flex_attention, dynamic=False)
    return lambda q4, k4, v4: flex(q4, k4, v4, block_mask=block_mask)


def bytes_per_edge(dim: int, dtype: torch.dtype) -> int:
    """The fused kernels' gathers per edge, forward+backward: the forward
    and the query pass read a column index and a key and value row; the key
    pass reads a row index, a query and output-gradient row and the row's
    log-sum-exp and delta (4 bytes each, float32)."""
    row = dim * torch.finfo(dtype).bits // 8
    return 2 * (4 + 2 * row) + (4 + 2 * row + 8)


def bench_attention(cases, densities: Sequence[float], device: torch.device,
                    repeats: int, flex_max_n: int, log, rows: List[dict],
                    save: Callable[[], None]) -> List[dict]:
    """One row per (n, heads, dim, dtype) of ``cases`` and density, appended
    to ``rows`` and saved as it comes."""
    for n, heads, dim, dtype in cases:
        q, k, v = attention_inputs(n, heads, dim, dtype, device)
        q4, k4, v4 = four_d(q, k, v)
        sdpa = sdpa_kernel(q4, k4, v4) if device.type == "cuda" else "cpu"
        for density in densities:
            if heads * n * n * density > MAX_EDGES:
                continue
            rows.append(attention_row(n, heads, dim, dtype, density,
                                      (q, k, v), (q4, k4, v4), sdpa, device,
                                      repeats, n <= flex_max_n, log))
            save()
    return rows


def attention_row(n, heads, dim, dtype, density, qkv, qkv4, sdpa, device,
                  repeats, with_flex, log) -> dict:
    # qkv: [n, H, D] each, as the SBM kernels take them; qkv4: [1, H, n, D],
    # as SDPA and FlexAttention do.
    (q, k, v), (q4, k4, v4) = qkv, qkv4
    keys = mask_keys(n, heads, density, device)
    graph = SampledGraph.from_keys(keys, heads, n, n)
    E = graph.num_edges
    graph.csr.row_t()  # cached once, as a layer's graph has it
    fns = {
        "sbm": lambda: grad(sparse_attention(q, k, v, graph), (q, k, v)),
        "sdpa": lambda: grad(F.scaled_dot_product_attention(q4, k4, v4), (q4, k4, v4)),
    }
    if E * dim * 4 * 8 <= 40 * 2**30:  # the PyTorch paths' [E, D] buffers
        fns["sbm_torch"] = lambda: grad(
            sparse_attention(q, k, v, graph, backend="torch"), (q, k, v))
        fns["pyg"] = lambda: grad(pyg_attention(q, k, v, graph), (q, k, v))
    if with_flex and device.type == "cuda":
        try:
            flex = flex_case(keys, n, heads)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            log(f"    flex unavailable: {type(e).__name__}: {e}")
            flex = None
        if flex is not None:
            fns["flex"] = lambda: grad(flex(q4, k4, v4), (q4, k4, v4))
    del keys
    times = median_times(fns, device, repeats, clock="events")
    row = dict(n=n, heads=heads, dim=dim, dtype=str(dtype).removeprefix("torch."),
               density=density, edges=E, sdpa_kernel=sdpa)
    for name, t in times.items():
        row[name] = dict(time=t, memory=cuda_peak(fns[name], device),
                         vs_sdpa=t / times["sdpa"])
    model = bytes_per_edge(dim, dtype) * E
    row["sbm"].update(bytes=model, achieved_bytes_per_s=model / times["sbm"],
                      l2_bound=model / L2_BYTES_PER_S,
                      vs_l2_bound=times["sbm"] / (model / L2_BYTES_PER_S))
    flops = 4 * heads * n * n * dim * 3.5  # fwd 2 matmuls, bwd 5 (as FA2 counts)
    row["sdpa"]["tflops"] = flops / times["sdpa"] / 1e12
    log(format_row(row))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def format_row(row: dict) -> str:
    ms = "  ".join(f"{m} {row[m]['time'] * 1e3:8.3f}" for m in
                   ("sbm", "sbm_torch", "pyg", "flex", "sdpa") if m in row)
    ratios = " ".join(f"{m}/sdpa {row[m]['vs_sdpa']:.3f}" for m in
                      ("sbm", "sbm_torch", "pyg", "flex") if m in row)
    return (f"  n={row['n']:>6} H={row['heads']} D={row['dim']} {row['dtype']:>8} "
            f"density={row['density']:<5} E={row['edges']:>11}  ms: {ms}  {ratios}  "
            f"sbm/L2-bound {row['sbm']['vs_l2_bound']:.2f}")


def bench_tuning(n: int, heads: int, dim: int, density: float, dtype,
                 device: torch.device, repeats: int, log) -> List[dict]:
    """The three Triton kernels at each (BLOCK_E, num_warps), timed alone on
    one graph: forward, backward over rows, backward over columns."""
    from sbm_pyg.ops import triton_attention as ta
    keys = mask_keys(n, heads, density, device)
    csr = SampledGraph.from_keys(keys, heads, n, n).csr
    R, E = heads * n, csr.num_edges
    g = torch.Generator(device).manual_seed(2)
    q, k, v, go = (torch.randn(R, dim, generator=g, device=device).to(dtype)
                   for _ in range(4))
    out = torch.empty_like(v)
    lse = torch.zeros(R, device=device)
    delta = torch.zeros(R, device=device)
    gq, gk, gv = (torch.empty_like(t) for t in (q, k, v))
    rowptr, col, colptr, row_t = csr.rowptr, csr.col, csr.colptr, csr.row_t()
    scale = torch.full((1,), 1 / math.sqrt(dim), device=device)
    base = dict(D=dim, DV=dim, BLOCK_D=dim, BLOCK_DV=dim, ACC=ta.tl.float32,
                DROP=False)
    back = dict(base, STE=0, MEMB=False, KM=1, BLOCK_K=1)
    seed, threshold = 0, 0  # no dropout: the kernels' arguments all the same
    rows = []
    for block in (16, 32, 64):
        for warps in (1, 2, 4):
            fns = {
                "forward": lambda: ta._forward_kernel[(R,)](
                    q, k, v, out, lse, rowptr, col, scale, seed, threshold, BLOCK=block,
                    num_warps=warps, **base),
                "backward_query": lambda: ta._backward_query_kernel[(R,)](
                    q, k, v, go, lse, delta, gq, gq, gq, gq, rowptr, col, scale,
                    seed, threshold, BLOCK=block, num_warps=warps, **back),
                "backward_key": lambda: ta._backward_key_kernel[(R,)](
                    q, k, v, go, lse, delta, gk, gv, gq, gq, colptr, row_t, scale,
                    seed, threshold, BLOCK=block, num_warps=warps, **back),
            }
            times = median_times(fns, device, repeats, clock="events")
            row = dict(block=block, num_warps=warps, edges=E,
                       **{f"{name}_ms": t * 1e3 for name, t in times.items()})
            rows.append(row)
            log(f"  BLOCK_E={block:>3} num_warps={warps}: " + "  ".join(
                f"{name} {t * 1e3:.3f} ms" for name, t in times.items()))
    return rows


def bench_dense(n: int, densities: Sequence[float], device: torch.device,
                repeats: int, log) -> List[dict]:
    """The dense-regime kernel (it samples the mask and computes the masked
    attention and the memberships' gradient, float32 inputs, its products
    exact and on bfloat16 tensor cores) forward+backward on
    an SBM calibrated to each density, in turns with SDPA on the same
    queries, keys and values in float32 and bfloat16."""
    from sbm_pyg.ops.dense_attention import dense_attention
    rows = []
    for density in densities:
        q_memb, block, k_memb, ptr = sbm_memberships(n, density, device)
        heads, clusters = q_memb.size(1), q_memb.size(2)
        # heads-first rows, as the kernel takes them
        q_block = torch.einsum("nhu,huv->hnv", q_memb, block).reshape(
            heads * n, clusters).contiguous().requires_grad_()
        k_rows = k_memb.transpose(0, 1).reshape(heads * n, clusters) \
            .contiguous().requires_grad_()
        q, k, v = attention_inputs(n, heads, CASE_DIM, torch.float32, device)
        q2, k2, v2 = (t.detach().transpose(0, 1).reshape(heads * n, -1)
                      .contiguous().requires_grad_() for t in (q, k, v))
        q4, k4, v4 = four_d(q, k, v)
        h4 = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q4, k4, v4)]
        scale = 1 / math.sqrt(CASE_DIM)
        edges = []

        def dense(precision: str = "ieee", dropout: float = 0.0):
            res = dense_attention(q2, k2, v2, q_block, k_rows, ptr, ptr,
                                  heads=heads, scale=scale, seed=0,
                                  precision=precision, dropout=dropout,
                                  dropout_seed=1)
            edges.append(int(res.edges.sum()))
            grad(res.out, (q2, k2, v2, q_block, k_rows))

        fns = dict(
            dense=dense,
            # The scores, outputs and gradients on bfloat16 tensor cores
            # (the mask's probabilities in three-pass TF32).
            dense_bf16=lambda: dense("bfloat16"),
            dense_bf16_dropout=lambda: dense("bfloat16", 0.1),
            sdpa_fp32=lambda: grad(F.scaled_dot_product_attention(q4, k4, v4),
                                   (q4, k4, v4)),
            sdpa_bf16=lambda: grad(F.scaled_dot_product_attention(*h4), h4))
        times = median_times(fns, device, repeats, clock="events")
        sampled = edges[-1] / (heads * n * n)
        row = dict(n=n, heads=heads, dim=CASE_DIM, clusters=clusters,
                   target_density=density, density=sampled,
                   sdpa_kernel_fp32=sdpa_kernel(q4, k4, v4) if device.type == "cuda" else "cpu",
                   sdpa_kernel_bf16=sdpa_kernel(*h4) if device.type == "cuda" else "cpu",
                   **{f"{m}_time": t for m, t in times.items()},
                   dense_memory=cuda_peak(dense, device))
        row["dense_vs_sdpa_fp32"] = times["dense"] / times["sdpa_fp32"]
        row["dense_vs_sdpa_bf16"] = times["dense"] / times["sdpa_bf16"]
        row["dense_bf16_vs_sdpa_bf16"] = times["dense_bf16"] / times["sdpa_bf16"]
        row["dropout_vs_none"] = times["dense_bf16_dropout"] / times["dense_bf16"]
        rows.append(row)
        log(f"  n={n} density {sampled:.3f}: dense {times['dense'] * 1e3:.3f} ms "
            f"(bf16 products {times['dense_bf16'] * 1e3:.3f} ms, "
            f"{row['dense_bf16_vs_sdpa_bf16']:.2f}x SDPA bf16; dropout 0.1 "
            f"{row['dropout_vs_none']:.2f}x none), "
            f"SDPA fp32 {times['sdpa_fp32'] * 1e3:.3f} ms ({row['sdpa_kernel_fp32']}), "
            f"bf16 {times['sdpa_bf16'] * 1e3:.3f} ms ({row['sdpa_kernel_bf16']}); "
            f"dense/SDPA {row['dense_vs_sdpa_fp32']:.2f} (fp32) "
            f"{row['dense_vs_sdpa_bf16']:.2f} (bf16)")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_sampler(sizes: Sequence[int], density: float, device: torch.device,
                  repeats: int, log) -> List[dict]:
    rows = []
    for n in sizes:
        q_memb, block, k_memb, _ = sbm_memberships(n, density, device)
        for mode in ("poisson", "exact"):
            g = torch.Generator(device).manual_seed(0)
            fn = lambda: fastrg(q_memb, block, k_memb, mode=mode, generator=g)  # noqa: E731
            t = median_times({"fastrg": fn}, device, repeats, clock="events")["fastrg"]
            edges = fn().num_edges
            row = dict(n=n, heads=q_memb.size(1), clusters=CLUSTERS, mode=mode,
                       density=edges / (q_memb.size(1) * n * n), edges=edges,
                       time=t, edges_per_s=edges / t,
                       memory=cuda_peak(fn, device))
            rows.append(row)
            log(f"  n={n} {mode:>7}: {edges} edges ({row['density']:.4f}) in "
                f"{t * 1e3:.3f} ms, {row['edges_per_s'] / 1e9:.2f} G distinct edges/s")
    return rows


def bench_degree(args: argparse.Namespace, device: torch.device, log,
                 rows: List[dict], save: Callable[[], None]) -> None:
    """SBMConv against MultiheadAttention under bfloat16 autocast at a
    constant expected degree (density degree / n) as n grows."""
    from benchmarks.layer import bench_layer
    for n in args.degree_sizes or ([256] if args.quick else [16384, 65536]):
        density = min(args.degree / n, 1.0)
        log(f"[degree] SBMConv vs MultiheadAttention under bfloat16 autocast, "
            f"n={n}, expected degree {args.degree} (~{density:.2%})")
        rows.append(bench_layer(n, density, device, args.repeats, log,
                                autocast=True))
        save()


def triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def parse_case(text: str, parser: argparse.ArgumentParser) -> tuple:
    """``"N:H:D:DTYPE"`` -> (n, heads, dim, torch dtype)."""
    try:
        n, heads, dim, dtype = text.split(":")
        return int(n), int(heads), int(dim), getattr(torch, dtype)
    except (ValueError, AttributeError):
        parser.error(f"--cases: {text!r} is not N:H:D:DTYPE "
                     f"(e.g. 16384:2:32:bfloat16)")


def case_sizes(args: argparse.Namespace, parser: argparse.ArgumentParser
               ) -> SimpleNamespace:
    """What each section measures: --quick's tiny cases or the full run's,
    narrowed by the options that fit a short call."""
    bf16, fp32 = torch.bfloat16, torch.float32
    if args.quick:
        cases, densities = [(64, 2, 32, fp32)], [0.05, 1.0]
        flex_max_n, tunings = 0, [(64, 2, 32, 0.2)]
        sampler_sizes, layer_sizes, training_sizes = [64], [64], [64]
        dense_sizes, dense_densities = [64], [0.5]
    else:
        # The targets' case first: a run cut short keeps the rows it made.
        cases = [(16384, 2, 32, bf16), (16384, 2, 32, fp32), (4096, 2, 32, bf16),
                 (4096, 2, 32, fp32), (65536, 2, 32, bf16), (65536, 2, 32, fp32),
                 (16384, 8, 64, bf16), (4096, 8, 64, bf16), (16384, 8, 64, fp32)]
        densities = [0.005, 0.01, 0.05, 0.2, 0.5, 1.0]
        flex_max_n = 16384
        tunings = [(16384, 2, 32, 0.01), (16384, 2, 64, 0.01)]
        sampler_sizes, layer_sizes, training_sizes = [4096, 65536], [4096, 16384], [4096, 16384]
        dense_sizes, dense_densities = [4096, 16384], [0.3, 0.5, 1.0]
    sampler_densities = [0.01]
    if args.cases is not None:
        cases = [parse_case(c, parser) for c in args.cases]
    densities = args.densities or densities
    flex_max_n = flex_max_n if args.flex_max_n is None else args.flex_max_n
    sampler_sizes = args.sampler_sizes or sampler_sizes
    sampler_densities = args.sampler_densities or sampler_densities
    dense_sizes = args.dense_sizes or dense_sizes
    layer_sizes = args.layer_sizes or layer_sizes
    training_sizes = args.training_sizes or training_sizes
    return SimpleNamespace(
        cases=cases,
        densities=densities,
        flex_max_n=flex_max_n,
        tunings=tunings,
        sampler_sizes=sampler_sizes,
        sampler_densities=sampler_densities,
        layer_sizes=layer_sizes,
        training_sizes=training_sizes,
        dense_sizes=dense_sizes,
        dense_densities=dense_densities)


def arguments() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    sections = ["attention", "tuning", "sampler", "dense", "layer", "degree",
                "training"]
    parser.add_argument("--sections", nargs="+", default=sections, choices=sections)
    # A short call on a GPU machine: these narrow a section to what fits.
    parser.add_argument("--cases", nargs="+", default=None, metavar="N:H:D:DTYPE",
                        help="attention cases, e.g. 16384:2:32:bfloat16")
    parser.add_argument("--densities", nargs="+", type=float, default=None)
    parser.add_argument("--flex-max-n", type=int, default=None,
                        help="FlexAttention only up to this n (0: never)")
    parser.add_argument("--sampler-sizes", nargs="+", type=int, default=None)
    parser.add_argument("--sampler-densities", nargs="+", type=float, default=None)
    parser.add_argument("--dense-sizes", nargs="+", type=int, default=None)
    parser.add_argument("--layer-sizes", nargs="+", type=int, default=None)
    parser.add_argument("--training-sizes", nargs="+", type=int, default=None)
    parser.add_argument("--degree-sizes", nargs="+", type=int, default=None,
                        help="layer rows at a constant expected degree under "
                             "bfloat16 autocast (section degree)")
    parser.add_argument("--degree", type=int, default=64)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = arguments()
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = torch.bfloat16
    z = case_sizes(args, parser)
    results: dict = dict(device=str(device), quick=args.quick, repeats=args.repeats,
                         torch=torch.__version__, triton=triton_version(),
                         command=" ".join(["python -m benchmarks.cuda",
                                           *(argv if argv is not None else sys.argv[1:])]),
                         gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    log = lambda s: print(s, flush=True)  # noqa: E731

    def save():
        args.out.write_text(json.dumps(results, indent=1))

    if "attention" in args.sections:
        log("[attention] forward+backward, ms")
        results["attention"] = []
        bench_attention(z.cases, z.densities, device, args.repeats, z.flex_max_n, log,
                        results["attention"], save)
    if "tuning" in args.sections and triton_runs(device):
        results["tuning"] = []
        for n, heads, dim, density in z.tunings:
            log(f"[tuning] Triton kernels alone, n={n} H={heads} D={dim} "
                f"density {density}, bf16")
            results["tuning"].append(dict(
                n=n, heads=heads, dim=dim, density=density, dtype="bfloat16",
                rows=bench_tuning(n, heads, dim, density, bf16, device,
                                  args.repeats, log)))
            save()
    if "sampler" in args.sections:
        results["sampler"] = []
        for density in z.sampler_densities:
            log(f"[sampler] fastrg, H=2, k=128, density {density:.0%}")
            results["sampler"] += bench_sampler(z.sampler_sizes, density, device,
                                                args.repeats, log)
            save()
    if "dense" in args.sections:
        results["dense"] = []
        for n in z.dense_sizes:
            log(f"[dense] the dense-regime kernel vs SDPA, n={n}, H=2, "
                f"D={CASE_DIM}, k={CLUSTERS}, forward+backward")
            results["dense"] += bench_dense(n, z.dense_densities, device,
                                            args.repeats, log)
            save()
    if "layer" in args.sections:
        from benchmarks.layer import bench_layer
        results["layer"] = []
        for n in z.layer_sizes:
            for density in (0.01, 0.05):
                log(f"[layer] SBMConv vs MultiheadAttention, n={n}, ~{density:.0%}")
                results["layer"].append(bench_layer(n, density, device, args.repeats, log))
                save()
    if "degree" in args.sections:
        results["degree"] = []
        bench_degree(args, device, log, results["degree"], save)
    if "training" in args.sections:
        from benchmarks.training import training_step
        results["training"] = []
        for n in z.training_sizes:
            steps = dict(full=training_step("full", n, 1.0, device))
            for density in (0.01, 0.05):
                steps[f"sbm@{density}"] = training_step("sbm", n, density, device)
            times = median_times(steps, device, args.repeats, clock="events")
            row = dict(n=n, **{f"{k}_time": t for k, t in times.items()},
                       **{f"{k}_density": steps[k]()["density"] for k in steps})
            results["training"].append(row)
            log(f"[training] n={n}: " + "  ".join(
                f"{k} {t * 1e3:.2f} ms ({t / times['full']:.3f}x)" for k, t in times.items()))
            save()
    save()
    log(f"written to {args.out}")
    return results


if __name__ == "__main__":
    main()
