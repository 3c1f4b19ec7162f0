r"""The density budget's options of ``python -m sbm_pyg train``
(:class:`~sbm_pyg.nn.DensityBudget`) and their checks."""
from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

__all__ = ["BUDGET_LAM", "add_budget_arguments", "check_budget_numbers", "validate_budget"]

#: The budget's default starting (and least) multiplier
#: :math:`\lambda_0` (``--budget-lam``).
BUDGET_LAM = 1e-3


def add_budget_arguments(add: Callable[..., object]) -> None:
    r"""Adds the density budget's options with :obj:`add` (a parser's
    :obj:`add_argument`)."""
    add("--target-density", type=float, default=None,
        help="hold the SBM heads' mean expected density at this budget in "
             "(0, 1], adjusting lambda as training goes "
             "(sbm_pyg.nn.DensityBudget); replaces --lam")
    add("--budget-warmup", type=int, default=None,
        help="steps over which the budget comes down from the first step's "
             "density to --target-density (default: a tenth of --steps)")
    add("--budget-delay", type=int, default=0,
        help="steps before the budget acts (e.g. during --dense-steps); its "
             "warm-up then starts from that step's density")
    add("--budget-lam", type=float, default=BUDGET_LAM,
        help="the budget's starting (and least) multiplier lambda_0: a "
             "distillation that sets the SBM's scale (--distill-recall) "
             "needs lambda near 1, which from 1e-3 the controller takes "
             "hundreds of steps to reach")
    add("--budget-per-head", action=argparse.BooleanOptionalAction, default=False,
        help="hold every SBM head to --target-density, not their mean (a "
             "mean lets one head take the edges another head needs)")
    add("--budget-ceiling", action="store_true",
        help="hold the density at or below --target-density only: without "
             "the floor that keeps it from falling below")


def check_budget_numbers(target: Optional[float], **positive: float) -> None:
    r"""Checks a budget's numbers, naming the option (a
    :class:`ValueError`): :obj:`target` (``--target-density``, unless
    :obj:`None`) in (0, 1], and each of :obj:`positive` (by its
    :obj:`argparse` name, e.g. :obj:`budget_lam`) a finite number > 0."""
    if target is not None and not 0 < target <= 1:  # NaN fails too
        raise ValueError(f"--target-density must lie in (0, 1], got {target}")
    for name, value in positive.items():
        if not 0 < value < math.inf:  # NaN fails too
            raise ValueError(f"--{name.replace('_', '-')} must be a finite "
                             f"number > 0, got {value}")


def validate_budget(args: argparse.Namespace) -> None:
    r"""Checks the budget's options, naming the argument (a
    :class:`ValueError`)."""
    target = getattr(args, "target_density", None)
    if target is None and (getattr(args, "budget_warmup", None) is not None
                           or getattr(args, "budget_ceiling", False)
                           or getattr(args, "budget_per_head", False)
                           or getattr(args, "budget_lam", BUDGET_LAM) != BUDGET_LAM
                           or getattr(args, "budget_delay", 0)):
        raise ValueError("--budget-warmup, --budget-delay, --budget-ceiling, "
                         "--budget-lam and --budget-per-head need --target-density")
    if target is not None:
        check_budget_numbers(target, budget_lam=getattr(args, "budget_lam", BUDGET_LAM))
        if getattr(args, "budget_warmup", None) is not None and args.budget_warmup < 0:
            raise ValueError("--budget-warmup must be >= 0")
        if getattr(args, "budget_delay", 0) < 0:
            raise ValueError("--budget-delay must be >= 0")
        if args.attention != "sbm" or args.lam != 0:
            raise ValueError("--target-density needs --attention sbm and sets "
                             "lambda itself: leave --lam at 0")
