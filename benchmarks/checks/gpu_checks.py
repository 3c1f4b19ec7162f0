r"""The checks a GPU machine runs that the CPU cannot: the CUDA kernels
against the CPU kernels at the model's sizes, and the dense-regime kernel's
precisions against SDPA.

    python -m benchmarks.checks.gpu_checks --out gpu-checks.json

Sections (each writes the JSON as it ends, so that a cut run keeps what it
measured):

* ``sampler``: the Triton sampler on CUDA against the C++ sampler on CPU
  copies, same row streams (seed), at n = 4096, k = 128, densities 5% and
  30%, both modes: the edge sets' Jaccard index (>= 0.999 expected: the
  two differ only where a sum or an exp rounds a uniform's comparison the
  other way).
* ``mask``: the dense-regime kernel's mask on CUDA against the CPU
  kernel's for the same seed, head sizes 32 and 64, k = 128, in each
  precision (``ieee``, ``tf32``, ``bfloat16``, ``float16``: the mask's
  probabilities in float32 or three-pass TF32): bits that differ per
  million pairs.
* ``dense``: the dense-regime kernel forward and forward+backward in each
  precision, in turns with SDPA (bfloat16 and float32) at 30/50/100%
  density, with the dropout on and off.

``--quick`` runs tiny sizes on the CPU (the Triton kernels under the
interpreter, ``TRITON_INTERPRET=1``, against the same CPU kernels), so
that the script cannot rot; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from benchmarks.cases import sbm_memberships
from benchmarks.cuda import four_d, grad, sdpa_kernel
from benchmarks.measure import median_times
from sbm_pyg.ops.dense_attention import dense_attention
from sbm_pyg.sampling import fastrg, fastrg_op

PRECISIONS = ("ieee", "tf32", "bfloat16", "float16")


def _keys(graph) -> torch.Tensor:
    # Each edge as one int64, (h N_q + i) N_k + j.
    n_q, n_k = graph.num_queries, graph.num_keys
    return ((graph.head * n_q + graph.edge_index[0]) * n_k
            + graph.edge_index[1]).sort().values


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """The Jaccard index of two sorted sets of int64 keys."""
    common = int(torch.isin(a, b).sum())
    union = a.numel() + b.numel() - common
    return common / union if union else 1.0


def check_sampler(n: int, densities: Sequence[float], device: torch.device,
                  log) -> List[dict]:
    """The device's sampler against the C++ sampler, same seed."""
    rows = []
    seed = 2**61 + 12345
    real = fastrg_op.stream_seed
    fastrg_op.stream_seed = lambda *_: seed  # the same streams on both
    try:
        for density in densities:
            q, block, k, ptr = sbm_memberships(n, density, torch.device("cpu"))
            for mode in ("exact", "poisson"):
                kw = dict(ptr_q=ptr, ptr_k=ptr, mode=mode, self_loops=True)
                ref = fastrg(q, block, k, backend="cpp", **kw)
                out = fastrg(q.to(device), block.to(device), k.to(device),
                             backend="triton",
                             **dict(kw, ptr_q=ptr.to(device), ptr_k=ptr.to(device)))
                a, b = _keys(ref).to(device), _keys(out)
                row = dict(n=n, clusters=q.size(2), heads=q.size(1), mode=mode,
                           target_density=density,
                           density=ref.num_edges / (q.size(1) * n * n),
                           edges_cpp=ref.num_edges, edges_device=out.num_edges,
                           jaccard=jaccard(a, b))
                rows.append(row)
                log(f"  sampler n={n} {mode} {density:.0%}: Jaccard "
                    f"{row['jaccard']:.6f} ({row['edges_cpp']} / "
                    f"{row['edges_device']} edges)")
    finally:
        fastrg_op.stream_seed = real
    return rows


def _dense_inputs(n: int, dim: int, density: float, device: torch.device):
    # Heads-first rows of an SBM calibrated to the density (k = 128).
    q_memb, block, k_memb, ptr = sbm_memberships(n, density, torch.device("cpu"))
    heads, k = q_memb.size(1), q_memb.size(2)
    q_block = torch.einsum("nhu,huv->hnv", q_memb, block).reshape(heads * n, k)
    k_rows = k_memb.transpose(0, 1).reshape(heads * n, k)
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(heads * n, dim, generator=g) for _ in range(3)]
    return [t.contiguous().to(device) for t in (*x, q_block, k_rows)], ptr.to(device), heads


def check_mask(n: int, dims: Sequence[int], density: float,
               device: torch.device, log) -> List[dict]:
    """Mask bits of the device's dense kernel against the CPU kernel's, per
    million pairs, in each precision."""
    rows = []
    for dim in dims:
        args, ptr, heads = _dense_inputs(n, dim, density, torch.device("cpu"))
        kw = dict(heads=heads, scale=dim**-0.5, seed=2**40 + 7, ste=None)
        with torch.no_grad():
            ref = dense_attention(*args, ptr, ptr, **kw)
            bits_ref = _unpack(ref.mask.to(device))
            for precision in PRECISIONS:
                res = dense_attention(*(t.to(device) for t in args),
                                      ptr.to(device), ptr.to(device),
                                      precision=precision,
                                      triton_on_cpu=device.type == "cpu", **kw)
                differ = int((_unpack(res.mask) != bits_ref).sum())
                pairs = heads * n * n
                err = float((res.out.cpu() - ref.out).abs().max()) \
                    if torch.equal(res.mask.cpu(), ref.mask) else None
                row = dict(n=n, dim=dim, heads=heads, clusters=args[3].size(1),
                           density=int(ref.edges.sum()) / pairs,
                           precision=precision, pairs=pairs,
                           differing_bits=differ,
                           per_million=differ / pairs * 1e6,
                           out_max_error=err)
                rows.append(row)
                log(f"  mask D={dim} {precision}: {differ} bits differ "
                    f"({row['per_million']:.3f} per million pairs), output "
                    f"max error {err}")
    return rows


def _unpack(mask: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    return (mask[:, None] >> shifts) & 1


def dense_precisions(n: int, dims: Sequence[int], densities: Sequence[float],
                device: torch.device, repeats: int, log,
                dropouts: Sequence[float] = (0.0, 0.1)) -> List[dict]:
    """The dense kernel forward and forward+backward in each precision, in
    turns with SDPA on the same rows."""
    rows = []
    for dim in dims:
        for density in densities:
            args, ptr, heads = _dense_inputs(n, dim, density, device)
            leaves = [t.requires_grad_() for t in args]
            q4, k4, v4 = four_d(*(t.detach().view(heads, n, dim).transpose(0, 1)
                                  for t in leaves[:3]))
            sd32 = [t.detach().requires_grad_() for t in (q4, k4, v4)]
            sd16 = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q4, k4, v4)]
            edges: List[int] = []

            def dense(precision: str, dropout: float, backward: bool):
                def run():
                    with torch.set_grad_enabled(backward):
                        res = dense_attention(
                            *leaves, ptr, ptr, heads=heads, scale=dim**-0.5,
                            seed=3, ste="paper", precision=precision,
                            dropout=dropout, dropout_seed=5,
                            triton_on_cpu=device.type == "cpu")
                    edges.append(int(res.edges.sum()))
                    if backward:
                        grad(res.out, leaves)
                return run

            def sdpa(x, backward):
                def run():
                    with torch.set_grad_enabled(backward):
                        out = F.scaled_dot_product_attention(*x)
                    if backward:
                        grad(out, x)
                return run

            for backward in (False, True):
                fns: Dict[str, Callable[[], object]] = {
                    "sdpa_bf16": sdpa(sd16, backward),
                    "sdpa_fp32": sdpa(sd32, backward)}
                for precision in PRECISIONS:
                    for p in dropouts:
                        fns[f"dense_{precision}" + (f"_drop{p}" if p else "")] = \
                            dense(precision, p, backward)
                times = median_times(fns, device, repeats, clock="events")
                row = dict(n=n, heads=heads, dim=dim, clusters=args[3].size(1),
                           target_density=density,
                           density=edges[-1] / (heads * n * n),
                           backward=backward,
                           sdpa_kernel_bf16=sdpa_kernel(*sd16) if device.type == "cuda" else "cpu",
                           sdpa_kernel_fp32=sdpa_kernel(*sd32) if device.type == "cuda" else "cpu",
                           **{f"{m}_time": t for m, t in times.items()})
                for m, t in times.items():
                    if m.startswith("dense"):
                        row[f"{m}_vs_sdpa_bf16"] = t / times["sdpa_bf16"]
                rows.append(row)
                log(f"  dense n={n} D={dim} {density:.0%} "
                    f"{'fwd+bwd' if backward else 'fwd'}: SDPA bf16 "
                    f"{times['sdpa_bf16'] * 1e3:.3f} ms; " + ", ".join(
                        f"{m[6:]} {t / times['sdpa_bf16']:.2f}x"
                        for m, t in times.items() if m.startswith("dense")))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-checks.json"))
    parser.add_argument("--sections", nargs="+", default=["sampler", "mask", "dense"],
                        choices=["sampler", "mask", "dense"])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (CPU tensors under the interpreter)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dense-sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.quick:
        sampler_n, mask_n, dense_sizes, dims = 48, 40, [40], [32]
    else:
        sampler_n, mask_n, dense_sizes, dims = 4096, 2048, args.dense_sizes, [32, 64]
    result: Dict[str, object] = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__, command=" ".join(sys.argv), quick=args.quick)

    def log(text: str) -> None:
        print(text, flush=True)

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    for section in args.sections:
        start = time.perf_counter()
        log(f"{section}:")
        if section == "sampler":
            result["sampler"] = check_sampler(sampler_n, (0.05, 0.3), device, log)
        elif section == "mask":
            result["mask"] = check_mask(mask_n, dims, 0.5, device, log)
        else:
            result["dense"] = [row for n in dense_sizes for row in dense_precisions(
                n, dims, (0.3, 0.5, 1.0), device, args.repeats, log)]
        log(f"  ({time.perf_counter() - start:.0f} s)")
        save()
    return result


if __name__ == "__main__":
    main()
