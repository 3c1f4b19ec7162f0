"""Which parameters' updates lower the SBM's edge probabilities when the
repeat-task density collapses (an analysis script, not part of the library).

Trains ``--preset repeat-paper --sbm-init paper --sbm-lr 1e-3`` (N = 64 by
default) exactly as ``python -m sbm_pyg train`` does, and every 20 steps
from step 240 to 480 measures, on 16 fixed sequences, the mean SBM probability p by pair class
(self, same token, other) before the optimizer step and how much it changes
when only one parameter group takes its Adam step: each SBM tensor
(``weight1``, ``bias1``, ``weight2``, ``bias2``, ``clusters``) and all the
other parameters together (``non_sbm``: embeddings, query/key projections,
...). ``sgd_<group>`` is the change from a plain gradient step of the same
length as that group's Adam step. One JSON line per measured step::

    python docs/runs/repeat/repeat64-attribution/attribution.py --seq-len 64 \
        > docs/runs/repeat/repeat64-attribution/attribution.jsonl
"""
import argparse
import json
import sys

import torch

from sbm_pyg.experiments import build_model, make_task, repeat_batch
from sbm_pyg.experiments.arguments import PRESETS, add_train_arguments
from sbm_pyg.experiments.diagnose import pair_classes, sbm_probability
from sbm_pyg.experiments.train import parameter_groups

START, STOP, EVERY, PROBE = 240, 480, 20, 16

parser = argparse.ArgumentParser()
add_train_arguments(parser)
# The preset with the paper's LRA initialization and one learning rate: the
# configuration whose density collapses.
parser.set_defaults(**{**PRESETS["repeat-paper"], "sbm_init": "paper", "sbm_lr": None})
args = parser.parse_args(sys.argv[1:] + ["--out", "unused"])
N = args.seq_len

torch.manual_seed(args.seed)  # as train(): the same batches and graphs
generator = torch.Generator().manual_seed(args.seed * 1000)
task = make_task(args, generator)
model = build_model(args)
optimizer = torch.optim.Adam(parameter_groups(model, args), lr=args.lr)
conv = model.blocks[0].attention.conv
probe, _ = repeat_batch(PROBE, N, torch.Generator().manual_seed(12345))
classes = pair_classes(probe)[:, None]  # [B, 1, N, N]
groups = {name: [p] for name, p in conv.sbm.named_parameters()}
groups["non_sbm"] = [p for name, p in model.named_parameters() if ".sbm." not in name]


def mean_p() -> list:
    p = sbm_probability(model, probe)
    return [float(p[(classes == c).expand_as(p)].mean()) for c in range(3)]


@torch.no_grad()
def set_group(name: str, values: list) -> None:
    for p, v in zip(groups[name], values):
        p.copy_(v)


def change(p_new: list, p_old: list) -> list:
    return [a - b for a, b in zip(p_new, p_old)]


for step in range(1, STOP + 1):
    model.train()
    tokens, mask, labels = task.batch()
    out = model(tokens, mask, generator=generator, output=task.output)
    loss, correct, count = task.loss_and_correct(out, mask, labels)
    optimizer.zero_grad()
    loss.backward()
    measure = step >= START and step % EVERY == 0
    if measure:
        before = {n: [p.detach().clone() for p in ps] for n, ps in groups.items()}
        grads = {n: [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                     for p in ps] for n, ps in groups.items()}
    optimizer.step()
    if not measure:
        continue
    after = {n: [p.detach().clone() for p in ps] for n, ps in groups.items()}
    p_after = mean_p()
    for name in groups:
        set_group(name, before[name])
    p_before = mean_p()
    record = dict(step=step, loss=float(loss.detach()), accuracy=float(correct) / count,
                  density=float(out.sampled_density.mean()), classes=["self", "same_token",
                                                                      "other"],
                  p=p_before, dp_all=change(p_after, p_before))
    for name in groups:
        set_group(name, after[name])
        record["dp_" + name] = change(mean_p(), p_before)
        length = sum(float((a - b).norm() ** 2) for a, b in zip(after[name], before[name]))
        norm = sum(float(g.norm() ** 2) for g in grads[name])
        scale = (length / max(norm, 1e-60)) ** 0.5
        set_group(name, [b - scale * g for b, g in zip(before[name], grads[name])])
        record["dp_sgd_" + name] = change(mean_p(), p_before)
        set_group(name, before[name])
    for name in groups:
        set_group(name, after[name])
    print(json.dumps(record), flush=True)
