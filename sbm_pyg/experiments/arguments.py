r"""The options of ``python -m sbm_pyg train`` and their checks (the
presets: :mod:`~sbm_pyg.experiments.presets`; what ``--resume`` may
change: :mod:`~sbm_pyg.experiments.resume`)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional

import torch

from sbm_pyg.experiments.budget_arguments import add_budget_arguments, validate_budget
from sbm_pyg.experiments.optim import OPTIMIZERS, SCHEDULES
from sbm_pyg.experiments.presets import (  # noqa: F401 (the options' module re-exports them)
    BUDGET_PRESETS,
    PRESETS,
    default_exploration,
    preset_defaults,
)
from sbm_pyg.experiments.recipe_arguments import add_recipe_arguments, validate_recipe
from sbm_pyg.experiments.resume import RESUMABLE, resolve_resume  # noqa: F401 (re-exported)
from sbm_pyg.experiments.static_steps import add_static_arguments, validate_static
from sbm_pyg.experiments.text import add_text_arguments
from sbm_pyg.nn.block_model import INITS, PARAMETRIZATIONS

__all__ = ["PRESETS", "BUDGET_PRESETS", "preset_defaults", "RESUMABLE",
           "add_train_arguments", "train_arguments",
           "check_train_arguments", "validate_train_arguments", "resolve_resume"]

def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    def add(*names, **kwargs):
        # A help text on every option, so that --help shows its default.
        kwargs.setdefault("help", "(default: %(default)s)")
        return parser.add_argument(*names, **kwargs)

    add("--preset", choices=sorted(PRESETS), default=None,
        help="defaults of a named experiment; explicit arguments override them")
    add("--task", choices=["repeat", "listops", "mqar", "mlm"], default=None,
        help="required unless a --preset sets it")
    add("--attention", choices=["sbm", "full", "linear", "performer", "bigbird"],
        default="sbm")
    add("--seq-len", type=int, default=64,
        help="repeat, mqar, mlm: sequence length N; listops: max_length")
    add("--num-kv-pairs", "--num-pairs", dest="num_pairs", type=int, default=8,
        help="mqar: key-value pairs per sequence (each asked once; Zoology's "
             "num_kv_pairs)")
    add("--vocab-size", type=int, default=8192,
        help="mqar: vocabulary (keys from the lower half, values from the "
             "upper); larger than --seq-len, as Zoology requires")
    add("--small-vocab", action="store_true",
        help="mqar: allow a vocabulary <= --seq-len (the easy variant of "
             "docs/runs/mqar256: 256 symbols at N = 256, where every key "
             "can have a cluster of its own)")
    add_text_arguments(add)
    add("--short-conv", type=int, default=0,
        help="size of a causal depthwise convolution before each attention "
             "(Zoology's short convolution; 0: none)")
    add("--bigbird-density", type=float, default=0.05,
        help="bigbird: the fraction of pairs attended (window, global and "
             "random keys in equal shares)")
    add("--num-layers", type=int, default=1, help="encoder blocks")
    add("--heads", type=int, default=1)
    add("--channels", type=int, default=32, help="embedding size")
    add("--num-clusters", type=int, default=128, help="SBM clusters per head")
    add("--lam", type=float, default=0.0, help="density penalty lambda")
    add("--lam-start", type=int, default=0,
        help="the step from which --lam acts (e.g. --dense-steps: in a "
             "dense warm-up the penalty only pulls the SBM sparse)")
    add_budget_arguments(add)
    add_static_arguments(add)
    add("--distill", type=float, default=0.0,
        help="strength beta of the attention distillation in every SBM "
             "layer: the SBM learns to put its edges where the attention "
             "weights go (sbm_pyg.nn.attention_distillation; 0: off)")
    add("--distill-edges", type=float, default=0.0,
        help="with --distill, the weight of the edge fit added to it "
             "(sbm_pyg.nn.edge_fit: a binary cross-entropy that pulls the "
             "edges the attention uses toward p = 1, the others toward 0)")
    add("--distill-recall", type=float, default=0.0,
        help="with --distill, the weight of the recall fit added to it "
             "(sbm_pyg.nn.recall_fit: the attention mass the SBM's "
             "probabilities miss, each row alike)")
    add("--sink", action=argparse.BooleanOptionalAction, default=False,
        help="a learned attention sink per head in every SBM layer "
             "(SBMConv(sink=True)): a row may attend to nothing")
    add("--distill-start", type=int, default=0,
        help="the step from which --distill acts (before it the attention "
             "learns the task on its own)")
    add("--dense-steps", type=int, default=0,
        help="a dense warm-up: for the first steps every SBM head attends "
             "every pair (its SBM still learns, e.g. from --distill)")
    add_recipe_arguments(add)
    add("--steps", type=int, default=1000)
    add("--batch-size", type=int, default=32)
    add("--lr", type=float, default=1e-3)
    add("--sbm-lr", type=float, default=None,
        help="learning rate of the SBMs (cluster embeddings and membership "
             "MLPs; default --lr). 0: the SBMs stay as initialized, a "
             "random selector (with --ste none and no density loss nothing "
             "of the selector reaches the model)")
    add("--optimizer", choices=OPTIMIZERS, default="adamw",
        help="AdamW (decoupled weight decay), as the published code, or Adam")
    add("--adam-eps", type=float, default=1e-8,
        help="the optimizer's eps (torch's default). The published code's "
             "1e-6 is larger than the SBMs' gradients at N = 256 (2e-9 to "
             "1e-8 per entry) and all but stops them learning")
    add("--weight-decay", type=float, default=0.0)
    add("--clip-grad-norm", type=float, default=0.0,
        help="clip the gradients to this global norm (0: off, as the "
             "published code)")
    add("--schedule", choices=SCHEDULES, default="linear",
        help="learning rate after the warm-up: decaying linearly to 0 at "
             "--steps (the published code's one-cycle schedule), along a "
             "half cosine, or constant")
    add("--warmup-steps", type=int, default=0,
        help="linear warm-up from 0 over this many steps")
    add("--dropout", type=float, default=0.0,
        help="dropout after attention and the MLP")
    add("--attn-dropout", type=float, default=0.0,
        help="dropout on the attention weights (sbm, full and bigbird "
             "heads; an SBM head's dense phases included)")
    add("--exploration", type=float, default=None,
        help="random exploration rate added to every pair's probability "
             "in training (default: 0.01, or a tenth of --target-density "
             "where that is less)")
    add("--mode", choices=["exact", "poisson"], default="exact",
        help="sampler merge mode; poisson caps the density at 1 - 1/e")
    add("--ste", choices=["paper", "published", "none"], default="paper",
        help="straight-through estimator: the paper's equation or the "
             "published code's clipped logit gradient; none: the sampled "
             "graphs pass the SBM no gradient (it learns from --distill "
             "and the budget alone)")
    add("--sbm-init", choices=INITS, default="paper",
        help="SBM initialization: the paper's kaiming-normal clusters at the "
             "published code's scale (about 25%% of pairs sampled) or dense "
             "(about 99%%: the heads start as full attention)")
    add("--init-density", type=float, default=None,
        help="start the SBMs near this expected density instead of "
             "--sbm-init's (e.g. an expected degree over N); with no budget, "
             "the exploration defaults to a tenth of it")
    add("--sbm-parametrization", choices=PARAMETRIZATIONS, default="paper",
        help="the SBM's block matrix: the paper's (a softmax over its k^2 "
             "entries: one unit of mass shared by all blocks), mmsb "
             "(memberships on the simplex, each block entry in (0, 1)) or "
             "sharp (mmsb with memberships on two clusters at a learned "
             "temperature and separate key clusters)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, required=True, help="run directory")
    add("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    add("--device", default="cpu")
    add("--log-every", type=int, default=10)
    add("--eval-every", type=int, default=0, help="validation every K steps (0: off)")
    add("--checkpoint-every", type=int, default=100)
    add("--keep-checkpoints", type=int, default=0,
        help="also keep the last K checkpoints as OUT/checkpoint-STEP.pt, to "
             "replay a run from before an event (0: only the latest)")
    add("--diagnose-every", type=int, default=0,
        help="repeat task, sbm: append the per-pair-class edge probabilities "
             "and straight-through gradients (sbm_pyg.experiments.diagnose) "
             "to OUT/diagnostics.jsonl every K steps (0: off)")
    add("--eval-batches", type=int, default=8)
    add("--listops-sizes", type=int, nargs=3, default=[2000, 200, 200],
        metavar=("TRAIN", "VAL", "TEST"))
    add("--listops-min-length", type=int, default=20)
    add("--data-dir", type=Path, default=Path("data"))
    add("--no-progress", action="store_true")


def train_arguments(preset: Optional[str] = None, **overrides) -> argparse.Namespace:
    r"""The arguments of a training run for :func:`~sbm_pyg.experiments.train`,
    as the command line builds them: the defaults, a preset's, then
    :obj:`overrides` (keyword names as the options', e.g. ``seq_len=64``;
    :obj:`out` is required). Raises :class:`TypeError` for an unknown name
    and :class:`ValueError` for a bad value.

    Example:
        >>> args = train_arguments("repeat-paper", seq_len=32, steps=300,
        ...                        out="runs/repeat32")  # doctest: +SKIP
        >>> final = train(args)  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser)
    parser.set_defaults(**preset_defaults(preset, overrides.get("target_density")))
    if "out" not in overrides:
        raise TypeError("train_arguments() needs out= (the run directory)")
    args = parser.parse_args(["--out", str(overrides["out"])])
    args.preset = preset
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"train_arguments() got unknown arguments {unknown}")
    for key, value in overrides.items():
        setattr(args, key, Path(value) if key in ("out", "data_dir") else value)
    validate_train_arguments(args)
    return args


def check_train_arguments(parser: argparse.ArgumentParser, args) -> None:
    """:func:`validate_train_arguments` for the command line: a bad value
    exits with code 2 and the message."""
    try:
        validate_train_arguments(args)
    except ValueError as e:
        parser.error(str(e))


def validate_train_arguments(args) -> None:
    """Raises :class:`ValueError` naming the first bad training argument."""
    if args.task is None:
        raise ValueError("--task is required (or a --preset that sets it)")
    for name in ("seq_len", "num_layers", "heads", "channels", "num_clusters", "steps",
                 "batch_size", "log_every", "checkpoint_every", "eval_batches"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.task == "repeat" and args.seq_len < 2:
        raise ValueError("--seq-len must be >= 2 for the repeat task")
    _validate_task(args)
    if getattr(args, "short_conv", 0) < 0:
        raise ValueError("--short-conv must be >= 0")
    if not 0 < getattr(args, "bigbird_density", 0.05) <= 1:
        raise ValueError("--bigbird-density must lie in (0, 1]")
    if args.sbm_lr is not None and not args.sbm_lr >= 0:
        raise ValueError(f"--sbm-lr must be >= 0, got {args.sbm_lr}")
    if getattr(args, "init_density", None) is not None and args.attention != "sbm":
        raise ValueError("--init-density needs --attention sbm")
    if args.adam_eps <= 0:
        raise ValueError("--adam-eps must be > 0")
    if args.weight_decay < 0 or args.clip_grad_norm < 0:
        raise ValueError("--weight-decay and --clip-grad-norm must be >= 0")
    if args.warmup_steps < 0 or args.keep_checkpoints < 0:
        raise ValueError("--warmup-steps and --keep-checkpoints must be >= 0")
    if args.exploration is None:
        target = getattr(args, "target_density", None)
        args.exploration = default_exploration(
            target if target is not None else getattr(args, "init_density", None))
    if args.lr <= 0 or args.lam < 0 or not 0 <= args.dropout < 1 or args.exploration < 0:
        raise ValueError("--lr must be > 0, --lam >= 0, --dropout in [0, 1), "
                         "--exploration >= 0")
    attn_dropout = getattr(args, "attn_dropout", 0.0)
    if not 0 <= attn_dropout < 1 or (
            attn_dropout > 0 and args.attention in ("linear", "performer")):
        raise ValueError(f"--attn-dropout must be in [0, 1) and needs "
                         f"--attention sbm, full or bigbird, got "
                         f"{attn_dropout} with {args.attention}")
    distill = getattr(args, "distill", 0.0)
    if not distill >= 0 or (distill > 0 and args.attention != "sbm"):
        raise ValueError("--distill must be >= 0 and needs --attention sbm")
    edges = getattr(args, "distill_edges", 0.0)
    if not edges >= 0 or (edges > 0 and not distill > 0):
        raise ValueError("--distill-edges must be >= 0 and needs --distill")
    recall = getattr(args, "distill_recall", 0.0)
    if not recall >= 0 or (recall > 0 and not distill > 0):
        raise ValueError("--distill-recall must be >= 0 and needs --distill")
    if getattr(args, "distill_start", 0) < 0 or getattr(args, "dense_steps", 0) < 0:
        raise ValueError("--distill-start and --dense-steps must be >= 0")
    if getattr(args, "lam_start", 0) < 0:
        raise ValueError("--lam-start must be >= 0")
    for flag in ("dense_steps", "sink"):
        if getattr(args, flag, 0) and args.attention != "sbm":
            raise ValueError(f"--{flag.replace('_', '-')} needs --attention sbm")
    validate_recipe(args)
    validate_budget(args)
    validate_static(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available")
    if args.diagnose_every < 0 or (args.diagnose_every and (
            args.task != "repeat" or args.attention != "sbm")):
        raise ValueError("--diagnose-every must be >= 0 and needs --task "
                         "repeat --attention sbm")
    if args.resume and not (args.out / "checkpoint.pt").exists():
        raise ValueError(f"--resume: no checkpoint at {args.out / 'checkpoint.pt'}")
    # Rank 0 only: under torchrun it creates OUT before the others look.
    if (not args.resume and int(os.environ.get("RANK", "0")) == 0
            and args.out.is_dir() and any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} is not empty: pass --resume to "
                         f"continue the run in it, or choose another directory")


def _validate_task(args) -> None:
    # The sizes of the MQAR and masked-byte tasks.
    if args.task == "mqar":
        from sbm_pyg.experiments.tasks import check_mqar
        check_mqar(args.seq_len, args.num_pairs, args.vocab_size)
        if args.vocab_size <= args.seq_len and not getattr(args, "small_vocab", False):
            raise ValueError(
                f"--vocab-size must exceed --seq-len, as Zoology's MQAR requires "
                f"(with fewer symbols than positions every key can own a "
                f"cluster), got {args.vocab_size} at --seq-len {args.seq_len}; "
                f"--small-vocab (or --preset mqar-sparse-easy) runs the easy variant")
    if args.task == "mlm" and not 0 < getattr(args, "mask_rate", 0.15) < 1:
        raise ValueError(f"--mask-rate must lie in (0, 1), got {args.mask_rate}")
