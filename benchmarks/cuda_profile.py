r"""Where the GPU time of the sampler, the layer and a training step goes:
the top kernels by device time (torch.profiler's CUDA activity) beside the
wall time, so that a ratio that misses its target comes with its profile.

    python -m benchmarks.cuda_profile --out profile-cuda.json

``--quick`` runs tiny sizes (on the CPU it times the calls and lists no
kernels: the script is exercised, not measured).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from benchmarks.cases import HEAD_DIM, HEADS, calibrated_conv, sbm_memberships
from benchmarks.layer import cuda_kernels
from benchmarks.measure import median_times
from benchmarks.training import training_step
from sbm_pyg.sampling import fastrg


def profile(name: str, fn: Callable[[], object], device: torch.device,
            repeats: int, log) -> dict:
    """The median wall time of ``fn`` and, on CUDA, its top kernels."""
    wall = median_times({name: fn}, device, repeats)[name]
    row = dict(case=name, wall=wall)
    if device.type == "cuda":
        row["kernels"] = cuda_kernels(fn)
        busy = row["kernels"]["all_kernels"]
        log(f"[{name}] wall {wall * 1e3:.2f} ms, kernels {busy * 1e3:.2f} ms "
            f"({busy / wall:.0%} busy): " + ", ".join(
                f"{k.strip()[:60]} {t * 1e3:.2f}" for k, t in row["kernels"].items()
                if k != "all_kernels"))
    else:
        log(f"[{name}] wall {wall * 1e3:.2f} ms")
    return row


def main(argv: Optional[Sequence[str]] = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sampler_n, layer_n, train_n = (64, 64, 64) if args.quick else (65536, 16384, 4096)
    log = lambda s: print(s, flush=True)  # noqa: E731
    rows = []
    q, block, k, _ = sbm_memberships(sampler_n, 0.01, device)
    for mode in ("poisson", "exact"):
        gen = torch.Generator(device).manual_seed(0)
        rows.append(profile(f"fastrg n={sampler_n} 1% {mode}", lambda: fastrg(
            q, block, k, mode=mode, generator=gen), device, args.repeats, log))
    conv = calibrated_conv(HEADS * HEAD_DIM, 0.01, device)
    x = torch.randn(layer_n, HEADS * HEAD_DIM, device=device, requires_grad=True)
    gen = torch.Generator(device).manual_seed(0)

    def layer():
        out = conv(x, generator=gen)
        torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))
    rows.append(profile(f"SBMConv n={layer_n} 1% fwd+bwd", layer, device,
                        args.repeats, log))
    rows.append(profile(f"LRA step n={train_n} sbm 1%",
                        training_step("sbm", train_n, 0.01, device), device,
                        args.repeats, log))
    args.out.write_text(json.dumps(dict(device=str(device), torch=torch.__version__,
                                        rows=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
