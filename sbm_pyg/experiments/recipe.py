r"""The phases of a training run of SBM heads: when every pair is attended,
what learns, and when the heads switch to their sampled graphs.

Two recipes (``--recipe``):

- :obj:`"end-to-end"` (the paper's, the presets' default): a dense warm-up
  of ``--dense-steps`` in which every pair is attended and everything
  learns (the SBM too, from ``--distill``), then sampled graphs, at a fixed
  step.
- :obj:`"teacher"`: the selector learns from a teacher that is present and
  frozen, as the field's working selectors do (DeepSeek's sparse
  attention trains its indexer by a KL to the frozen model's attention,
  SeerAttention its gate). Three phases:

  1. **dense** (``--dense-steps``): every pair attended, the model learns
     the task; with ``--teacher-accuracy`` A the phase goes on past
     ``--dense-steps`` until the model's training accuracy, a mean over the
     last ``--selector-check`` steps (each on a batch it has not trained
     on: the tasks draw every batch afresh), reaches A (or until
     ``--dense-max-steps``, by default the selector phase's cap), so that
     the selector does not learn an untrained model's rows, which are easy
     to hold and useless. (A validation batch would not tell: an
     evaluation samples the SBMs' graphs, not every pair.) The steps the
     gate adds train the model alone: neither the distillation nor the
     budget acts in them, so that the selector phase begins as it would
     have at ``--dense-steps``; they come out of the selector phase, whose
     cap stays at step ``--dense-steps`` + ``--selector-steps``;
  2. **selector**: every pair still attended, the model frozen (its
     gradients dropped before the optimizer sees them), the SBMs alone
     learning by the distillation under the density budget (which acts
     from here on), until the selector's recall on a validation batch
     (:mod:`~sbm_pyg.experiments.recall`) reaches ``--selector-recall``
     times the oracle's at the same edge count, checked every
     ``--selector-check`` steps, or ``--selector-steps`` have passed; with
     ``--switch-within`` d the frozen model's accuracy on the selector's
     graphs (the same validation batch) must also be within d of the
     teacher's at its gate, so that the switch does not hand the model
     graphs on which it has already lost the task;
  3. **sparse**: sampled graphs, everything learning, the SBMs still
     distilled on their sampled edges; with ``--freeze-selector`` the SBMs
     stay as the selector phase left them and the model alone learns on
     their graphs (which still move with the queries and keys the SBMs
     read).

The switch's step and reason are written to ``OUT/recipe.json`` (read back
on ``--resume``) and logged to ``metrics.jsonl`` (``"split": "recipe"``).

Under either recipe the switch can be gradual (``--switch-steps`` M > 0):
for the first M sampled steps the heads' exploration rate falls
geometrically from 1 (every pair) to its own :math:`\delta`,
:math:`\delta_t = \max(\delta, 10^{-3})^{t / M}`, so that the model meets
ever sparser graphs instead of the budget's at once.
"""
from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Deque, Optional, Set

import torch

from sbm_pyg.nn.conv import SBMConv

__all__ = ["RECIPES", "Recipe"]

RECIPES = ("end-to-end", "teacher")
#: The least exploration a gradual switch anneals through: the geometric
#: path from 1 needs a positive end (an exploration of 0 is reached at the
#: switch's last step).
SWITCH_FLOOR = 1e-3


class Recipe:
    r"""The phase of each step of a run with arguments :obj:`args`
    (:obj:`recipe`, :obj:`dense_steps`, :obj:`selector_steps`,
    :obj:`selector_recall`, :obj:`selector_check`, :obj:`switch_steps`,
    :obj:`freeze_selector`) in directory :obj:`out`.

    Example:
        >>> import argparse
        >>> args = argparse.Namespace(recipe="teacher", dense_steps=10,
        ...                           selector_steps=5, selector_recall=0.9,
        ...                           selector_check=5)
        >>> recipe = Recipe(args)
        >>> [recipe.phase(s) for s in (0, 10, 15)]
        ['dense', 'selector', 'selector']
    """

    def __init__(self, args, out: Optional[Path] = None):
        self.name = getattr(args, "recipe", "end-to-end")
        if self.name not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.name!r}")
        self.dense_steps = getattr(args, "dense_steps", 0)
        self.selector_steps = getattr(args, "selector_steps", 0)
        self.threshold = getattr(args, "selector_recall", 0.9)
        self.check = getattr(args, "selector_check", 25)
        self.switch_steps = getattr(args, "switch_steps", 0)
        self.freeze_selector = getattr(args, "freeze_selector", False)
        self.teacher_accuracy = getattr(args, "teacher_accuracy", 0.0)
        self.within = getattr(args, "switch_within", None)
        dense_max = getattr(args, "dense_max_steps", None)
        # The selector phase ends by its cap at the same step, gated or
        # not: the steps a gate adds come out of it.
        self.selector_end = self.dense_steps + self.selector_steps
        self.dense_max = self.selector_end if dense_max is None else dense_max
        self.accuracies: Deque[float] = deque(maxlen=max(self.check, 1))
        self.path = None if out is None else Path(out) / "recipe.json"
        self.state: dict = {}
        if self.path is not None and self.path.exists():
            self.state = json.loads(self.path.read_text())

    @property
    def gated(self) -> bool:
        """Whether the dense phase ends on the teacher's accuracy."""
        return self.name == "teacher" and self.teacher_accuracy > 0

    @property
    def selector_start(self) -> Optional[int]:
        """The selector phase's first step (:obj:`None` while a gated dense
        phase goes on)."""
        return self.state.get("selector_start") if self.gated else self.dense_steps

    @property
    def sparse_start(self) -> Optional[int]:
        """The first sampled step once the teacher recipe switched
        (:obj:`None` before)."""
        return self.state.get("sparse_start")

    def phase(self, step: int) -> str:
        """:obj:`"dense"`, :obj:`"selector"` or :obj:`"sparse"`."""
        if step < self.dense_steps:
            return "dense"
        if self.name == "end-to-end":
            return "sparse"
        start = self.selector_start
        if start is None or step < start:
            return "dense"
        start = self.sparse_start
        return "sparse" if start is not None and step >= start else "selector"

    def held(self, step: int) -> bool:
        """Whether :obj:`step` is one a gated dense phase added past
        ``--dense-steps``: the model learns alone, without the distillation
        or the budget."""
        return self.gated and step >= self.dense_steps and self.phase(step) == "dense"

    def attend_all(self, step: int) -> bool:
        """Whether the SBM heads attend every pair at :obj:`step`."""
        return self.phase(step) != "sparse"

    def exploration(self, step: int, base: float) -> float:
        r"""The heads' exploration rate at :obj:`step` for a run whose rate
        is :obj:`base`: annealed from 1 over the first
        :obj:`switch_steps` sampled steps, :obj:`base` otherwise."""
        start = self.dense_steps if self.name == "end-to-end" else self.sparse_start
        if self.phase(step) != "sparse" or start is None \
                or step - start >= self.switch_steps:
            return base
        return max(base, SWITCH_FLOOR) ** ((step - start) / self.switch_steps)

    def budget_delay(self, delay: int) -> int:
        """The budget's delay: under the teacher recipe it acts from the
        selector phase on, not while the model learns the task."""
        return max(delay, self.dense_steps) if self.name == "teacher" else delay

    def trainable(self, model: torch.nn.Module, step: int) -> Optional[Set[int]]:
        """The ids of the parameters that learn at :obj:`step`: the SBMs'
        alone in the selector phase, all but the SBMs' in the sparse phase
        with :obj:`freeze_selector`, all (:obj:`None`) otherwise."""
        phase = self.phase(step)
        if phase == "dense" or (phase == "sparse" and not self.freeze_selector):
            return None
        sbm = {id(p) for m in model.modules() if isinstance(m, SBMConv)
               for p in m.sbm.parameters()}
        if phase == "selector":
            return sbm
        return {id(p) for p in model.parameters()} - sbm

    def after_step(self, step: int, measure,
                   accuracy: Optional[float] = None) -> Optional[dict]:
        r"""After :obj:`step` steps: in the selector phase, every
        :obj:`selector_check` steps, :obj:`measure()` (a validation's
        result, with :obj:`recall` and :obj:`oracle_recall`) decides the
        switch to sampled graphs; in a gated dense phase the training
        accuracies (:obj:`accuracy`, the step's) decide the start of the
        selector phase; returns the record of either, else :obj:`None`."""
        if accuracy is not None:
            self.accuracies.append(accuracy)
        if self.gated and self.selector_start is None and step >= self.dense_steps:
            return self._gate(step)
        if self.name != "teacher" or self.phase(step) != "selector" \
                or step == self.selector_start:
            return None
        done = step - self.selector_start
        capped = step >= self.selector_end
        if not capped and done % self.check:
            return None
        result = measure()
        recall, oracle = result.get("recall"), result.get("oracle_recall")
        ready = recall is not None and recall >= self.threshold * oracle
        accuracy = result.get("accuracy")
        if self.within is not None:
            # The teacher's accuracy is its gate's: the model is frozen since.
            ready = ready and accuracy is not None and \
                accuracy >= self.state["teacher_accuracy"] - self.within
        if not (ready or capped):
            return None
        self.state.update(sparse_start=step, reason="recall" if ready else "cap",
                          recall=recall, oracle_recall=oracle,
                          selector_steps=done, selector_accuracy=accuracy)
        self._save()
        return dict(step=step, split="recipe", phase="sparse", **{
            k: v for k, v in self.state.items()
            if k in ("reason", "recall", "oracle_recall", "selector_steps",
                     "selector_accuracy")})

    def _gate(self, step: int) -> Optional[dict]:
        # The gated dense phase's end: every selector_check steps from
        # dense_steps on, once a full window of accuracies is seen (after a
        # resume too), or at dense_max.
        capped = step >= self.dense_max
        full = len(self.accuracies) == self.accuracies.maxlen
        if not capped and ((step - self.dense_steps) % self.check or not full):
            return None
        accuracy = sum(self.accuracies) / max(len(self.accuracies), 1)
        if not (accuracy >= self.teacher_accuracy or capped):
            return None
        self.state = dict(selector_start=step, teacher_accuracy=accuracy,
                          dense_reason="accuracy" if accuracy >= self.teacher_accuracy
                          else "cap")
        self._save()
        return dict(step=step, split="recipe", phase="selector",
                    teacher_accuracy=accuracy, reason=self.state["dense_reason"])

    def _save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.state, indent=1) + "\n")
