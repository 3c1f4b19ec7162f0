r"""``make demo``: sample graphs from an SBM head, before and after a short
training run.

Prints, for each sequence length, the sampled edges, the sampled density, the
closed-form expected density and the time of one forward pass of an
:class:`~sbm_pyg.nn.SBMMultiheadAttention` layer (projections, SBM, fastRG,
attention). Then trains a one-layer model for a fixed number of steps (so
that the result is the same on every machine) on the paper's "finding
repeated tokens" task and prints the table again for the trained layer.
"""
from __future__ import annotations

import argparse
import time
from typing import List, Optional, Sequence

import torch

from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import SBMMultiheadAttention
from sbm_pyg.ops import backends

HEAD_DIM = 32


def _repeat_model(length: int, num_clusters: int) -> SBMTransformer:
    # The paper's repeated-token model: one layer, one head of width 32.
    return SBMTransformer(length + 1, length, channels=HEAD_DIM,
                          num_clusters=num_clusters, token_classes=1)


def sample_table(attn: SBMMultiheadAttention, lengths: Sequence[int],
                 generator: torch.Generator) -> List[dict]:
    # One forward pass each, as a user runs it: without asking for the
    # graph, which would make a dense head build it edge by edge (the dense
    # kernel samples a mask, not a graph). The edges are the sampled
    # density's; the kernel is the one "auto" chose for the expected density.
    rows = []
    attn.eval()
    with torch.no_grad():
        for n in lengths:
            x = torch.randn(n, attn.channels, generator=generator)
            start = time.perf_counter()
            attn.out(attn.conv(x, generator=generator))
            elapsed = time.perf_counter() - start
            density = float(attn.sampled_density.mean())
            backends = attn.conv.last_backends or {}
            rows.append(dict(n=n, edges=round(density * n * n * attn.heads),
                             density=density,
                             expected=float(attn.expected_density.mean()),
                             ms=1e3 * elapsed,
                             kernel=backends.get("attention", "?")))
    return rows


def print_table(title: str, rows: List[dict]) -> None:
    print(title)
    print(f"{'seq_len':>8} {'edges':>10} {'density':>8} {'expected':>9} "
          f"{'time_ms':>8} {'Medges/s':>9}  kernel")
    for r in rows:
        print(f"{r['n']:>8} {r['edges']:>10} {r['density']:>8.4f} "
              f"{r['expected']:>9.4f} {r['ms']:>8.1f} "
              f"{r['edges'] / r['ms'] / 1e3:>9.2f}  {r['kernel']}")


def train(model: SBMTransformer, length: int, steps: int, lam: float,
          generator: torch.Generator) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # the paper's
    model.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        tokens, labels = repeat_batch(64, length, generator)
        out = model(tokens, generator=generator, output="token")
        task = torch.nn.functional.binary_cross_entropy_with_logits(
            out.token_logits.squeeze(-1), labels)
        loss = task + lam * out.density_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 or step % max(steps // 5, 1) == 0:  # six lines or so
            print(f"  {time.perf_counter() - start:5.1f} s  step {step:4d}  "
                  f"loss {float(task.detach()):.3f}  "
                  f"density {float(out.sampled_density.mean()):.3f}")
    model.eval()
    with torch.no_grad():
        tokens, labels = repeat_batch(256, length, generator)
        out = model(tokens, generator=generator, output="token")
        acc = ((out.token_logits.squeeze(-1) > 0).float() == labels).float().mean()
        majority = torch.maximum(labels.mean(), 1 - labels.mean())
    return dict(seconds=time.perf_counter() - start, accuracy=float(acc),
                majority=float(majority), density=float(out.sampled_density.mean()))


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[256, 1024, 4096])
    parser.add_argument("--train-length", type=int, default=12)
    parser.add_argument("--steps", type=int, default=600,
                        help="training steps (default: %(default)s, about 8 s "
                             "on 2 CPU cores)")
    parser.add_argument("--num-clusters", type=int, default=32)
    parser.add_argument("--lam", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 0 or args.train_length < 2 or min(args.lengths) < 1:
        parser.error("--steps must be >= 0, --train-length >= 2 and "
                     "--lengths >= 1")

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = _repeat_model(args.train_length, args.num_clusters)
    attn = model.blocks[0].attention
    backend = backends("cpu")["sampler"]
    print(f"fastrg backend: {backend}; time_ms and Medges/s are one whole "
          f"forward pass (projections, SBM, sampling, attention); kernel: "
          f"the sparse one, or 'dense' where the expected density reaches "
          f"the dense-regime kernel's crossover\n")
    print_table(f"SBM head at initialization (k={args.num_clusters}, head dim "
                f"{HEAD_DIM}, kaiming-normal clusters), random inputs:",
                sample_table(attn, args.lengths, generator))
    print(f"\ntraining on repeated tokens, N={args.train_length} (a head "
          f"that compares every pair learns it):")
    stats = train(model, args.train_length, args.steps, args.lam, generator)
    print(f"\ntrained {args.steps} steps ({stats['seconds']:.0f} s) on repeated "
          f"tokens, N={args.train_length}: token "
          f"accuracy {stats['accuracy']:.3f} (majority class "
          f"{stats['majority']:.3f}), test density {stats['density']:.3f}\n")
    print_table("The trained SBM head, random inputs:",
                sample_table(attn, args.lengths, generator))


if __name__ == "__main__":
    main()
