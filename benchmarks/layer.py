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
