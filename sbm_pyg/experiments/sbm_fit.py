r"""An SBM alone, fitted to the graph the repeated-token task needs: can a
parametrization represent (and learn) many sparse dense blocks?

The target is the equal-token graph of :func:`~sbm_pyg.experiments.tasks.
repeat_batch` sequences (:math:`A_{ij} = 1` iff tokens :math:`i` and
:math:`j` are equal). Each token value :math:`v` has membership logits
:math:`\mathbf{z}_v \in \mathbb{R}^k` (the same for queries and keys), turned
into memberships as the parametrization does (a sigmoid for
:obj:`"paper"`, a softmax over the clusters for :obj:`"mmsb"`), and the block
matrix is the parametrization's, from :math:`k` cluster embeddings
:math:`\mathbf{C} \in \mathbb{R}^{k \times d}` (:meth:`StochasticBlockModel.
block`). Adam fits :math:`p_{ij} = \hat{\mathbf{Q}}_i \hat{\mathbf{S}}
\hat{\mathbf{K}}_j^{\top}` to :math:`A` by binary cross-entropy over all
pairs of fresh batches, from two starts:

- :obj:`"placed"`: the logits fixed at :math:`\pm 10` on one cluster per
  value (each value its own cluster: the right partition), only the block
  learned. What the parametrization can represent.
- :obj:`"random"`: the logits learned from :math:`\mathcal{N}(0, 1)`.
  What it learns from scratch.

It reports the mean :math:`p` over equal-token pairs (:math:`i \ne j`) and
over the other pairs on a held-out batch. ``python -m
sbm_pyg.experiments.sbm_fit --out FILE.json`` runs the table of
docs/experiments.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F

from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.nn.block_model import StochasticBlockModel

__all__ = ["fit_equal_token_graph", "STARTS"]

#: The starts of :func:`fit_equal_token_graph`.
STARTS = ("placed", "random")
#: The parametrizations this study fits: its memberships are free logits per
#: token, so the sharp form's MLP-side temperature and key clusters have no
#: place in it.
FORMS = ("paper", "mmsb")


def fit_equal_token_graph(parametrization: str, start: str, *,
                          seq_len: int = 64, num_clusters: int = 128,
                          channels: int = 32, steps: int = 1500,
                          batch_size: int = 16, lr: float = 1e-2,
                          balanced: bool = False, seed: int = 0
                          ) -> Dict[str, float]:
    r"""Fits an SBM of :obj:`parametrization` to the equal-token graph (see
    the module) and returns ``p_same``, ``p_other`` and the final ``loss``.

    Args:
        parametrization (str): :obj:`"paper"` or :obj:`"mmsb"`.
        start (str): :obj:`"placed"` or :obj:`"random"`.
        seq_len (int): :math:`N`; token values are :math:`1 \dots N`.
        num_clusters (int): :math:`k \ge N` for the placed start.
        channels (int): :math:`d` of the cluster embeddings.
        steps (int): Adam steps.
        batch_size (int): sequences per step.
        lr (float): Adam's learning rate.
        balanced (bool): weight the pairs so that equal and unequal ones
            count alike (the graph has few positives).
        seed (int): seeds the parameters and the batches.

    Example:
        >>> out = fit_equal_token_graph("mmsb", "placed", seq_len=8,
        ...                             num_clusters=8, steps=200)
        >>> out["p_same"] > 0.9 > 0.1 > out["p_other"]
        True
    """
    if parametrization not in FORMS:
        raise ValueError(f"parametrization must be one of {FORMS}, "
                         f"got {parametrization!r}")
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    for name, value in (("seq_len", seq_len), ("num_clusters", num_clusters),
                        ("channels", channels), ("steps", steps),
                        ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if start == "placed" and num_clusters < seq_len:
        raise ValueError(f"the placed start needs num_clusters >= seq_len "
                         f"({seq_len}), got {num_clusters}")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    sbm = StochasticBlockModel(1, channels, num_clusters,
                               parametrization=parametrization)
    logits = torch.randn(seq_len + 1, num_clusters, generator=gen)
    if start == "placed":
        logits = torch.full((seq_len + 1, num_clusters), -10.0)
        logits[torch.arange(1, seq_len + 1), torch.arange(seq_len)] = 10.0
    logits.requires_grad_(start == "random")
    params = [sbm.clusters] + ([sbm.block_bias] if sbm.block_bias is not None
                               else []) + ([logits] if start == "random" else [])
    optimizer = torch.optim.Adam(params, lr=lr)

    def probabilities(tokens: torch.Tensor) -> torch.Tensor:
        z = logits[tokens]  # [B, N, k]
        memb = z.softmax(-1) if parametrization == "mmsb" else z.sigmoid()
        return torch.einsum("biu,uv,bjv->bij", memb, sbm.block()[0], memb)

    for _ in range(steps):
        tokens, _ = repeat_batch(batch_size, seq_len, gen)
        target = (tokens[:, :, None] == tokens[:, None, :]).float()
        weight = None
        if balanced:
            pos = target.mean()
            weight = torch.where(target > 0, 0.5 / pos, 0.5 / (1 - pos))
        p = probabilities(tokens).clamp(1e-7, 1 - 1e-7)
        loss = F.binary_cross_entropy(p, target, weight=weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        tokens, _ = repeat_batch(64, seq_len, gen)
        same = tokens[:, :, None] == tokens[:, None, :]
        other_pair = ~torch.eye(seq_len, dtype=torch.bool)
        p = probabilities(tokens)
    return {"p_same": float(p[same & other_pair].mean()),
            "p_other": float(p[~same].mean()), "loss": float(loss.detach())}


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for parametrization in FORMS:
        for start in STARTS:
            for balanced in (False, True):
                result = fit_equal_token_graph(parametrization, start,
                                               steps=args.steps,
                                               balanced=balanced,
                                               seed=args.seed)
                rows.append(dict(parametrization=parametrization, start=start,
                                 balanced=balanced, **result))
                print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(seq_len=64, num_clusters=128,
                                        channels=32, steps=args.steps,
                                        seed=args.seed, rows=rows), indent=1))


if __name__ == "__main__":
    main()
