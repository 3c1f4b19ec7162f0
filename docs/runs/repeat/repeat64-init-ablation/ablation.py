"""One initialization difference at a time, at N = 64 (the paper's repeat
settings otherwise: batch 256, 1 layer, 1 head, width 32, k = 128, Adam lr
1e-3, exact mode, exploration 0.01, lambda 0, the paper's estimator, seed 0).

Each variant builds the default SBMTransformer (the published code's scales:
clusters N(0, 2 / (k d)), embeddings N(0, 0.02^2)) and puts back the
earlier scale of one or both:

- ``clusters-per-head``: clusters N(0, 2 / d), kaiming-normal with a
  per-head fan-in of d (std 0.25);
- ``embeddings-unit``: token and position embeddings N(0, 1), what
  torch.nn.Embedding draws.

The published estimator's runs also try the published code's other
choices where the paper is silent: ``--adam-eps 1e-6`` (its AdamW's eps;
torch's default is 1e-8) and ``--qkv-bias`` (biases in the query, key and
value projections).

Writes NAME.jsonl here (train loss, accuracy, sampled density every 20
steps) and NAME-final.json (test accuracy and density on 8 fresh batches,
eval mode), NAME = VARIANT plus the options given.
Usage: python ablation.py VARIANT [--steps 1200] [--ste published]
[--adam-eps 1e-6] [--qkv-bias]
"""
import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer

N, K, D = 64, 128, 32
VARIANTS = ("default", "clusters-per-head", "embeddings-unit", "both-earlier")


def build(variant: str, ste: str, qkv_bias: bool) -> SBMTransformer:
    model = SBMTransformer(N + 1, N, channels=D, num_clusters=K, token_classes=1,
                           exploration=0.01, mode="exact", ste=ste,
                           qkv_bias=qkv_bias)
    with torch.no_grad():
        if variant in ("clusters-per-head", "both-earlier"):
            sbm = model.blocks[0].attention.conv.sbm
            sbm.clusters.normal_(0.0, math.sqrt(2.0 / D))
        if variant in ("embeddings-unit", "both-earlier"):
            model.token_embedding.weight.normal_()
            model.position_embedding.weight.normal_()
    return model


def accuracy(model, tokens, labels, generator):
    out = model(tokens, generator=generator, output="token")
    logits = out.token_logits.squeeze(-1)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    return loss, float(((logits > 0).float() == labels).float().mean()), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--ste", choices=["paper", "published"], default="paper")
    parser.add_argument("--adam-eps", type=float, default=1e-8)
    parser.add_argument("--qkv-bias", action="store_true")
    args = parser.parse_args()
    name = args.variant + ("" if args.ste == "paper" else f"-{args.ste}")
    name += "" if args.adam_eps == 1e-8 else f"-eps{args.adam_eps:g}"
    name += "-qkv-bias" if args.qkv_bias else ""
    here = Path(__file__).parent
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = build(args.variant, args.ste, args.qkv_bias)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=args.adam_eps)
    log = here / f"{name}.jsonl"
    log.write_text("")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        model.train()
        tokens, labels = repeat_batch(256, N, generator)
        loss, acc, out = accuracy(model, tokens, labels, generator)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            with open(log, "a") as f:
                f.write(json.dumps(dict(
                    step=step, loss=float(loss.detach()), accuracy=acc,
                    density=float(out.sampled_density.mean()),
                    seconds=time.perf_counter() - start)) + "\n")
    model.eval()
    accs, dens = [], []
    with torch.no_grad():
        for _ in range(8):
            tokens, labels = repeat_batch(256, N, generator)
            _, acc, out = accuracy(model, tokens, labels, generator)
            accs.append(acc)
            dens.append(float(out.sampled_density.mean()))
    (here / f"{name}-final.json").write_text(json.dumps(dict(
        variant=args.variant, ste=args.ste, adam_eps=args.adam_eps,
        qkv_bias=args.qkv_bias, steps=args.steps, test_accuracy=sum(accs) / 8,
        test_density=sum(dens) / 8), indent=1))


if __name__ == "__main__":
    main()
