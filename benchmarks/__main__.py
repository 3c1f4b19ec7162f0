r"""Benchmarks: SBM edge attention, fastRG and the SBMConv layer vs dense
attention. Run as ``python -m benchmarks`` (or ``make bench``).

Every timing is the median of ``--repeats`` runs after one warm-up; the
timings that a target compares (sbm vs SDPA, the samplers, SBMConv vs
MultiheadAttention) take turns repeat by repeat, and every ratio is taken
against torch's ``scaled_dot_product_attention`` (SDPA) from the same run.
Peak memory is what one forward+backward allocates beyond its inputs: on CPU
(Linux) each case runs in a fresh subprocess and reads the kernel's peak
resident set; on CUDA ``max_memory_allocated``.

Sections (one module each): ``attention``, ``sampler``, ``published``,
``exact``, ``memory`` (in :mod:`benchmarks.sampler`), ``scaling``,
``layer`` (and ``choice``, ``crossover``, in :mod:`benchmarks.layer`),
``training``,
``ext``, ``budget``, ``gps`` (:mod:`benchmarks.gps_scaling`, CPU only),
``sharp`` (a head of nearly complete blocks, :mod:`benchmarks.sharp`),
``widths`` (the edge kernel's cost by membership width on one graph of
that head, in the same module, CPU only),
``cuda`` (the CUDA suite, :mod:`benchmarks.cuda`, on a GPU only; also run
alone as ``python -m benchmarks.cuda``).

``--quick`` runs tiny sizes in seconds (the test suite runs it so that the
script cannot rot; timings are never pass/fail in tests).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from benchmarks import gps_scaling
from benchmarks.attention import attention_case, bench_attention, sdpa_backend
from benchmarks.budget import bench_budget
from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS
from benchmarks.edge_buffers import edge_buffers
from benchmarks.ext import bench_ext
from benchmarks.layer import bench_choice, bench_crossover, layer_section
from benchmarks.measure import MEMORY, peak_rss, pin_mmap_threshold
from benchmarks.sampler import (
    bench_exact_dense,
    bench_published,
    bench_sampler,
    sampler_case,
    sampler_memory,
)
from benchmarks.scaling import bench_scaling
from benchmarks.sharp import sharp_sections
from benchmarks.training import bench_mqar_head, bench_training, training_step
from sbm_pyg.ops import backends


def memory_case(spec: dict) -> str:
    """The child process of a CPU memory probe: peak resident set of one call
    (and, for a sampler, its distinct edges)."""
    pin_mmap_threshold()
    torch.set_num_threads(spec["threads"])
    sampler = spec["method"].startswith("fastrg")
    cpu = torch.device("cpu")
    if spec["method"].startswith("train-"):
        fn = training_step(spec["method"][len("train-"):], spec["n"],
                           spec["density"], cpu)
    elif sampler:
        fn = sampler_case(spec, cpu)
    else:
        fn = attention_case(spec["method"], spec["n"], spec["density"], cpu)
    out = fn()  # warm-up: lazily built state (the graph's row index) is not counted
    edges = out.num_edges if sampler else None
    del out
    peak = peak_rss(fn)
    return f"{peak} {edges}" if sampler else str(peak)


def section_sizes(quick: bool, device: torch.device,
                  crossover_sizes: List[int]) -> SimpleNamespace:
    """The sizes and densities each section measures: --quick's tiny ones
    (seconds) or the full run's."""
    if quick:
        sizes, densities, scaling_n = [256, 512], [0.01, 0.05], 512
        scaling_densities, layer_n, batch_case = [0.01, 0.1], 256, (4, 128)
        layer_sizes, layer_densities = [256], [0.05, 0.01]
        published_case, exact_n, memory_n = (2, 128), 256, 512
        training_sizes, training_densities = [128], [0.05, 0.2]
        crossover_sizes, crossover_densities = [128], [0.05, 0.5]
        budget_sizes = [16]
        mqar_case = (32, 4, 64)
        sharp_cases, sharp_conv_case = [(256, 0.05), (256, 0.2)], (256, 0.05)
        widths_case = (256, 0.2)
        # The budgeted variant's weights take minutes to train: not in --quick.
        gps_sizes, gps_variants = [256], ["performer", "sbm"]
    else:
        sizes, densities, scaling_n = [1024, 4096, 16384], [0.005, 0.01, 0.05, 0.2], 4096
        scaling_densities = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2]
        layer_n, batch_case = 4096, (32, 1024)
        layer_sizes, layer_densities = [1024, 4096, 16384], [0.05, 0.01, 0.2]
        published_case, exact_n, memory_n = (8, 1024), 4096, 16384
        training_sizes = [1024, 2048, 4096]
        training_densities = [0.01, 0.05, 0.2, 0.5, 1.0]
        crossover_densities = [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0]
        if device.type == "cuda":  # where it was found below 2% at n = 2048
            crossover_densities = [0.005, 0.01] + crossover_densities[:-1]
        budget_sizes = [64, 128, 256]
        mqar_case = (256, 64, 8192)  # Zoology's evaluation setting
        sharp_cases = [(4096, 0.01), (4096, 0.05), (4096, 0.2), (16384, 0.01),
                       (16384, 0.05)]
        sharp_conv_case = (4096, 0.05)
        widths_case = (16384, 0.05)
        gps_sizes, gps_variants = list(gps_scaling.SIZES), list(gps_scaling.VARIANTS)
    return SimpleNamespace(
        sizes=sizes,
        densities=densities,
        scaling_n=scaling_n,
        scaling_densities=scaling_densities,
        layer_n=layer_n,
        batch_case=batch_case,
        layer_sizes=layer_sizes,
        layer_densities=layer_densities,
        published_case=published_case,
        exact_n=exact_n,
        memory_n=memory_n,
        training_sizes=training_sizes,
        training_densities=training_densities,
        crossover_sizes=crossover_sizes,
        crossover_densities=crossover_densities,
        budget_sizes=budget_sizes,
        mqar_case=mqar_case,
        sharp_cases=sharp_cases,
        sharp_conv_case=sharp_conv_case,
        widths_case=widths_case,
        gps_sizes=gps_sizes,
        gps_variants=gps_variants)


def bench_memory(z: SimpleNamespace, device: torch.device, threads: int,
                 log: Callable[[str], None]) -> Tuple[list, list]:
    """The memory section: the sampler's peak bytes per distinct edge, and
    the edge-sized buffers of one SBMConv forward and backward."""
    log(f"\n[memory] fastrg peak bytes per distinct edge, output included, n={z.memory_n}")
    memory: list = []
    for density in z.densities[1:3]:
        for mode in ("poisson", "exact"):
            row = sampler_memory(z.memory_n, density, mode, device, threads)
            memory.append(row)
            log(f"  density {density} {mode}: {row['peak'] / 2**20:.1f} MiB for "
                f"{row['edges']} edges, {row['bytes_per_edge']:.1f} B/edge")
    log(f"\n[memory] edge-sized buffers of one SBMConv forward+backward, "
        f"n={z.layer_n}")
    buffers: list = []
    for backend in ("auto", "torch"):
        row = edge_buffers(z.layer_n, 0.05, device, backend)
        buffers.append(row)
        log(f"  attention {row['attention']}: graph "
            f"{row['graph_bytes_per_edge']:.1f} B/edge with its views, "
            f"{row['edge_sized_buffers']} edge-sized buffers "
            f"({row['buffer_bytes_per_edge']:.1f} B/edge)")
    return memory, buffers


SECTIONS = ["attention", "sampler", "published", "exact", "memory", "scaling",
            "layer", "choice", "crossover", "training", "ext", "budget", "gps",
            "sharp", "widths", "mqar", "cuda"]
# The sections of one device only: the rest run on either.
CPU_ONLY, CUDA_ONLY = ("gps", "widths"), ("cuda",)


def run_cuda_suite(out: Path, repeats: int, quick: bool,
                   log: Callable[[str], None]) -> dict:
    """The CUDA suite (:mod:`benchmarks.cuda`) as a section: its results,
    also written beside ``out`` as ``*-suite.json`` while it runs."""
    from benchmarks import cuda
    log("\n[cuda] the CUDA suite: the kernels against SDPA, FlexAttention "
        "and PyG's message passing, the sampler, the dense kernel, the layer "
        "and a training step")
    suite = out.with_name(f"{out.stem}-suite.json")
    return cuda.main(["--out", str(suite), "--repeats", str(repeats),
                      *(["--quick"] if quick else [])])


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, runs in seconds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--crossover-sizes", type=int, nargs="+", default=[2048],
                        help="sequence lengths of the crossover section")
    parser.add_argument("--sharp-cases", nargs="+", default=None, metavar="N:RHO",
                        help="the sharp section's heads, e.g. 16384:0.05 "
                             "(default: the suite's)")
    parser.add_argument("--sharp-dtype", choices=["float32", "bfloat16"],
                        default="float32",
                        help="the sharp section's queries, keys and values, "
                             "SDPA's alike (default float32)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads (default 2)")
    parser.add_argument("--sections", nargs="+", default=None, choices=SECTIONS,
                        help="default: all (gps on the CPU only)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default benchmarks/results-DEVICE.json)")
    parser.add_argument("--memory", choices=["subprocess", "profiler"], default=None,
                        help="CPU memory measurement (default: subprocess, "
                             "profiler with --quick)")
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
               device: torch.device) -> None:
    """Refuses what cannot run; the default sections for the device."""
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    other = CUDA_ONLY if device.type == "cpu" else CPU_ONLY
    if args.sections is None:
        args.sections = [s for s in SECTIONS if s not in other]
    elif "gps" in args.sections and device.type != "cpu":
        parser.error("--sections gps: the GPS scaling benchmark runs on the CPU")
    elif "cuda" in args.sections and device.type != "cuda":
        parser.error("--sections cuda: the CUDA suite runs on a GPU (--device cuda)")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if args.sharp_cases is not None:
        try:
            args.sharp_cases = [(int(n), float(rho)) for n, rho in
                                (case.split(":") for case in args.sharp_cases)]
        except ValueError:
            parser.error(f"--sharp-cases: N:RHO pairs, e.g. 16384:0.05, got "
                         f"{' '.join(args.sharp_cases)}")


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.memory_case:  # child process of peak_memory()
        print(memory_case(json.loads(args.memory_case)))
        return {}
    device = torch.device(args.device)
    check_args(parser, args, device)
    torch.set_num_threads(args.threads)
    MEMORY["method"] = args.memory or ("profiler" if args.quick else "subprocess")
    z = section_sizes(args.quick, device, args.crossover_sizes)
    results = dict(device=str(device), threads=args.threads,
                   torch=torch.__version__, machine=platform.machine(),
                   processor=platform.processor() or platform.machine(),
                   cpu_count=os.cpu_count(),
                   memory_method="cuda" if device.type == "cuda" else MEMORY["method"],
                   gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                   heads=HEADS, head_dim=HEAD_DIM, repeats=args.repeats,
                   quick=args.quick,
                   fastrg_backend=backends(device)["sampler"],
                   attention_backend=backends(device)["attention"],
                   sdpa_backend=sdpa_backend(device))
    out = args.out or Path(__file__).parent / f"results-{device.type}.json"

    def log(line: str) -> None:
        # Each section opens with a "[name]" line: what the sections before
        # it measured is written then, so that a run cut short keeps it.
        if line.startswith("\n["):
            out.write_text(json.dumps(results, indent=1))
        print(line, flush=True)

    log(f"sbm_pyg benchmarks on {device} ({args.threads} threads), H={HEADS}, "
        f"D={HEAD_DIM}, forward+backward, median of {args.repeats}; backends: "
        f"fastrg {results['fastrg_backend']}, attention "
        f"{results['attention_backend']}, SDPA {results['sdpa_backend']}")
    if "attention" in args.sections:
        log("\n[attention] fixed sampled graph, time in ms")
        results["attention"] = bench_attention(z.sizes, z.densities, device,
                                               args.repeats, args.threads, log)
    if "sampler" in args.sections:
        log(f"\n[sampler] k={CLUSTERS}, distinct edges per second")
        results["sampler"] = bench_sampler(z.sizes, z.densities[1:3], device,
                                           args.repeats, log, z.batch_case)
    if "published" in args.sections:
        log("\n[published] fastrg vs the published-style batched fastRG, "
            "random kaiming-initialized SBM")
        results["published"] = bench_published(device, args.repeats, log,
                                               *z.published_case)
    if "exact" in args.sections:
        log("\n[exact] time per distinct edge, exact vs poisson mode")
        results["exact"] = bench_exact_dense(z.exact_n, 0.9, device,
                                             args.repeats, log)
    if "memory" in args.sections:
        results["memory"], results["edge_buffers"] = bench_memory(
            z, device, args.threads, log)
    if "scaling" in args.sections:
        log(f"\n[scaling] n={z.scaling_n}")
        results["scaling"] = bench_scaling(z.scaling_n, z.scaling_densities, device,
                                           args.repeats, args.threads, log)
    if "layer" in args.sections:
        results["layer"] = layer_section(z.layer_sizes, z.layer_densities, device,
                                         args.repeats, log)
    if "choice" in args.sections:
        results["choice"] = bench_choice(z.layer_n, z.layer_densities[:2], device,
                                         args.repeats, log)
    if "crossover" in args.sections:
        results["crossover"] = []
        for n in z.crossover_sizes:
            log(f"\n[crossover] SBMConv forward+backward, n={n}: sparse "
                f"kernels vs the dense-regime kernel")
            results["crossover"] += bench_crossover(n, z.crossover_densities,
                                                    device, args.repeats, log)
    if "training" in args.sections:
        log(f"\n[training] one step (forward, backward, Adam) of the LRA model "
            f"({2} layers, {HEADS} heads of {HEAD_DIM}, k={CLUSTERS}), batch 1, "
            f"SBM calibrated to each density vs full attention (SDPA)")
        results["training"] = bench_training(z.training_sizes, z.training_densities,
                                             device, args.repeats, args.threads,
                                             log)
    if "ext" in args.sections:
        log(f"\n[ext] torch-scatter / torch-sparse kernels vs ours, n={z.memory_n}, "
            f"time ratio ext / ours")
        results["ext"] = bench_ext(z.memory_n, z.densities[1:3], device,
                                   args.repeats, log)
    if "budget" in args.sections:
        log("\n[budget] one step of --preset repeat-paper, batch 256: fixed "
            "lambda vs a DensityBudget setting it, in turns, time per step")
        results["budget"] = bench_budget(z.budget_sizes, device, args.repeats, log)
    if "mqar" in args.sections:
        results["mqar"] = bench_mqar_head(z.mqar_case, device, args.repeats, log)
    if "gps" in args.sections:
        log("\n[gps] one training step of the GPS CPU preset's model on one "
            "PATTERN-like graph (benchmarks.gps_scaling)")
        results["gps"] = gps_scaling.bench_gps_scaling(
            z.gps_sizes, z.gps_variants, args.repeats, args.threads,
            int(gps_scaling.MEMORY_LIMIT_GIB * 2**30), gps_scaling.TIMEOUT_S,
            gps_scaling.WEIGHTS, log)
    results.update(sharp_sections(args.sections, args.sharp_cases or z.sharp_cases,
                                  z.sharp_conv_case, z.widths_case, device,
                                  args.repeats, getattr(torch, args.sharp_dtype), log))
    if "cuda" in args.sections:
        results["cuda"] = run_cuda_suite(out, args.repeats, args.quick, log)
    out.write_text(json.dumps(results, indent=1))
    log(f"\nwritten to {out}")
    return results


if __name__ == "__main__":
    main()
