r"""The training suite: one training step (forward, backward, Adam) of the
paper's LRA model, ``SBMTransformer`` with 2 layers, 2 heads of 32, width 64
and k=128, against the same model with full attention (SDPA), at growing
sequence lengths and SBM densities: where SBM attention pays off."""
from __future__ import annotations

import math
import os
from typing import Callable, List

import torch

from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS
from benchmarks.measure import MEMORY, median_times, subprocess_peak

TOKENS, LAYERS, CALIBRATION_N = 16, 2, 1024
# From this density on, the step is also timed with the SBM layers held on
# the sparse kernels, beside "auto" (which takes the dense kernel there).
SPARSE_FROM = 0.2


def model(attention: str, max_len: int, density: float) -> torch.nn.Module:
    """The LRA model; with ``attention="sbm"`` its SBMs are fitted so that the
    expected density of every layer and head is about ``density`` on random
    tokens (at ``CALIBRATION_N`` tokens: the density is a fraction of pairs,
    and the position embeddings are i.i.d. at initialization)."""
    from sbm_pyg.models import SBMTransformer
    torch.manual_seed(0)
    net = SBMTransformer(TOKENS, max_len, channels=HEADS * HEAD_DIM,
                         num_layers=LAYERS, heads=HEADS, head_channels=HEAD_DIM,
                         num_clusters=CLUSTERS, attention=attention,
                         **(dict(exploration=0.0) if attention == "sbm" else {}))
    if attention == "sbm":
        sbms = [p for b in net.blocks for p in b.attention.conv.sbm.parameters()]
        opt = torch.optim.Adam(sbms, lr=3e-2)
        g = torch.Generator().manual_seed(0)
        for _ in range(80):
            tokens = torch.randint(TOKENS, (1, min(CALIBRATION_N, max_len)),
                                   generator=g)
            out = net(tokens, generator=g)
            loss = (out.expected_density.log() - math.log(density)).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.zero_grad(set_to_none=True)
    return net


def training_step(attention: str, n: int, density: float,
                  device: torch.device) -> Callable[[], dict]:
    """One step of sequence classification on random tokens;
    ``attention="sbm-sparse"`` keeps the SBM layers on the sparse kernels
    (sampler and fused attention) at every density."""
    sparse = attention == "sbm-sparse"
    net = model("sbm" if sparse else attention, n, density).to(device)
    if sparse:
        from sbm_pyg.ops import backends
        for block in net.blocks:
            block.attention.conv.attention_backend = backends(device)["attention"]
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    g = torch.Generator(device).manual_seed(1)
    tokens = torch.randint(TOKENS, (1, n), generator=g, device=device)
    label = torch.zeros(1, dtype=torch.long, device=device)

    def step() -> dict:
        out = net(tokens, generator=g, output="sequence")
        loss = torch.nn.functional.cross_entropy(out.seq_logits, label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ran = getattr(net, "last_backends", None)
        return dict(density=(float(out.sampled_density.mean())
                             if out.sampled_density is not None else 1.0),
                    attention=ran["attention"] if ran else "sdpa")

    return step


def bench_training(sizes, densities, device, repeats, threads, log) -> List[dict]:
    """Time per step in turns (full attention and each density at one n), and
    the peak memory of one step in a fresh process (CPU) or from the
    caching allocator (CUDA)."""
    rows = []
    for n in sizes:
        steps = {"full": training_step("full", n, 1.0, device)}
        for density in densities:
            steps[f"sbm@{density}"] = training_step("sbm", n, density, device)
            if density >= SPARSE_FROM:  # the sparse kernels beside, in turns
                steps[f"sbm-sparse@{density}"] = training_step(
                    "sbm-sparse", n, density, device)
        times = median_times(steps, device, repeats)
        row = dict(n=n, full=dict(time=times["full"]))
        row["full"]["memory"] = step_memory("full", n, 1.0, device, threads)
        for name in steps:
            if name == "full":
                continue
            attention, density = name.split("@")[0], float(name.split("@")[1])
            ran = steps[name]()
            case = dict(time=times[name], sampled_density=ran["density"],
                        attention=ran["attention"],
                        memory=step_memory(attention, n, density, device,
                                           threads))
            case["time_vs_full"] = case["time"] / times["full"]
            case["memory_vs_full"] = case["memory"] / max(row["full"]["memory"], 1)
            row[name] = case
        ratios = [row[f"sbm@{d}"]["time_vs_full"] for d in densities]
        row["crossover_density"] = crossover(densities, ratios)
        rows.append(row)
        log(format_training_row(row, densities))
        steps.clear()
    return rows


def crossover(densities, ratios) -> float | None:
    """The density where the time ratio SBM / full reaches 1, interpolated
    log-linearly between the measured densities; None outside them."""
    points = list(zip(densities, ratios))
    for (d0, r0), (d1, r1) in zip(points, points[1:]):
        if (r0 - 1) * (r1 - 1) <= 0 and r0 != r1:
            t = (math.log(r0)) / (math.log(r0) - math.log(r1))
            return math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))
    return None


def step_memory(attention: str, n: int, density: float, device: torch.device,
                threads: int) -> int:
    if device.type == "cuda":
        from benchmarks.measure import cuda_peak
        step = training_step(attention, n, density, device)
        step()
        return cuda_peak(step, device)
    if MEMORY["method"] == "subprocess" and os.path.exists("/proc/self/clear_refs"):
        spec = dict(method=f"train-{attention}", n=n, density=density,
                    threads=threads)
        return int(subprocess_peak(spec))
    from benchmarks.measure import _profiler_peak
    step = training_step(attention, n, density, device)
    step()
    return _profiler_peak(step)


def format_training_row(row: dict, densities) -> str:
    parts = [f"full {row['full']['time'] * 1e3:8.1f} ms "
             f"{row['full']['memory'] / 2**20:7.1f} MiB"]
    names = [k for k in row if k.startswith("sbm")]
    for name in names:
        c, d = row[name], name.split("@")[1]
        parts.append(f"{name.split('@')[0]}@{d} ({c['attention']}, sampled "
                     f"{c['sampled_density']:.3f}) "
                     f"{c['time'] * 1e3:8.1f} ms = {c['time_vs_full']:.2f}x, "
                     f"{c['memory'] / 2**20:7.1f} MiB = {c['memory_vs_full']:.2f}x")
    cross = row["crossover_density"]
    parts.append("crossover " + (f"{cross:.3f}" if cross is not None else "-"))
    return f"  n={row['n']:>5}  " + "  ".join(parts)


def bench_mqar_head(case: tuple, device: torch.device, repeats: int,
                    log: Callable[[str], None]) -> dict:
    """One training step (forward, backward, Adam) of an MQAR model, full
    attention (SDPA), 2 layers of width 64, batch 64, at ``case`` = (N,
    pairs, vocabulary): its token head over every position against the
    asked positions only (``SBMTransformer(..., positions=)``), in turns;
    the same batch and loss."""
    from sbm_pyg.experiments.tasks import MQARTask, task_forward
    from sbm_pyg.models import SBMTransformer
    n, pairs, vocab = case
    log("\n[mqar] one training step of an MQAR model (full attention, 2 "
        "layers of 64, batch 64): the token head at every position vs the "
        "asked ones, in turns")
    torch.manual_seed(0)
    net = SBMTransformer(vocab, n, channels=64, num_layers=2, heads=2,
                         attention="full", token_classes=vocab).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    task = MQARTask(n, pairs, vocab, 64, torch.Generator().manual_seed(0))
    batch = task.batch()

    def step(asked: bool) -> Callable[[], None]:
        def run() -> None:
            tokens, mask, labels = batch
            out = (task_forward(net, task, batch, device) if asked else
                   net(tokens.to(device), mask.to(device), output="token"))
            loss = task.loss_and_correct(out, mask, labels)[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
        return run

    times = median_times({"every": step(False), "asked": step(True)}, device, repeats)
    row = dict(n=n, pairs=pairs, vocab=vocab, every_s=times["every"],
               asked_s=times["asked"], ratio=times["asked"] / times["every"])
    log(f"  N={n}, {pairs} pairs, vocabulary {vocab}: every position "
        f"{times['every'] * 1e3:.0f} ms, asked positions "
        f"{times['asked'] * 1e3:.0f} ms a step ({row['ratio']:.2f}x)")
    return row
