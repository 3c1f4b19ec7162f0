r"""The layer suite: the whole ``SBMConv`` (projections, SBM, sampling,
attention) calibrated to a density vs ``torch.nn.MultiheadAttention`` of the
same width."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS, calibrated_conv
from benchmarks.measure import median_times
from sbm_pyg.ops import backends
from sbm_pyg.ops.backend_info import resolve_backend

#: The parts of a layer call, by the operators whose own time they take
#: (torch.profiler's self time); every other operator is glue: layout
#: copies, indexing, the density statistics, autograd's bookkeeping.
PARTS = {
    "sampler": ("sbm_pyg::fastrg_plan", "sbm_pyg::fastrg_sample"),
    # The forward kernel runs inside the autograd wrapper that
    # torch.library registers, and its time is that wrapper's.
    "attention_forward": (
        "sbm_pyg::sparse_attention",
        "GeneratedBackwardFor_sbm_pyg_sparse_attention_default"),
    "attention_backward": (
        "sbm_pyg::sparse_attention_backward",
        "GeneratedBackwardFor_sbm_pyg_sparse_attention_defaultBackward"),
    # The SBM's MLP, memberships and Q̂Ŝ, and the layer's projections: the
    # matrix products and the MLP's pointwise functions.
    "products": ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm",
                 "aten::sigmoid", "aten::sigmoid_backward", "aten::relu",
                 "aten::threshold_backward", "aten::_softmax",
                 "aten::_softmax_backward_data"),
}


def breakdown(fn: Callable[[], object], calls: int = 3) -> Dict[str, float]:
    """Seconds per call of each part of :data:`PARTS` and of the glue (the
    rest), from torch.profiler's self CPU time over ``calls`` calls, and
    the wall time of the profiled calls (``total``)."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    owner = {op: part for part, ops in PARTS.items() for op in ops}
    out = dict.fromkeys([*PARTS, "glue"], 0.0)
    for event in prof.key_averages():
        out[owner.get(event.key, "glue")] += event.self_cpu_time_total / 1e6
    out = {part: t / calls for part, t in out.items()}
    out["total"] = sum(out.values())
    return out


def cuda_kernels(fn: Callable[[], object], calls: int = 3,
                 top: int = 15) -> Dict[str, float]:
    """Seconds per call of the ``top`` GPU kernels by device time (their
    names: the Triton kernels' function names, aten's kernels), from
    torch.profiler's CUDA activity over ``calls`` calls, and the sum of all
    kernels (``all_kernels``, user annotations not counted): beside the
    wall time, what the GPU is idle; and the kernels launched a call
    (``launches``, a count)."""
    fn()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    # The device timeline also carries user annotations (an optimizer's
    # "Optimizer.step#Adam.step" range spans kernels already counted): only
    # the kernels count as busy time.
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"
               and not getattr(e, "is_user_annotation", False)]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    out = {e.key[:80]: e.self_device_time_total / 1e6 / calls for e in kernels[:top]}
    out["all_kernels"] = sum(e.self_device_time_total for e in kernels) / 1e6 / calls
    # Kernels launched a call (a count, not seconds): the host's share of a
    # call is about their number times a launch's cost.
    out["launches"] = sum(e.count for e in kernels) / calls
    return out


def format_breakdown(parts: Dict[str, float]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {t * 1e3:.1f}"
                     for name, t in parts.items() if name != "launches") + " ms" + (
        f", {parts['launches']:.0f} kernel launches" if "launches" in parts else "")


def bench_layer(n: int, density: float, device: torch.device, repeats: int,
                log, autocast: bool = False) -> dict:
    """SBMConv forward+backward at a calibrated density against
    MultiheadAttention, in turns; ``autocast``: both under bfloat16
    autocast (MultiheadAttention's SDPA then runs in bfloat16)."""
    channels = HEADS * HEAD_DIM
    conv = calibrated_conv(channels, density, device)
    mha = torch.nn.MultiheadAttention(channels, HEADS, batch_first=True).to(device)
    x = torch.randn(n, channels, device=device, requires_grad=True)
    gen = torch.Generator(device).manual_seed(0)

    def cast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast)

    def run_conv():
        with cast():
            out = conv(x, generator=gen)
        torch.autograd.grad(out.float().sum(), [x] + list(conv.parameters()))

    def run_mha():
        with cast():
            out, _ = mha(x[None], x[None], x[None], need_weights=False)
        torch.autograd.grad(out.float().sum(), [x] + list(mha.parameters()))

    times = median_times(dict(sbmconv=run_conv, mha=run_mha), device, repeats)
    result = dict(n=n, channels=channels, heads=HEADS, clusters=CLUSTERS,
                  autocast="bfloat16" if autocast else None,
                  sbmconv_time=times["sbmconv"],
                  sampled_density=float(conv.sampled_density.mean()),
                  mha_time=times["mha"])
    result["ratio"] = result["sbmconv_time"] / result["mha_time"]
    log(f"  SBMConv {result['sbmconv_time'] * 1e3:.1f} ms at density "
        f"{result['sampled_density']:.4f} vs MultiheadAttention "
        f"{result['mha_time'] * 1e3:.1f} ms: {result['ratio']:.3f}x"
        + (" (bfloat16 autocast)" if autocast else ""))
    if device.type == "cpu":  # the profiler's CPU self times
        result["breakdown"] = breakdown(run_conv)
        log(f"  SBMConv's parts: {format_breakdown(result['breakdown'])}")
    elif device.type == "cuda":
        try:
            result["cuda_kernels"] = cuda_kernels(run_conv)
        except Exception as e:  # noqa: BLE001 - the profile is extra, the timing stands
            log(f"  no kernel profile: {type(e).__name__}: {e}")
        else:
            log(f"  SBMConv's GPU kernels: {format_breakdown(result['cuda_kernels'])}")
    return result


def layer_section(sizes: Sequence[int], densities: Sequence[float],
                  device: torch.device, repeats: int, log) -> List[dict]:
    """The suite's ``layer`` section: :func:`bench_layer` at every size and
    density."""
    rows = []
    for n in sizes:
        for density in densities:
            log(f"\n[layer] n={n}, width {HEADS * HEAD_DIM}, calibrated "
                f"to ~{density:.0%} expected density")
            rows.append(bench_layer(n, density, device, repeats, log))
    return rows


def bench_choice(n: int, densities: Sequence[float], device: torch.device,
                 repeats: int, log) -> List[dict]:
    """What ``attention_backend="auto"``'s regime choice costs a layer that
    keeps the edge path: the calibrated SBMConv forward+backward as
    ``"auto"`` runs it (the dense regime weighed by the expected density,
    the tiles by :func:`~sbm_pyg.sampling.tiles.tile_edges`) against the
    same layer with its sparse kernel named (nothing weighed), in turns."""
    channels = HEADS * HEAD_DIM
    kernel = resolve_backend("attention", "auto", device)
    log(f"\n[choice] SBMConv forward+backward, n={n}: \"auto\" against its "
        f"sparse kernel named (what weighing the regimes costs)")
    x = torch.randn(n, channels, device=device, requires_grad=True)
    rows = []
    for density in densities:
        convs = {name: calibrated_conv(channels, density, device,
                                       attention_backend=backend)
                 for name, backend in (("auto", "auto"), ("named", kernel))}
        gen = torch.Generator(device).manual_seed(0)

        def run(conv):
            def call():
                out = conv(x, generator=gen)
                torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))
            return call

        times = median_times({k: run(c) for k, c in convs.items()}, device, repeats)
        row = dict(n=n, density=density, auto_time=times["auto"],
                   named_time=times["named"], kernel=kernel,
                   auto_backends=dict(convs["auto"].last_backends or {}),
                   overhead=times["auto"] / times["named"] - 1)
        log(f"  n={n} ~{density:.0%}: \"auto\" ({row['auto_backends'].get('attention')}) "
            f"{row['auto_time'] * 1e3:.1f} ms vs the {kernel} kernel named "
            f"{row['named_time'] * 1e3:.1f} ms: {row['overhead']:+.1%}")
        rows.append(row)
    return rows


def bench_crossover(n: int, densities, device: torch.device, repeats: int,
                    log) -> list:
    """SBMConv forward+backward on the sparse kernels (sampler and fused
    attention) and on the dense-regime kernel, in turns with
    MultiheadAttention, at each calibrated density: where the dense kernel
    starts to pay (``DENSE_CROSSOVER``)."""
    channels = HEADS * HEAD_DIM
    mha = torch.nn.MultiheadAttention(channels, HEADS, batch_first=True).to(device)
    x = torch.randn(n, channels, device=device, requires_grad=True)
    # The sparse kernels "auto" runs here ("cpp" on the CPU, "triton" on CUDA).
    sparse = backends(device)["attention"]
    rows = []
    for density in densities:
        conv = calibrated_conv(channels, density, device)
        gen = torch.Generator(device).manual_seed(0)

        def run_conv(backend):
            def run():
                conv.attention_backend = backend
                out = conv(x, generator=gen)
                torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))
            return run

        def run_mha():
            out, _ = mha(x[None], x[None], x[None], need_weights=False)
            torch.autograd.grad(out.sum(), [x] + list(mha.parameters()))

        times = median_times(dict(sparse=run_conv(sparse),
                                  dense=run_conv("dense"), mha=run_mha),
                             device, repeats)
        run_conv(sparse)()
        row = dict(n=n, target_density=density, sparse_backend=sparse,
                   sampled_density=float(conv.sampled_density.mean()),
                   **{f"{k}_time": v for k, v in times.items()})
        row["dense_vs_sparse"] = times["dense"] / times["sparse"]
        row["sparse_vs_mha"] = times["sparse"] / times["mha"]
        row["dense_vs_mha"] = times["dense"] / times["mha"]
        rows.append(row)
        log(f"  density {row['sampled_density']:.3f}: sparse "
            f"{times['sparse'] * 1e3:.1f} ms, dense {times['dense'] * 1e3:.1f} "
            f"ms, MultiheadAttention {times['mha'] * 1e3:.1f} ms; dense/sparse "
            f"{row['dense_vs_sparse']:.2f}, sparse/MHA "
            f"{row['sparse_vs_mha']:.2f}, dense/MHA {row['dense_vs_mha']:.2f}")
    return rows
