r"""Training loop of ``python -m sbm_pyg train``: progress bar, metrics,
resumable checkpoints, a final evaluation, and DistributedDataParallel under
``torchrun``."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.experiments.tasks import VOCAB, ListOps, repeat_batch
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn.block_model import INITS

__all__ = ["train", "add_train_arguments", "PRESETS"]

#: Named experiments for ``--preset``: argument defaults that the command line
#: can still override (e.g. ``--preset repeat-paper --seq-len 64``).
PRESETS: Dict[str, dict] = {
    # The paper's "finding repeated tokens" (Sec. 5.1): N = 256, one layer,
    # one head, width 32, k = 128, batch 256, lr 1e-3, 2000 steps, with the
    # published experiments' exploration 0.01 and no density penalty, from
    # the default start (the published code's initialization, about 25% of
    # pairs sampled): the head drives itself to full attention, the paper's
    # Figure 4 (docs/experiments.md).
    "repeat-paper": dict(task="repeat", attention="sbm", seq_len=256,
                         num_layers=1, heads=1, channels=32, num_clusters=128,
                         batch_size=256, lr=1e-3, steps=2000, exploration=0.01,
                         lam=0.0, mode="exact", ste="paper"),
}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    def add(*names, **kwargs):
        # A help text on every option, so that --help shows its default.
        kwargs.setdefault("help", "(default: %(default)s)")
        return parser.add_argument(*names, **kwargs)

    add("--preset", choices=sorted(PRESETS), default=None,
        help="defaults of a named experiment; explicit arguments override them")
    add("--task", choices=["repeat", "listops"], default=None,
        help="required unless a --preset sets it")
    add("--attention", choices=["sbm", "full", "linear", "performer"], default="sbm")
    add("--seq-len", type=int, default=64,
        help="repeat: sequence length N; listops: max_length")
    add("--num-layers", type=int, default=1, help="encoder blocks")
    add("--heads", type=int, default=1)
    add("--channels", type=int, default=32, help="embedding size")
    add("--num-clusters", type=int, default=128, help="SBM clusters per head")
    add("--lam", type=float, default=0.0, help="density penalty lambda")
    add("--steps", type=int, default=1000)
    add("--batch-size", type=int, default=32)
    add("--lr", type=float, default=1e-3)
    add("--sbm-lr", type=float, default=None,
        help="learning rate of the SBMs (cluster embeddings and membership "
             "MLPs; default --lr)")
    add("--adam-eps", type=float, default=1e-8,
        help="Adam's eps (torch's default; the published code trains with "
             "1e-6, which shrinks the SBM's small-gradient steps)")
    add("--dropout", type=float, default=0.0)
    add("--exploration", type=float, default=0.01)
    add("--mode", choices=["exact", "poisson"], default="exact",
        help="sampler merge mode; poisson caps the density at 1 - 1/e")
    add("--ste", choices=["paper", "published"], default="paper",
        help="straight-through estimator: the paper's equation or the "
             "published code's clipped logit gradient")
    add("--sbm-init", choices=INITS, default="paper",
        help="SBM initialization: the paper's kaiming-normal clusters at the "
             "published code's scale (about 25%% of pairs sampled) or dense "
             "(about 99%%: the heads start as full attention)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, required=True, help="run directory")
    add("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    add("--device", default="cpu")
    add("--log-every", type=int, default=10)
    add("--eval-every", type=int, default=0, help="validation every K steps (0: off)")
    add("--checkpoint-every", type=int, default=100)
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


def check_train_arguments(parser: argparse.ArgumentParser, args) -> None:
    if args.task is None:
        parser.error("--task is required (or a --preset that sets it)")
    for name in ("seq_len", "num_layers", "heads", "channels", "num_clusters", "steps",
                 "batch_size", "log_every", "checkpoint_every", "eval_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.task == "repeat" and args.seq_len < 2:
        parser.error("--seq-len must be >= 2 for the repeat task")
    if args.sbm_lr is not None and args.sbm_lr <= 0:
        parser.error("--sbm-lr must be > 0")
    if args.adam_eps <= 0:
        parser.error("--adam-eps must be > 0")
    if args.lr <= 0 or args.lam < 0 or not 0 <= args.dropout < 1 or args.exploration < 0:
        parser.error("--lr must be > 0, --lam >= 0, --dropout in [0, 1), "
                     "--exploration >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    if args.diagnose_every < 0 or (args.diagnose_every and (
            args.task != "repeat" or args.attention != "sbm")):
        parser.error("--diagnose-every must be >= 0 and needs --task repeat "
                     "--attention sbm")
    if args.resume and not (args.out / "checkpoint.pt").exists():
        parser.error(f"--resume: no checkpoint at {args.out / 'checkpoint.pt'}")
    # Rank 0 only: under torchrun it creates OUT before the others look.
    if (not args.resume and int(os.environ.get("RANK", "0")) == 0
            and args.out.is_dir() and any(args.out.iterdir())):
        parser.error(f"--out {args.out} is not empty: pass --resume to "
                     f"continue the run in it, or choose another directory")


# Settings a resumed run may change: how far it runs, where, and what it
# logs. Any other setting is the checkpoint's.
RESUMABLE = {"steps", "out", "resume", "device", "log_every", "eval_every",
             "checkpoint_every", "eval_batches", "no_progress",
             "diagnose_every", "data_dir", "preset"}


def _given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set:
    # The destinations of the options written on the command line.
    return {action.dest for action in parser._actions
            for option in action.option_strings
            if any(t == option or t.startswith(option + "=") for t in argv)}


def resolve_resume(parser: argparse.ArgumentParser, args,
                   argv: Sequence[str]) -> None:
    """With --resume the checkpoint's settings hold: those not given on the
    command line are taken from it, and one given with another value is
    refused (a new learning rate would not reach the restored optimizer, a
    new model size would not load)."""
    state = torch.load(args.out / "checkpoint.pt", map_location="cpu",
                       weights_only=False)
    saved = state.get("args")
    if saved is None:  # a checkpoint of an earlier version: nothing to check
        return
    given, differ = _given(parser, argv), []
    for key, value in saved.items():
        if key in RESUMABLE or not hasattr(args, key):
            continue
        current = getattr(args, key)
        shown = str(current) if isinstance(current, Path) else current
        if key not in given:
            setattr(args, key, Path(value) if isinstance(current, Path) else value)
        elif shown != value:
            differ.append(f"--{key.replace('_', '-')} {shown} (the run has "
                          f"{value})")
    if differ:
        parser.error("--resume continues a run with its own settings, and "
                     "these differ from them: " + "; ".join(differ) +
                     ". Start a new run in another --out to change them")


def build_model(args) -> SBMTransformer:
    """The model a run trains, from its arguments (token and sequence heads
    for both tasks; the vocabulary and length follow from the task)."""
    if args.task == "listops":
        num_tokens, max_len = len(VOCAB), args.seq_len - 1
    else:
        num_tokens, max_len = args.seq_len + 1, args.seq_len
    return SBMTransformer(
        num_tokens, max_len,
        channels=args.channels, num_layers=args.num_layers,
        heads=args.heads, attention=args.attention,
        num_clusters=args.num_clusters,
        token_classes=1, seq_classes=10, dropout=args.dropout,
        **(dict(exploration=args.exploration, mode=args.mode,
                ste=args.ste, sbm_init=args.sbm_init)
           if args.attention == "sbm" else {}),
    )


def load_run(run: Union[str, Path]) -> Tuple[SBMTransformer, dict]:
    """The trained model of a run directory (from its last checkpoint) in
    eval mode, and the run's arguments."""
    path = Path(run) / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (not a training run?)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if "args" not in state:
        raise ValueError(f"{path} has no arguments (written by an older version)")
    args = argparse.Namespace(**state["args"])
    model = build_model(args)
    model.load_state_dict(state["model"])
    return model.eval(), state["args"]


class _Task:
    """Batches, loss and accuracy of one task, on one rank."""

    def __init__(self, args, generator: torch.Generator, rank: int, world: int):
        self.args, self.generator = args, generator
        self.rank, self.world = rank, world
        self.output = "token" if args.task == "repeat" else "sequence"
        if args.task == "listops":
            self.data = ListOps(args.data_dir, sizes=tuple(args.listops_sizes),
                                min_length=args.listops_min_length,
                                max_length=args.seq_len, seed=args.seed)

    def batch(self, split: str = "train") -> Tuple[Tensor, Tensor, Tensor]:
        """tokens [B, N], mask [B, N], labels ([B, N] repeat, [B] listops)."""
        B = self.args.batch_size
        if self.args.task == "repeat":
            tokens, labels = repeat_batch(B, self.args.seq_len, self.generator)
            return tokens, torch.ones_like(tokens, dtype=torch.bool), labels
        tokens, lengths, labels = self.data.splits[split]
        # Each rank draws its own examples.
        idx = torch.randint(0, tokens.size(0), (B,), generator=self.generator)
        n = int(lengths[idx].max())
        batch = tokens[idx, :n]
        mask = torch.arange(n)[None, :] < lengths[idx, None]
        return batch, mask, labels[idx]

    def test_batches(self) -> Iterator[Tuple[str, Tensor, Tensor, Tensor]]:
        """Every example of the listops test split, in batches."""
        tokens, lengths, labels = self.data.splits["test"]
        for start in range(0, tokens.size(0), self.args.batch_size):
            sl = slice(start, start + self.args.batch_size)
            n = int(lengths[sl].max())
            yield (tokens[sl, :n], torch.arange(n)[None, :] < lengths[sl, None],
                   labels[sl])

    def loss_and_correct(self, out, mask: Tensor, labels: Tensor):
        if self.args.task == "repeat":
            logits = out.token_logits.squeeze(-1)[mask]
            target = labels.to(logits.device)[mask.to(logits.device)]
            loss = F.binary_cross_entropy_with_logits(logits, target)
            correct = ((logits > 0).float() == target).sum()
            return loss, correct, target.numel()
        target = labels.to(out.seq_logits.device)
        loss = F.cross_entropy(out.seq_logits, target)
        correct = (out.seq_logits.argmax(-1) == target).sum()
        return loss, correct, target.numel()


def _rng_state(generator: torch.Generator,
               graph_generator: torch.Generator) -> Dict[str, Tensor]:
    state = dict(torch=torch.get_rng_state(), data=generator.get_state())
    if graph_generator is not generator:  # CUDA: graphs have their own
        state["graph"] = graph_generator.get_state()
    return state


def _distributed() -> Tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend)
    rank = torch.distributed.get_rank() if world > 1 else 0
    return rank, world


def _log(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _parameter_groups(model: SBMTransformer, args) -> List[dict]:
    sbm = [p for name, p in model.named_parameters() if ".sbm." in name]
    rest = [p for name, p in model.named_parameters() if ".sbm." not in name]
    return [dict(params=rest),
            dict(params=sbm, lr=args.sbm_lr if args.sbm_lr is not None else args.lr)]


def train(args) -> dict:
    """Trains, checkpoints, evaluates; returns the final metrics (rank 0
    writes OUT/metrics.jsonl, OUT/checkpoint.pt and OUT/final.json)."""
    rank, world = _distributed()
    device = torch.device(args.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed + rank)
    # One generator drives the data and the sampled graphs of this rank.
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    graph_generator = generator if device.type == "cpu" else \
        torch.Generator(device).manual_seed(args.seed * 1000 + rank)
    task = _Task(args, generator, rank, world)
    model = build_model(args).to(device)
    # Runs saved before --adam-eps existed used torch's default.
    optimizer = torch.optim.Adam(_parameter_groups(model, args), lr=args.lr,
                                 eps=getattr(args, "adam_eps", 1e-8))
    step = 0
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = args.out / "checkpoint.pt"
    if args.resume:
        state = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        rng = state["rng"][rank]
        torch.set_rng_state(rng["torch"])
        generator.set_state(rng["data"])
        if "graph" in rng:
            graph_generator.set_state(rng["graph"])
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=True)

    metrics_path = args.out / "metrics.jsonl"
    for path in (metrics_path, args.out / "diagnostics.jsonl"):
        if args.resume and rank == 0 and path.exists():
            # A run killed after its last checkpoint logged steps that will
            # be trained again: drop them so that each step is logged once.
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= step]
            path.write_text("".join(line + "\n" for line in kept))
    progress = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm
        progress = tqdm(total=args.steps, initial=step, desc=f"{args.task}/{args.attention}")
    start_time = time.perf_counter()
    while step < args.steps:
        model.train()
        tokens, mask, labels = task.batch()
        out = net(tokens.to(device), mask.to(device), generator=graph_generator,
                  output=task.output)
        loss, correct, count = task.loss_and_correct(out, mask, labels)
        total = loss + args.lam * out.density_loss
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        step += 1
        density = float(out.sampled_density.mean()) if out.sampled_density is not None else 1.0
        if rank == 0:
            record = dict(step=step, split="train", loss=float(loss.detach()),
                          accuracy=float(correct) / count, density=density,
                          expected_density=float(out.density_loss.detach()),
                          seconds=time.perf_counter() - start_time)
            if step % args.log_every == 0 or step == args.steps:
                _log(metrics_path, record)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{record['loss']:.3f}",
                                     acc=f"{record['accuracy']:.3f}",
                                     density=f"{density:.3f}")
        if args.eval_every and step % args.eval_every == 0 and rank == 0:
            _log(metrics_path, dict(step=step, **evaluate(model, task, device,
                                                          graph_generator, "val")))
        if getattr(args, "diagnose_every", 0) and step % args.diagnose_every == 0 \
                and rank == 0:
            from sbm_pyg.experiments.diagnose import repeat_diagnostics

            # Its own seeded batch and graphs: the run's RNG streams are
            # untouched, so the run trains as it would without it.
            _log(args.out / "diagnostics.jsonl",
                 dict(step=step, **repeat_diagnostics(model, batch=16, seed=step)))
        if step % args.checkpoint_every == 0 or step == args.steps:
            _save_checkpoint(model, optimizer, step,
                             _rng_state(generator, graph_generator), world,
                             checkpoint_path, rank, _jsonable(args))
    if progress is not None:
        progress.close()
    final = dict(evaluate(model, task, device, graph_generator, "test"),
                 steps=step, seconds=time.perf_counter() - start_time, world_size=world,
                 args=_jsonable(args))
    if world > 1:
        final["ranks_identical"] = _ranks_identical(model)
    if rank == 0:
        (args.out / "final.json").write_text(json.dumps(final, indent=1))
    if world > 1:
        torch.distributed.barrier()
    return final


def _jsonable(args) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def _save_checkpoint(model, optimizer, step, rng: dict, world, path, rank,
                     args: dict) -> None:
    # Every rank's RNG states go into the one checkpoint that rank 0 writes.
    states = [rng]
    if world > 1:
        states = [None] * world
        torch.distributed.all_gather_object(states, rng)
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                        step=step, rng=states, args=args), tmp)
        tmp.replace(path)


def _ranks_identical(model) -> bool:
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


@torch.no_grad()
def evaluate(model: SBMTransformer, task: _Task, device: torch.device,
             generator: torch.Generator, split: str) -> dict:
    """Accuracy and per-layer/head sampled density (eval mode: no
    exploration, no dropout). Listops test: every test example; otherwise
    ``--eval-batches`` batches."""
    model.eval()
    if task.args.task == "listops" and split == "test":
        batches = task.test_batches()
    else:
        batches = (task.batch(split) for _ in range(task.args.eval_batches))
    correct = count = 0
    loss_sum, densities = 0.0, []
    for tokens, mask, labels in batches:
        out = model(tokens.to(device), mask.to(device), generator=generator,
                    output=task.output)
        loss, c, n = task.loss_and_correct(out, mask, labels)
        correct, count, loss_sum = correct + float(c), count + n, loss_sum + float(loss) * n
        if out.sampled_density is not None:
            densities.append(out.sampled_density)
    result = dict(split=split, loss=loss_sum / count, accuracy=correct / count)
    if densities:
        per_head = torch.stack(densities).mean(0)  # [L, H]
        result.update(density=float(per_head.mean()),
                      density_per_layer_head=per_head.tolist())
    return result
