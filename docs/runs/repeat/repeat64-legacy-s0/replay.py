"""Replays a training run from one of its kept checkpoints, as it ran and
with one optimizer setting changed at a time, and records every step.

    python docs/runs/repeat/repeat64-legacy-s0/replay.py \
        RUN/checkpoint-1250.pt 50 OUT.json [VARIANT...]

The run must have been trained on one thread (as this script replays it),
so that the unchanged replay repeats its logged losses exactly."""
import argparse
import json
import sys

import torch

from sbm_pyg.experiments.optim import build_optimizer, build_schedule
from sbm_pyg.experiments.runs import build_model, load_checkpoint
from sbm_pyg.experiments.tasks import make_task
from sbm_pyg.experiments.train import train_step

VARIANTS = {
    "as run": {},
    "clip 1.0": dict(clip_grad_norm=1.0),
    "eps 1e-6": dict(adam_eps=1e-6),
    "lr x 0.4 (linear decay's rate here)": dict(lr_scale=0.4),
    "SBM frozen (its lr 0)": dict(sbm_lr_scale=0.0),
}


def replay(checkpoint: str, steps: int, change: dict) -> list:
    torch.set_num_threads(1)
    state = load_checkpoint(checkpoint)
    args = argparse.Namespace(**state["args"])
    generator = torch.Generator()
    task = make_task(args, generator)
    model = build_model(args)
    model.load_state_dict(state["model"])
    optimizer = build_optimizer(model, args)
    optimizer.load_state_dict(state["optimizer"])
    schedule = build_schedule(optimizer, args)
    schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["rng"][0]["torch"])
    generator.set_state(state["rng"][0]["data"])
    # The change, after the restored state (which carries the run's eps).
    args.clip_grad_norm = change.get("clip_grad_norm", args.clip_grad_norm)
    for group in optimizer.param_groups:
        group["eps"] = change.get("adam_eps", group["eps"])
    scales = [change.get("lr_scale", 1.0) * (change.get("sbm_lr_scale", 1.0)
                                             if group["name"] == "sbm" else 1.0)
              for group in optimizer.param_groups]
    schedule.base_lrs = [lr * s for lr, s in zip(schedule.base_lrs, scales)]
    for group, lr, s in zip(optimizer.param_groups, schedule.get_last_lr(), scales):
        group["lr"] = lr * s
    records = []
    for step in range(state["step"] + 1, state["step"] + steps + 1):
        record = train_step(model, model, optimizer, schedule, task, args,
                             torch.device("cpu"), generator)
        records.append(dict(step=step, **record))
    return records


if __name__ == "__main__":
    checkpoint, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    names = sys.argv[4:] or list(VARIANTS)  # optionally, some variants only
    result = {name: replay(checkpoint, steps, VARIANTS[name]) for name in names}
    with open(out, "w") as f:
        json.dump(result, f)
    for name, records in result.items():
        worst = max(records, key=lambda r: r["loss"])
        print(f"{name:40s} max loss {worst['loss']:.4f} (step {worst['step']}), "
              f"max grad norm {max(r['grad_norm'] for r in records):.2f}, "
              f"max update {max(r['max_update_rest'] for r in records):.2e}, "
              f"final loss {records[-1]['loss']:.4f}")
