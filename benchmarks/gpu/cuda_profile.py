r"""Where the GPU time of the sampler, the layer and a training step goes:
the top kernels by device time (torch.profiler's CUDA activity) beside the
wall time, so that a ratio that misses its target comes with its profile.

    python -m benchmarks.gpu.cuda_profile --out profile-cuda.json

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
            f"({busy / wall:.0%} busy), {row['kernels']['launches']:.0f} kernel "
            f"launches: " + ", ".join(
                f"{k.strip()[:60]} {t * 1e3:.2f}" for k, t in row["kernels"].items()
                if k not in ("all_kernels", "launches")))
    else:
        log(f"[{name}] wall {wall * 1e3:.2f} ms")
    return row


SECTIONS = ("sampler", "layer", "training", "dense", "parts")


def parts(n: int, device: torch.device, repeats: int, log) -> list:
    """Two parts of the layer against what they replaced, in turns (device
    time): the sampler plan's float64 key masses and maxima per sequence
    (float32 memberships, as the plan takes them) in one
    :func:`torch.segment_reduce` each, in :func:`sequence_reduce`'s two
    passes each, and (where the Triton kernels run) in
    :func:`~sbm_pyg.sampling.key_masses.key_masses`' one pass for both;
    and the memberships' forward+backward as one product per head or per
    chunk of rows (``block_model.ROW_CHUNK``)."""
    from sbm_pyg.nn import block_model
    from sbm_pyg.nn.block_model import StochasticBlockModel
    from sbm_pyg.ops import triton_runs
    from sbm_pyg.sampling.fastrg_torch import sequence_max, sequence_reduce
    from sbm_pyg.sampling.key_masses import key_masses
    z = torch.rand(n, HEADS, 128, device=device)
    ptr = torch.tensor([0, n], device=device)

    def segment(reduce: str) -> torch.Tensor:
        return torch.segment_reduce(z.double(), reduce, offsets=ptr, axis=0,
                                    unsafe=True)
    masses = {
        "segment_reduce": lambda: (segment("sum"), segment("max")),
        "sequence_reduce": lambda: (sequence_reduce(z.double(), ptr, "sum"),
                                    sequence_max(z, ptr))}
    if triton_runs(device):
        masses["key_masses"] = lambda: key_masses(z, ptr)
    sums = median_times(masses, device, repeats, clock="events")
    sbm = StochasticBlockModel(HEADS, HEAD_DIM, 128).to(device)
    x = torch.randn(n, HEADS, HEAD_DIM, device=device, requires_grad=True)

    def membership(chunk: int) -> Callable[[], None]:
        def run():
            block_model.ROW_CHUNK, old = chunk, block_model.ROW_CHUNK
            try:
                out = sbm.membership(x)
            finally:
                block_model.ROW_CHUNK = old
            torch.autograd.grad(out.sum(), [x, *sbm.parameters()])
        return run
    memb = median_times({"one product": membership(n),
                         "row chunks": membership(block_model.ROW_CHUNK)},
                        device, repeats, clock="events")
    for name, times in (("key masses and maxima", sums),
                        ("memberships fwd+bwd", memb)):
        log(f"[parts n={n}] {name}: " + ", ".join(
            f"{k} {t * 1e3:.3f} ms" for k, t in times.items()))
    return [dict(case=f"parts n={n}", key_masses=sums, memberships=memb)]


def dense_step(n: int, precision: str, device: torch.device) -> Callable[[], None]:
    """The dense-regime kernel's forward+backward at full density (k = 128,
    heads of 32), as one call."""
    from sbm_pyg.ops.dense_attention import dense_attention
    q_memb, block, k_memb, ptr = sbm_memberships(n, 1.0, device)
    H, k = q_memb.size(1), q_memb.size(2)
    q_block = torch.einsum("nhu,huv->hnv", q_memb, block).reshape(H * n, k)
    leaves = [t.contiguous().requires_grad_() for t in (
        *(torch.randn(H * n, HEAD_DIM, device=device) for _ in range(3)),
        q_block, k_memb.transpose(0, 1).reshape(H * n, k))]

    def step():
        res = dense_attention(*leaves, ptr, ptr, heads=H, scale=HEAD_DIM**-0.5,
                              seed=1, precision=precision,
                              triton_on_cpu=device.type == "cpu")
        torch.autograd.grad(res.out.sum(), leaves)
    return step


def main(argv: Optional[Sequence[str]] = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS,
                        default=list(SECTIONS))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sampler_n, layer_n, train_n = (64, 64, 64) if args.quick else (65536, 16384, 4096)
    log = lambda s: print(s, flush=True)  # noqa: E731
    dense_n = 64 if args.quick else 16384
    rows = []
    if "sampler" in args.sections:
        q, block, k, _ = sbm_memberships(sampler_n, 0.01, device)
        for mode in ("poisson", "exact"):
            gen = torch.Generator(device).manual_seed(0)
            rows.append(profile(f"fastrg n={sampler_n} 1% {mode}", lambda: fastrg(
                q, block, k, mode=mode, generator=gen), device, args.repeats, log))
    if "layer" in args.sections:
        conv = calibrated_conv(HEADS * HEAD_DIM, 0.01, device)
        x = torch.randn(layer_n, HEADS * HEAD_DIM, device=device, requires_grad=True)
        gen = torch.Generator(device).manual_seed(0)

        def layer():
            out = conv(x, generator=gen)
            torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))
        rows.append(profile(f"SBMConv n={layer_n} 1% fwd+bwd", layer, device,
                            args.repeats, log))
    if "training" in args.sections:
        rows.append(profile(f"LRA step n={train_n} sbm 1%",
                            training_step("sbm", train_n, 0.01, device), device,
                            args.repeats, log))
    if "dense" in args.sections:
        for precision in ("ieee", "bfloat16"):
            rows.append(profile(f"dense n={dense_n} 100% {precision} fwd+bwd",
                                dense_step(dense_n, precision, device), device,
                                args.repeats, log))
    if "parts" in args.sections:
        for n in (64,) if args.quick else (16384, 65536):
            rows += parts(n, device, args.repeats, log)
    args.out.write_text(json.dumps(dict(device=str(device), torch=torch.__version__,
                                        rows=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
