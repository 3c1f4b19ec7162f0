r"""Training loop of ``python -m sbm_pyg train``: progress bar, metrics,
resumable checkpoints, a final evaluation, and DistributedDataParallel under
``torchrun``. The options are in :mod:`~sbm_pyg.experiments.arguments`, the
run's files in :mod:`~sbm_pyg.experiments.runs`."""
from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, Optional, Set, Tuple, Union

import torch
from torch import Tensor

from sbm_pyg.experiments.batches import held_out_generator
from sbm_pyg.experiments.budget_arguments import BUDGET_LAM
from sbm_pyg.experiments.diagnose import repeat_diagnostics
from sbm_pyg.experiments.optim import (
    build_optimizer,
    build_schedule,
    clip_and_measure,
    parameters_before,
    update_statistics,
)
from sbm_pyg.experiments.recall import RecallMeter
from sbm_pyg.experiments.recipe import Recipe
from sbm_pyg.experiments.runs import (
    build_model,
    jsonable,
    load_checkpoint,
    save_checkpoint,
)
from sbm_pyg.experiments.static_steps import (
    compiled,
    grow_capacity,
    static_stats,
    streams_kept,
    unsized,
)
from sbm_pyg.experiments.tasks import ListOpsTask, MQARTask, RepeatTask, make_task, task_forward
from sbm_pyg.experiments.text import MaskedBytesTask, bits_per_byte
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.nn.losses import DensityBudget

__all__ = ["train", "train_step", "evaluate_model"]

Task = Union[RepeatTask, ListOpsTask, MQARTask, MaskedBytesTask]
# The longest sequences whose evaluation measures the selector's recall
# (dense attention rows: O(N^2) a sequence and head).
RECALL_MAX_LEN = 1024


def train(args) -> dict:  # noqa: PLR0915
    """Trains, checkpoints, evaluates; returns the final metrics (rank 0
    writes OUT/metrics.jsonl, OUT/checkpoint.pt and OUT/final.json)."""
    rank, world, device = _distributed(args.device)
    torch.manual_seed(args.seed + rank)
    # One generator drives the training data and sampled graphs of this rank;
    # evaluations draw from their own (held_out_generator).
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    graph_generator = generator if device.type == "cpu" else \
        torch.Generator(device).manual_seed(args.seed * 1000 + rank)
    task = make_task(args, generator)
    model = build_model(args).to(device)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    recipe = Recipe(args, args.out if args.resume else None)
    if recipe.name == "teacher" and world > 1:
        raise ValueError("--recipe teacher runs in one process: its switch is "
                         "decided by one rank's validation")
    budget = None
    if getattr(args, "target_density", None) is not None:
        warmup = getattr(args, "budget_warmup", None)
        budget = DensityBudget(model, args.target_density,
                               warmup=args.steps // 10 if warmup is None else warmup,
                               floor=not getattr(args, "budget_ceiling", False),
                               delay=recipe.budget_delay(getattr(args, "budget_delay", 0)),
                               per_head=getattr(args, "budget_per_head", False),
                               lam=getattr(args, "budget_lam", BUDGET_LAM))
    args.out.mkdir(parents=True, exist_ok=True)
    recipe.path = args.out / "recipe.json"
    checkpoint_path = args.out / "checkpoint.pt"
    step = 0
    if args.resume:
        step = _restore(checkpoint_path, model, optimizer, schedule, budget,
                        rank, generator, graph_generator, device)
    net = model if world == 1 else torch.nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=True)
    # A compiled forward takes no generator: its static layers draw their
    # seeds from torch's, seeded above.
    forward = compiled(net) if getattr(args, "compile", False) else net
    sized_eagerly = forward is not net and getattr(args, "capacity", None) == "auto"
    metrics_path = args.out / "metrics.jsonl"
    if args.resume and rank == 0:
        for path in (metrics_path, args.out / "diagnostics.jsonl"):
            _drop_records_after(path, step)
    progress = _progress(args, step) if rank == 0 else None
    start_time = time.perf_counter()
    while step < args.steps:
        _schedule_layers(model, args, step, recipe)
        # The density penalty from --lam-start on (e.g. after a dense
        # warm-up, in which it would only pull the SBM sparse).
        lam = args.lam if step >= getattr(args, "lam_start", 0) else 0.0
        if sized_eagerly and unsized(model):
            # The step's batch forward eagerly: each automatic layer reads
            # its first capacity, then the compiled step finds it.
            model.train()  # an evaluation may have left it in eval mode
            with streams_kept(task.generator, device), torch.no_grad():
                task_forward(model, task, task.batch(), device, None)
        # A gated dense phase's added steps leave the budget as it was: its
        # delay and warm-up count from the selector phase as without them.
        record = train_step(forward, model, optimizer, schedule, task, args,
                            device, None if forward is not net else graph_generator,
                            None if recipe.held(step) else budget, lam=lam,
                            trainable=recipe.trainable(model, step))
        step += 1
        record.update(grow_capacity(model, record))
        switch = recipe.after_step(step, lambda: evaluate_model(
            model, task, device, held_out_generator("val", device, graphs=True), "val", 1),
            record["accuracy"])
        if switch is not None and rank == 0:
            _log(metrics_path, switch)
        if rank == 0:
            record = dict(step=step, **record,
                          seconds=time.perf_counter() - start_time)
            if step % args.log_every == 0 or step == args.steps:
                _log(metrics_path, record)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{record['loss']:.3f}",
                                     acc=f"{record['accuracy']:.3f}",
                                     density=f"{record['density']:.3f}")
            if args.eval_every and step % args.eval_every == 0:
                _log(metrics_path, dict(step=step, **evaluate_model(
                    model, task, device, held_out_generator("val", device, graphs=True),
                    "val", args.eval_batches)))
            if args.diagnose_every and step % args.diagnose_every == 0:
                # Its own seeded batch and graphs: the run's RNG streams are
                # untouched, so the run trains as it would without it.
                _log(args.out / "diagnostics.jsonl",
                     dict(step=step, **repeat_diagnostics(model, batch=16, seed=step)))
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(model, optimizer, schedule, step,
                            _rng_state(generator, graph_generator, device), world,
                            checkpoint_path, rank, jsonable(args),
                            keep=args.keep_checkpoints,
                            budget=None if budget is None else budget.state_dict())
    if progress is not None:
        progress.close()
    final = dict(evaluate_model(model, task, device,
                                held_out_generator("test", device, graphs=True), "test",
                                args.eval_batches),
                 steps=step, seconds=time.perf_counter() - start_time,
                 world_size=world, args=jsonable(args))
    if recipe.name == "teacher":
        final["recipe"] = recipe.state
    if world > 1:
        final["ranks_identical"] = _ranks_identical(model)
    if rank == 0:
        (args.out / "final.json").write_text(json.dumps(final, indent=1))
    if world > 1:
        torch.distributed.barrier()
    return final


def train_step(net, model: SBMTransformer, optimizer, schedule, task: Task,
               args, device: torch.device, generator: Optional[torch.Generator],
               budget: Optional[DensityBudget] = None,
               lam: Optional[float] = None,
               trainable: Optional[Set[int]] = None) -> dict:
    r"""One optimizer step on a fresh batch of :obj:`task`, as :func:`train`
    takes it.

    Args:
        net: :obj:`model`, or its :class:`~torch.nn.parallel.DistributedDataParallel`
            wrapper.
        model (SBMTransformer): the model.
        optimizer, schedule: from
            :func:`~sbm_pyg.experiments.optim.build_optimizer` and
            :func:`~sbm_pyg.experiments.optim.build_schedule`.
        task (Task): the batches and the loss.
        args: the training arguments (:obj:`lam`, :obj:`clip_grad_norm`).
        device (torch.device): where the batch goes.
        generator (torch.Generator, optional): the attention's sampling
            generator (:obj:`None` for a compiled :obj:`net`).
        budget (DensityBudget, optional): holds the density to a budget;
            its penalty replaces :obj:`args.lam`'s.
        lam (float, optional): this step's density penalty (default:
            :obj:`args.lam`).
        trainable (set, optional): the ids of the parameters this step
            updates (the others' gradients are dropped, so that neither
            the optimizer nor its momentum moves them); :obj:`None`: all.

    Returns:
        The step's training record: loss, accuracy, density and what shows
        an unstable step (the learning rate, the gradient norms before
        clipping, the update's norm and largest entry, per group) and, with
        a budget, the multipliers it applied, :obj:`lam` and
        :obj:`lam_floor` (the means over heads with per-head budgets).
    """
    model.train()
    tokens, mask, labels = batch = task.batch()
    out = task_forward(net, task, batch, device, generator)
    loss, correct, count = task.loss_and_correct(out, mask, labels)
    optimizer.zero_grad()
    total = loss if out.distill_loss is None else loss + out.distill_loss
    if budget is not None:
        applied = budget.lams.reshape(len(budget.lams), -1).mean(1)  # ceiling, floor
        (total + budget.penalty()).backward()
    else:
        lam = args.lam if lam is None else lam
        (total + lam * out.density_loss).backward()
    if trainable is not None:  # a frozen teacher (the selector phase)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in trainable:
                    p.grad = None
    stats = clip_and_measure(optimizer, args.clip_grad_norm)
    before = parameters_before(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    schedule.step()
    if budget is not None:
        budget.step()
        stats.update(zip(("lam", "lam_floor")[:len(applied)], applied))
    stats.update(update_statistics(optimizer, before))
    density = (out.sampled_density.mean() if out.sampled_density is not None
               else torch.ones(()))
    stats.update(loss=loss.detach(), density=density,
                 expected_density=out.density_loss.detach(), **static_stats(model))
    # One host transfer for every figure of the record (the distillation
    # per layer and head [L, H] after the scalars).
    distillation = (out.distillation.detach().float().reshape(-1)
                    if out.distillation is not None else torch.zeros(0))
    values = torch.cat([torch.stack([v.float().cpu() for v in stats.values()]),
                        distillation.cpu()]).tolist()
    record = dict(zip(stats, values))
    result = dict(split="train", loss=record.pop("loss"),
                  accuracy=float(correct) / count, density=record.pop("density"),
                  expected_density=record.pop("expected_density"), lr=lr)
    if out.distillation is not None:
        heads = out.distillation.size(1)
        flat = values[len(stats):]
        result["distillation_per_layer_head"] = [
            flat[i:i + heads] for i in range(0, len(flat), heads)]
    return dict(result, **record)


@torch.no_grad()
def evaluate_model(model: SBMTransformer, task: Task, device: torch.device,
                   generator: torch.Generator, split: str,
                   num_batches: int) -> dict:
    """Loss, accuracy, per-layer/head sampled density and, for an SBM model
    of at most :data:`RECALL_MAX_LEN` tokens, the selector's recall
    (:class:`~sbm_pyg.experiments.recall.RecallMeter`) on :obj:`split`
    (eval mode: no exploration, no dropout): :obj:`num_batches` batches, or
    the whole ListOps test split; :obj:`generator` samples the graphs (the
    training loop passes :func:`~sbm_pyg.experiments.batches.held_out_generator`'s,
    so that evaluating leaves its streams as they were)."""
    model.eval()
    correct = count = 0
    loss_sum, densities = 0.0, []
    # The selector's recall beside the accuracy (an O(N^2) diagnostic, so
    # only up to RECALL_MAX_LEN tokens; the same graphs and outputs).
    meter = (RecallMeter(model) if model.attention_kind == "sbm"
             and model.max_len <= RECALL_MAX_LEN else nullcontext())
    with meter:
        for tokens, mask, labels in task.eval_batches(split, num_batches):
            out = task_forward(model, task, (tokens, mask, labels), device, generator)
            loss, c, n = task.loss_and_correct(out, mask, labels)
            correct, count = correct + float(c), count + n
            loss_sum += float(loss) * n
            if out.sampled_density is not None:
                densities.append(out.sampled_density)
    result = dict(split=split, loss=loss_sum / count, accuracy=correct / count)
    if isinstance(task, MaskedBytesTask):
        result["bits_per_byte"] = bits_per_byte(result["loss"])
    if densities:
        per_head = torch.stack(densities).mean(0)  # [L, H]
        result.update(density=float(per_head.mean()),
                      density_per_layer_head=per_head.tolist())
    if isinstance(meter, RecallMeter):
        result.update(meter.summary())
    return result


def _schedule_layers(model: SBMTransformer, args, step: int, recipe: Recipe) -> None:
    # The SBM layers' settings of this step: every pair attended while the
    # recipe says so (a dense warm-up, and the teacher recipe's selector
    # phase), the exploration a gradual switch anneals, the distillation
    # from --distill-start on (not in the steps a gated dense phase adds).
    beta = getattr(args, "distill", 0.0) if step >= getattr(
        args, "distill_start", 0) and not recipe.held(step) else 0.0
    dense = recipe.attend_all(step)
    base = getattr(args, "exploration", None)
    for module in model.modules():
        if isinstance(module, SBMConv):
            module.distill, module.attend_all = beta, dense
            if base is not None:
                module.exploration = recipe.exploration(step, base)


def _distributed(device_name: str) -> Tuple[int, int, torch.device]:
    # This process's rank, the world size and its device (torchrun sets
    # WORLD_SIZE, RANK and LOCAL_RANK).
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend)
    rank = torch.distributed.get_rank() if world > 1 else 0
    device = torch.device(device_name)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return rank, world, device


def _rng_state(generator: torch.Generator, graph_generator: torch.Generator,
               device: torch.device) -> Dict[str, Tensor]:
    state = dict(torch=torch.get_rng_state(), data=generator.get_state())
    if graph_generator is not generator:  # CUDA: graphs have their own
        state["graph"] = graph_generator.get_state()
    if device.type == "cuda":
        # A compiled step takes no generator: its graphs' seeds come from
        # the device's default generator, which a resumed run must continue.
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _restore(path: Path, model, optimizer, schedule,
             budget: Optional[DensityBudget], rank: int,
             generator: torch.Generator, graph_generator: torch.Generator,
             device: torch.device) -> int:
    # Model, optimizer, schedule, density budget and this rank's random
    # streams; returns the step.
    state = load_checkpoint(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if "schedule" in state:
        schedule.load_state_dict(state["schedule"])
    else:  # written before the schedules: a constant rate (LEGACY_OPTIMIZER)
        schedule.last_epoch = state["step"]
    if budget is not None:
        budget.load_state_dict(state["budget"])
    rng = state["rng"][rank]
    torch.set_rng_state(rng["torch"].cpu())
    generator.set_state(rng["data"].cpu())
    if "graph" in rng:
        graph_generator.set_state(rng["graph"].cpu())
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
    return state["step"]


def _drop_records_after(path: Path, step: int) -> None:
    # A run killed after its last checkpoint logged steps that will be
    # trained again: drop them so that each step is logged once.
    if path.exists():
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept))


def _progress(args, step: int) -> Optional[object]:
    if args.no_progress:
        return None
    from tqdm import tqdm
    return tqdm(total=args.steps, initial=step, desc=f"{args.task}/{args.attention}")


def _log(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _ranks_identical(model) -> bool:
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])
