r"""``SBMConv`` with static shapes (its :obj:`capacity`) on the CPU: the
calibrated layer's forward and backward as it runs by default (shapes
from the edge count), with a capacity eagerly, and with a capacity
compiled by :func:`torch.compile` (inductor, ``fullgraph=True``,
``dynamic=False``), against ``torch.nn.MultiheadAttention``, in turns;
the compile's time (cold: inductor's caches off); and the operators and
host reads of one eager call of each route.

    python -m benchmarks.static_layer --out results.json [--sizes 4096]
        [--densities 0.05 0.01] [--repeats 7] [--device cuda
        --compile-mode reduce-overhead]

On a GPU, ``--compile-mode reduce-overhead`` replays the compiled layer
as CUDA graphs: the route the static shapes are for (``--sizes 16384
--densities 0.01`` is the GPU targets' case).

The capacity is :func:`~sbm_pyg.sampling.round_capacity` of the expected draws
that a first static call reports. Run it with nothing else on the
machine.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch._inductor.config

from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS, calibrated_conv
from benchmarks.launches import count_ops
from benchmarks.measure import median_times
from sbm_pyg.sampling import round_capacity


def bench_static(n: int, density: float, repeats: int, log,
                 device: torch.device = torch.device("cpu"),
                 compile_mode: Optional[str] = None) -> dict:
    """The four variants at one size and density (see the module);
    :obj:`compile_mode` is :func:`torch.compile`'s (``"reduce-overhead"``:
    CUDA graphs on a GPU)."""
    channels = HEADS * HEAD_DIM
    conv = calibrated_conv(channels, density, device)
    mha = torch.nn.MultiheadAttention(channels, HEADS, batch_first=True).to(device)
    x = torch.randn(n, channels, device=device, requires_grad=True)
    params = [x] + list(conv.parameters())
    conv.capacity = 1  # a first static call reports the expected draws
    conv(x)
    draws = float(conv.expected_draws)
    conv.capacity = capacity = round_capacity(draws)
    # A cold compile, whatever this machine compiled before.
    torch._inductor.config.force_disable_caches = True
    compiled = torch.compile(conv, fullgraph=True, dynamic=False, mode=compile_mode)
    start = time.perf_counter()
    torch.autograd.grad(compiled(x).sum(), params)
    compile_time = time.perf_counter() - start

    def run(layer, static: bool):
        def call():
            conv.capacity = capacity if static else None
            torch.autograd.grad(layer(x).sum(), params)
        return call

    def run_mha():
        out, _ = mha(x[None], x[None], x[None], need_weights=False)
        torch.autograd.grad(out.sum(), [x] + list(mha.parameters()))

    # Operators dispatched and host reads of one eager call of each route
    # (counts, not timings: a GPU launches at least one kernel an operator
    # unless the call is compiled or captured).
    ops = {name: count_ops(run(conv, static))
           for name, static in (("default", False), ("static", True))}
    times = median_times(dict(default=run(conv, False), static=run(conv, True),
                              compiled=run(compiled, True), mha=run_mha),
                         device, repeats)
    overflow = bool(conv.overflow)
    row = dict(n=n, device=str(device), compile_mode=compile_mode,
               channels=channels, heads=HEADS, clusters=CLUSTERS,
               target_density=density,
               sampled_density=float(conv.sampled_density.mean()),
               expected_draws=draws, capacity=capacity, overflow=overflow,
               compile_time=compile_time,
               **{f"{k}_ops": {f: v[f] for f in ("ops", "views", "host_reads", "reads")}
                  for k, v in ops.items()},
               **{f"{k}_time": v for k, v in times.items()},
               **{f"{k}_vs_mha": times[k] / times["mha"]
                  for k in ("default", "static", "compiled")})
    log(f"[static] n={n}, ~{density:.0%}: sampled {row['sampled_density']:.4f}, "
        f"capacity {capacity} (expected draws {draws:.0f}, overflow {overflow}); "
        + ", ".join(f"{k} {times[k] * 1e3:.1f} ms" for k in times)
        + f"; vs MHA: default {row['default_vs_mha']:.3f}x, static "
        f"{row['static_vs_mha']:.3f}x, compiled {row['compiled_vs_mha']:.3f}x; "
        f"compile {compile_time:.0f} s; operators (views) and host reads a call: "
        + ", ".join(f"{k} {v['ops']} ({v['views']}), {v['host_reads']}"
                    for k, v in ops.items()))
    return row


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--densities", type=float, nargs="+", default=[0.05, 0.01])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile-mode", default=None,
                        choices=["default", "reduce-overhead", "max-autotune"],
                        help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = [bench_static(n, d, args.repeats, print, torch.device(args.device),
                         args.compile_mode)
            for n in args.sizes for d in args.densities]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(
            command="python -m benchmarks.static_layer " + " ".join(
                argv if argv is not None else __import__("sys").argv[1:]),
            threads=torch.get_num_threads(), torch=torch.__version__,
            rows=rows), indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
