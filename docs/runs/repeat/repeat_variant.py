"""One change at a time to the repeat-task run (docs/experiments.md, "What
stalls a run"): ``python docs/runs/repeat/repeat_variant.py VARIANTS N SEED OUT
[name=value ...]`` trains ``--preset repeat-paper --seq-len N --seed SEED``
on one thread with the model changed by VARIANTS (comma-separated, or
``none``) and any preset argument overridden by ``name=value``:

- ``detach``: the SBM reads the queries and keys detached, so that the
  straight-through gradient reaches the SBM's own parameters but not the
  query and key projections;
- ``mlp32``: the block's MLP 32 wide (the published code's) instead of 64;
- ``head``: a per-token Linear-ReLU-Linear head (as the published code's
  classifier) instead of one Linear.

Runs made with it (their ``final.json`` keeps the arguments):
``repeat128-detach-s{0,1}`` (``detach 128 S ... sbm_init=paper``),
``repeat128-dense-mlp32-s1`` (``mlp32 128 1 ... sbm_init=dense``),
``repeat64-full-{head,mlp32,head-mlp32}-s2`` (``attention=full``).
"""
import importlib
import sys

import torch

from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.nn.block_model import StochasticBlockModel

T = importlib.import_module("sbm_pyg.experiments.train")


def main(argv):
    variants, n, seed, out = argv[0].split(","), int(argv[1]), int(argv[2]), argv[3]
    torch.set_num_threads(1)
    if "detach" in variants:
        forward = StochasticBlockModel.forward
        StochasticBlockModel.forward = (
            lambda self, q, k: forward(self, q.detach(), k.detach()))
    build = T.build_model

    def build_model(args):
        model = build(args)
        C = args.channels
        if "mlp32" in variants:
            for block in model.blocks:
                block.mlp = torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.GELU(),
                                                torch.nn.Linear(C, C))
        if "head" in variants:
            model.token_head = torch.nn.Sequential(
                torch.nn.Linear(C, C), torch.nn.ReLU(), torch.nn.Linear(C, 1))
        return model

    T.build_model = build_model
    proto = train_arguments("repeat-paper", out="unused")
    extra = {}
    for item in argv[4:]:
        key, value = item.split("=")
        default = getattr(proto, key)
        extra[key] = value if default is None else type(default)(value)
    args = train_arguments("repeat-paper", seq_len=n, seed=seed, out=out,
                           no_progress=True, **extra)
    print(T.train(args)["accuracy"])


if __name__ == "__main__":
    main(sys.argv[1:])
