r"""``make demo``: sample graphs from an SBM head, before and after a few
seconds of training.

Prints, for each sequence length, the sampled edges, the sampled density, the
closed-form expected density and the time of one forward pass of an
:class:`~sbm_pyg.nn.SBMMultiheadAttention` layer (projections, SBM, fastRG,
attention). Then trains a one-layer model for a few seconds on the paper's
"finding repeated tokens" task with the density penalty and prints the table
again for the trained layer.
"""
from __future__ import annotations

import argparse
import time
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.nn import SBMMultiheadAttention
from sbm_pyg.sampling import _compiled as _fastrg_compiled

HEAD_DIM = 32


class _RepeatModel(torch.nn.Module):
    # Token + position embedding -> SBM attention -> per-token logit.
    def __init__(self, vocab: int, length: int, num_clusters: int):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, HEAD_DIM)
        self.positions = torch.nn.Embedding(length, HEAD_DIM)
        self.attn = SBMMultiheadAttention(HEAD_DIM, heads=1,
                                          head_channels=HEAD_DIM,
                                          num_clusters=num_clusters)
        self.head = torch.nn.Sequential(torch.nn.Linear(2 * HEAD_DIM, HEAD_DIM),
                                        torch.nn.ReLU(),
                                        torch.nn.Linear(HEAD_DIM, 1))

    def forward(self, tokens: Tensor, generator: torch.Generator) -> Tensor:
        pos = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tokens(tokens) + self.positions(pos)
        h = self.attn(x, generator=generator)
        return self.head(torch.cat([x, h], dim=-1)).squeeze(-1)


def sample_table(attn: SBMMultiheadAttention, lengths: Sequence[int],
                 generator: torch.Generator) -> List[dict]:
    rows = []
    attn.eval()
    with torch.no_grad():
        for n in lengths:
            x = torch.randn(n, attn.channels, generator=generator)
            start = time.perf_counter()
            out, (graph, _) = attn.conv(x, generator=generator,
                                        return_attention_weights=True)
            attn.out(out)
            elapsed = time.perf_counter() - start
            rows.append(dict(n=n, edges=graph.num_edges,
                             density=float(attn.sampled_density.mean()),
                             expected=float(attn.expected_density.mean()),
                             ms=1e3 * elapsed))
    return rows


def print_table(title: str, rows: List[dict]) -> None:
    print(title)
    print(f"{'seq_len':>8} {'edges':>10} {'density':>8} {'expected':>9} "
          f"{'time_ms':>8} {'Medges/s':>9}")
    for r in rows:
        print(f"{r['n']:>8} {r['edges']:>10} {r['density']:>8.4f} "
              f"{r['expected']:>9.4f} {r['ms']:>8.1f} "
              f"{r['edges'] / r['ms'] / 1e3:>9.2f}")


def train(model: _RepeatModel, length: int, seconds: float, lam: float,
          generator: torch.Generator) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    start, step = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        tokens, labels = repeat_batch(32, length, generator)
        logits = model(tokens, generator)
        task = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss = task + lam * model.attn.expected_density.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    model.eval()
    with torch.no_grad():
        tokens, labels = repeat_batch(256, length, generator)
        acc = ((model(tokens, generator) > 0).float() == labels).float().mean()
        majority = torch.maximum(labels.mean(), 1 - labels.mean())
    return dict(steps=step, loss=float(task.detach()), accuracy=float(acc),
                majority=float(majority),
                density=float(model.attn.sampled_density.mean()))


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[256, 1024, 4096])
    parser.add_argument("--train-length", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--num-clusters", "--clusters", type=int, default=128,
                        dest="num_clusters", help="(--clusters: earlier name)")
    parser.add_argument("--lam", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.seconds < 0 or args.train_length < 2 or min(args.lengths) < 1:
        parser.error("--seconds must be >= 0, --train-length >= 2 and "
                     "--lengths >= 1")

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = _RepeatModel(args.train_length + 1, args.train_length, args.num_clusters)
    backend = "compiled" if _fastrg_compiled.available() else "torch"
    print(f"fastrg backend: {backend}; time_ms and Medges/s are one whole "
          f"forward pass (projections, SBM, sampling, attention)\n")
    print_table(f"SBM head at initialization (k={args.num_clusters}, head dim "
                f"{HEAD_DIM}, kaiming-normal clusters), random inputs:",
                sample_table(model.attn, args.lengths, generator))
    stats = train(model, args.train_length, args.seconds, args.lam, generator)
    print(f"\ntrained {stats['steps']} steps ({args.seconds:.0f} s) on repeated "
          f"tokens, N={args.train_length}: loss {stats['loss']:.3f}, token "
          f"accuracy {stats['accuracy']:.3f} (majority class "
          f"{stats['majority']:.3f}), test density {stats['density']:.3f}\n")
    print_table("The trained SBM head, random inputs:",
                sample_table(model.attn, args.lengths, generator))


if __name__ == "__main__":
    main()
