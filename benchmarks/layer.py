r"""The layer suite: the whole ``SBMConv`` (projections, SBM, sampling,
attention) calibrated to a density vs ``torch.nn.MultiheadAttention`` of the
same width."""
from __future__ import annotations

import torch

from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS, calibrated_conv
from benchmarks.measure import median_times


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


def bench_crossover(n: int, densities, device: torch.device, repeats: int,
                    log) -> list:
    """SBMConv forward+backward on the sparse kernels (sampler and fused
    attention) and on the dense-regime kernel, in turns with
    MultiheadAttention, at each calibrated density: where the dense kernel
    starts to pay (``DENSE_CROSSOVER``)."""
    channels = HEADS * HEAD_DIM
    mha = torch.nn.MultiheadAttention(channels, HEADS, batch_first=True).to(device)
    x = torch.randn(n, channels, device=device, requires_grad=True)
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

        times = median_times(dict(sparse=run_conv("cpp"),
                                  dense=run_conv("dense"), mha=run_mha),
                             device, repeats)
        conv.attention_backend = "cpp"
        run_conv("cpp")()
        row = dict(n=n, target_density=density,
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
