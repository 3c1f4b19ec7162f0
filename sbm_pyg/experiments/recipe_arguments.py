r"""The teacher recipe's options of ``python -m sbm_pyg train``
(:mod:`~sbm_pyg.experiments.recipe`: its phases and the switch) and their
checks."""
from __future__ import annotations

from typing import Callable

from sbm_pyg.experiments.recipe import RECIPES

__all__ = ["add_recipe_arguments", "validate_recipe"]


def add_recipe_arguments(add: Callable[..., object]) -> None:
    """Adds the recipe's options with :obj:`add` (a parser's
    :obj:`add_argument`)."""
    add("--recipe", choices=RECIPES, default="end-to-end",
        help="end-to-end: sampled graphs from --dense-steps on; teacher: "
             "after --dense-steps the model is frozen and the SBMs alone "
             "learn from its attention (--distill) under the budget until "
             "their recall is ready, then sampled graphs "
             "(sbm_pyg.experiments.recipe)")
    add("--teacher-accuracy", type=float, default=0.0,
        help="teacher recipe: the dense phase goes on past --dense-steps "
             "until the model's training accuracy over the last "
             "--selector-check steps reaches this (0: it ends at "
             "--dense-steps), so that the selector learns from a model that "
             "has learned the task")
    add("--dense-max-steps", type=int, default=None,
        help="teacher recipe with --teacher-accuracy: the dense phase's "
             "last step (default --dense-steps + --selector-steps, the "
             "selector phase's cap, which the gate's steps come out of)")
    add("--selector-steps", type=int, default=400,
        help="teacher recipe: the most steps of the selector phase")
    add("--selector-recall", type=float, default=0.9,
        help="teacher recipe: switch to sampled graphs once the selector's "
             "recall reaches this share of the oracle's at the same edge count")
    add("--selector-check", type=int, default=25,
        help="teacher recipe: measure the recall every K selector steps")
    add("--switch-within", type=float, default=None,
        help="teacher recipe: switch only once the frozen model's "
             "validation accuracy on the selector's graphs is also within "
             "this many points (a fraction, e.g. 0.01) of the teacher's "
             "accuracy at its gate (--teacher-accuracy), or at the cap")
    add("--freeze-selector", action="store_true",
        help="teacher recipe: after the switch the SBMs stay as the "
             "selector phase left them, the model alone learning on their "
             "graphs")
    add("--switch-steps", type=int, default=0,
        help="a gradual switch: over the first M sampled steps the "
             "exploration falls geometrically from 1 (every pair) to "
             "--exploration (0: the budget's graphs at once)")


def validate_recipe(args) -> None:
    """Raises :class:`ValueError` naming the first bad recipe option."""
    if getattr(args, "switch_steps", 0) < 0:
        raise ValueError(f"--switch-steps must be >= 0, got {args.switch_steps}")
    if getattr(args, "recipe", "end-to-end") != "teacher":
        for flag in ("freeze_selector", "teacher_accuracy", "dense_max_steps",
                     "switch_within"):
            if getattr(args, flag, None):
                raise ValueError(f"--{flag.replace('_', '-')} needs --recipe teacher")
        return
    if args.attention != "sbm" or not getattr(args, "distill", 0.0) > 0 \
            or getattr(args, "dense_steps", 0) < 1:
        raise ValueError("--recipe teacher needs --attention sbm, --distill > 0 "
                         "(what the selector learns from) and --dense-steps >= 1 "
                         "(the phase in which the teacher learns the task)")
    accuracy, dense_max = getattr(args, "teacher_accuracy", 0.0), \
        getattr(args, "dense_max_steps", None)
    if not 0 <= accuracy <= 1:
        raise ValueError(f"--teacher-accuracy must lie in [0, 1], got {accuracy}")
    if dense_max is not None and (not accuracy > 0 or dense_max < args.dense_steps):
        raise ValueError("--dense-max-steps needs --teacher-accuracy and must be "
                         f">= --dense-steps ({args.dense_steps}), got {dense_max}")
    within = getattr(args, "switch_within", None)
    if within is not None and (not 0 <= within <= 1 or not accuracy > 0):
        raise ValueError(f"--switch-within must lie in [0, 1] and needs "
                         f"--teacher-accuracy (the accuracy it is within), got {within}")
    if args.selector_steps < 1 or args.selector_check < 1:
        raise ValueError("--selector-steps and --selector-check must be >= 1")
    if not 0 < args.selector_recall <= 1:
        raise ValueError(f"--selector-recall must lie in (0, 1], got {args.selector_recall}")
