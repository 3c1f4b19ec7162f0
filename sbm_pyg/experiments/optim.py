r"""The optimizer of a training run: AdamW (or Adam) over two parameter
groups (the SBMs and the rest), a learning-rate schedule with warm-up,
gradient-norm clipping, and the statistics of each step that show an
unstable one (gradient and update norms, the largest update per group).

Defaults (:mod:`~sbm_pyg.experiments.arguments`) follow the paper where it
says something (learning rate, batch, steps) and the published code where
it is silent: AdamW without weight decay, a linear warm-up then linear
decay to 0 (the published LRA runs' one-cycle schedule), no clipping; but
torch's :math:`\epsilon = 10^{-8}`, not the published :math:`10^{-6}`,
which is larger than the SBMs' gradients at the paper's scale and all but
stops them learning."""
from __future__ import annotations

import math
from typing import Dict, List

import torch
from torch import Tensor

__all__ = ["OPTIMIZERS", "SCHEDULES", "parameter_groups", "build_optimizer",
           "build_schedule", "learning_rate_factor", "clip_and_measure",
           "parameters_before", "update_statistics"]

OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("linear", "cosine", "constant")


def parameter_groups(model: torch.nn.Module, args) -> List[dict]:
    r"""The optimizer's two groups, in this order: everything but the SBMs
    (at :obj:`args.lr`), and the SBMs, i.e. cluster embeddings and
    membership MLPs (at :obj:`args.sbm_lr`, default :obj:`args.lr`)."""
    sbm = [p for name, p in model.named_parameters() if ".sbm." in name]
    rest = [p for name, p in model.named_parameters() if ".sbm." not in name]
    return [dict(params=rest, name="rest"),
            dict(params=sbm, name="sbm",
                 lr=args.sbm_lr if args.sbm_lr is not None else args.lr)]


def build_optimizer(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay, :obj:`args.weight_decay`) or Adam (L2
    weight decay) with :obj:`args.adam_eps`, over :func:`parameter_groups`."""
    cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    return cls(parameter_groups(model, args), lr=args.lr, eps=args.adam_eps,
               weight_decay=args.weight_decay)


def learning_rate_factor(step: int, steps: int, warmup_steps: int,
                         schedule: str) -> float:
    r"""The multiple of the base learning rate used by optimizer step
    :obj:`step` (0-based) of :obj:`steps`: :math:`(s + 1) / w` during the
    :obj:`warmup_steps` :math:`w`, then constant, or decaying linearly or
    along a half cosine to 0 after the last step."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(steps - warmup_steps, 1)
    if schedule == "linear":
        return max(1.0 - progress, 0.0)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def build_schedule(optimizer: torch.optim.Optimizer,
                   args) -> torch.optim.lr_scheduler.LambdaLR:
    """:func:`learning_rate_factor` as a scheduler stepped once per
    optimizer step (its state is the step count: a plain int)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(
            step, args.steps, args.warmup_steps, args.schedule))


def _device(optimizer: torch.optim.Optimizer) -> torch.device:
    return next(p.device for g in optimizer.param_groups for p in g["params"])


def _norm(tensors: List[Tensor], device: torch.device) -> Tensor:
    if not tensors:  # on the parameters' device, to be stacked with the rest
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(tensors)


def clip_and_measure(optimizer: torch.optim.Optimizer,
                     max_norm: float) -> Dict[str, Tensor]:
    r"""The gradient norm of each group and of all (before clipping); with
    :obj:`max_norm` > 0 the gradients are then clipped to it in total."""
    grads = {g["name"]: [p.grad for p in g["params"] if p.grad is not None]
             for g in optimizer.param_groups}
    device = _device(optimizer)
    stats = {f"grad_norm_{name}": _norm(gs, device) for name, gs in grads.items()}
    stats["grad_norm"] = torch.linalg.vector_norm(torch.stack(list(stats.values())))
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(
            [p for g in optimizer.param_groups for p in g["params"]],
            max_norm, stats["grad_norm"])
    return stats


def update_statistics(optimizer: torch.optim.Optimizer,
                      before: Dict[str, List[Tensor]]) -> Dict[str, Tensor]:
    r"""Per group, the norm of the update the step made and its largest
    entry (the largest Adam step), from the parameters :obj:`before` it."""
    stats = {}
    device = _device(optimizer)
    for g in optimizer.param_groups:
        deltas = [(p.detach() - b) for p, b in zip(g["params"], before[g["name"]])]
        stats[f"update_norm_{g['name']}"] = _norm(deltas, device)
        stats[f"max_update_{g['name']}"] = (
            torch.stack([d.abs().max() for d in deltas]).max()
            if deltas else torch.zeros((), device=device))
    return stats


def parameters_before(optimizer: torch.optim.Optimizer) -> Dict[str, List[Tensor]]:
    """A copy of every group's parameters (for :func:`update_statistics`)."""
    return {g["name"]: [p.detach().clone() for p in g["params"]]
            for g in optimizer.param_groups}
