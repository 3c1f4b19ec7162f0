r"""The budget suite: one training step of the paper's repeated-token model
(``--preset repeat-paper``: 1 layer, 1 head, width 32, k = 128, batch 256)
with the density penalty at a fixed :math:`\lambda` and with a
:class:`~sbm_pyg.nn.DensityBudget` setting it, in turns: what holding a
budget costs per step, from both starts (the paper's, about 25% of the
pairs, and the dense one, about 99%)."""
from __future__ import annotations

import argparse
from typing import Callable, List

import torch

from benchmarks.measure import median_times


def repeat_step(n: int, sbm_init: str, budget: bool,
                device: torch.device) -> Callable[[], float]:
    """One ``train_step`` of the preset at sequence length ``n``; returns a
    function that runs a step and gives its sampled density."""
    from sbm_pyg.experiments.arguments import train_arguments
    from sbm_pyg.experiments.optim import build_optimizer, build_schedule
    from sbm_pyg.experiments.runs import build_model
    from sbm_pyg.experiments.tasks import make_task
    from sbm_pyg.experiments.train import train_step
    from sbm_pyg.nn import DensityBudget

    args = train_arguments("repeat-paper", out="unused", seq_len=n,
                           sbm_init=sbm_init, lam=0.0 if budget else 1e-3)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    graphs = generator if device.type == "cpu" else \
        torch.Generator(device).manual_seed(0)
    task = make_task(args, generator)
    model = build_model(args).to(device)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    # A target far above the start's density: lambda shrinks step by step
    # but never reaches a branch that skips work, as in a held run.
    held = DensityBudget(model, target=1.0) if budget else None

    def step() -> float:
        # The schedule's position does not change the work of a step.
        schedule.last_epoch = 0
        return train_step(model, model, optimizer, schedule, task, args,
                          device, graphs, held)["density"]

    return step


def bench_budget(sizes, device, repeats, log) -> List[dict]:
    """Time per step with a fixed lambda and with a budget, in turns, per
    sequence length and start."""
    rows = []
    for n in sizes:
        for init in ("paper", "dense"):
            steps = {kind: repeat_step(n, init, kind == "budget", device)
                     for kind in ("lam", "budget")}
            times = median_times(steps, device, repeats)
            density = steps["lam"]()
            row = dict(n=n, sbm_init=init, density=density,
                       lam_ms=times["lam"] * 1e3, budget_ms=times["budget"] * 1e3,
                       ratio=times["budget"] / times["lam"])
            rows.append(row)
            log(f"  N={n:4d} {init:5s} start (density {density:.2f}): fixed "
                f"lambda {row['lam_ms']:.1f} ms, budget {row['budget_ms']:.1f} "
                f"ms, ratio {row['ratio']:.3f}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    bench_budget(a.sizes, torch.device(a.device), a.repeats,
                 lambda s: print(s, flush=True))
