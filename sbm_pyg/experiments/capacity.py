r"""Can an SBM hold a trained attention's edges at a given density? The
selector's capacity, measured with the teacher frozen.

A trained full-attention model (a run of ``python -m sbm_pyg train
--attention full``) is the teacher: for each of its layers, the queries
and keys its heads compute on fresh task batches and their dense attention
rows :math:`A`. A candidate SBM alone (the teacher untouched) maps those
queries and keys to edge probabilities :math:`P_{ij}` (exact mode:
:math:`\min(p_{ij}, 1)`) and is fitted by Adam to

.. math::
    \mathcal{L} = \frac{1}{|\text{rows}|} \sum_i \Big[\mathrm{KL}\big(A_i \,\|\,
    P_i / {\textstyle\sum_j} P_{ij}\big) + 1 - \sum_j A_{ij} P_{ij}\Big]

(the row's shape, and its expected recall) plus
:math:`\mu \max(0, d / \rho - 1)^2`, a quadratic penalty that holds the
expected density :math:`d` at :math:`\rho` (an augmented Lagrangian's
multiplier, tried first, grew while Adam was still taking the density
down and then held it far below :math:`\rho`). On held-out batches it
reports the expected density, the expected recall (as
:mod:`~sbm_pyg.experiments.recall` defines it), the probability on each
scored row's heaviest key (mean and 5th percentile) and the teacher's
accuracy when every layer attends only on a graph sampled from its fitted
SBM (a row without an edge outputs zero, as the sparse kernels do).

The candidates (:data:`CANDIDATES`) are the library's two parametrizations
and variants of the mixed-membership one that the sparse-heads work asks
about: more clusters, a learned membership temperature, sparse
memberships (each token in its top :math:`r = 2` clusters), separate query
and key cluster embeddings with an asymmetric block, a bounded block
logit (so that the budget keeps a gradient), :obj:`"mmsb-sharp"`, the
first three together (twice the clusters), and that with separate key
clusters (:obj:`"mmsb-sharp-asymmetric"`) or four times the clusters
(:obj:`"mmsb-sharp-k512"` at :math:`k = 128`).

``python -m sbm_pyg.experiments.capacity TEACHER_RUN --out FILE.json``
writes the curves (every candidate and layer at
:math:`\rho \in \{0.02, 0.05, 0.1\}`). Dense :math:`O(N^2)` per sequence
and head: for task-sized teachers.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sbm_pyg.experiments.runs import load_run
from sbm_pyg.experiments.tasks import make_task, task_forward
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn.baselines import FullAttention

__all__ = ["CANDIDATES", "CandidateSBM", "teacher_batches", "fit_selector",
           "sampled_accuracy"]

#: The SBM forms fitted, by name.
CANDIDATES = ("paper", "mmsb", "mmsb-k256", "mmsb-temperature", "mmsb-top2",
              "mmsb-asymmetric", "mmsb-bounded", "mmsb-sharp", "mmsb-sharp-asymmetric",
              "mmsb-sharp-k512")
# What each variant adds to the mixed-membership form: the clusters'
# multiple of num_clusters, a learned temperature, top-2 memberships,
# separate key clusters.
_CLUSTERS = {"mmsb-k256": 2, "mmsb-sharp": 2, "mmsb-sharp-asymmetric": 2, "mmsb-sharp-k512": 4}
_TEMPERATURE = ("mmsb-temperature", "mmsb-sharp", "mmsb-sharp-asymmetric", "mmsb-sharp-k512")
_TOP2 = ("mmsb-top2", "mmsb-sharp", "mmsb-sharp-asymmetric", "mmsb-sharp-k512")
_ASYMMETRIC = ("mmsb-asymmetric", "mmsb-sharp-asymmetric")
_BOUND = 6.0  # the bounded block's logits lie in (-6, 6) before its bias


class CandidateSBM(torch.nn.Module):
    r"""One of :data:`CANDIDATES` as a map from a head's queries and keys
    :obj:`[B, H, N, d]` to edge probabilities :obj:`[B, H, N_q, N_k]` (the
    SBM's :math:`p`, before the exact mode's clamp).

    Args:
        candidate (str): the form.
        heads (int): :math:`H`.
        channels (int): :math:`d`.
        num_clusters (int): :math:`k` (doubled by :obj:`"mmsb-k256"`).
        init_std (float): the cluster embeddings' start,
            :math:`\mathcal{N}(0, \sigma^2)`. (default: :obj:`0.3`: from the
            library's kaiming-normal start, about 0.02 at :math:`k = 128`,
            the memberships begin near uniform and the fits on the repeat
            teacher stayed at a constant :math:`p`)

    Example:
        >>> sbm = CandidateSBM("mmsb-top2", heads=2, channels=4, num_clusters=8)
        >>> sbm(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)).shape
        torch.Size([1, 2, 5, 5])
    """

    def __init__(self, candidate: str, heads: int, channels: int,
                 num_clusters: int = 128, init_std: float = 0.3):
        super().__init__()
        if candidate not in CANDIDATES:
            raise ValueError(f"candidate must be one of {CANDIDATES}, got {candidate!r}")
        self.candidate = candidate
        k = _CLUSTERS.get(candidate, 1) * num_clusters
        self.clusters = torch.nn.Parameter(init_std * torch.randn(heads, k, channels))
        self.key_clusters = None
        if candidate in _ASYMMETRIC:
            self.key_clusters = torch.nn.Parameter(
                init_std * torch.randn(heads, k, channels))
        self.bias = torch.nn.Parameter(torch.full((heads, 1, 1), -1.0))
        self.log_temperature = torch.nn.Parameter(torch.zeros(heads, 1, 1))

    def memberships(self, x: Tensor, clusters: Tensor) -> Tensor:
        logits = torch.einsum("bhnd,hkd->bhnk", x, clusters)
        if self.candidate == "paper":
            return logits.sigmoid()
        if self.candidate in _TEMPERATURE:
            logits = logits * self.log_temperature.exp()
        memb = logits.softmax(-1)
        if self.candidate in _TOP2:
            top = memb.topk(2, dim=-1)
            memb = torch.zeros_like(memb).scatter(-1, top.indices, top.values)
            memb = memb / memb.sum(-1, keepdim=True)
        return memb

    def block(self) -> Tensor:
        keys = self.clusters if self.key_clusters is None else self.key_clusters
        logits = torch.bmm(self.clusters, keys.transpose(1, 2))
        if self.candidate == "paper":
            return logits.flatten(1).softmax(-1).view_as(logits)
        if self.candidate == "mmsb-bounded":
            logits = _BOUND * torch.tanh(logits / _BOUND)
        return (logits + self.bias).sigmoid()

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        keys = self.clusters if self.key_clusters is None else self.key_clusters
        q, k = self.memberships(query, self.clusters), self.memberships(key, keys)
        return torch.einsum("bhiu,huv,bhjv->bhij", q, self.block(), k)


def _attention_layers(model: SBMTransformer) -> List[FullAttention]:
    layers = [m for m in model.modules() if isinstance(m, FullAttention)]
    if not layers:
        raise ValueError("the teacher must be a full-attention model "
                         "(--attention full)")
    return layers


Batch = Dict[str, Tensor]


@torch.no_grad()
def teacher_batches(model: SBMTransformer, task, count: int) -> List[List[Batch]]:
    r""":obj:`count` fresh batches of :obj:`task` through the frozen
    :obj:`model`: per batch and layer, the queries and keys
    (:obj:`[B, H, N, d]`), the dense attention :obj:`[B, H, N, N]`, the
    real tokens :obj:`[B, N]` and the rows the task scores :obj:`[B, N]`."""
    layers = _attention_layers(model)
    seen: List[Tuple[Tensor, Optional[Tensor]]] = []
    handles = [layer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((args[0], kwargs.get("mask", args[1]
                                                                      if len(args) > 1
                                                                      else None))),
        with_kwargs=True) for layer in layers]
    batches = []
    try:
        for _ in range(count):
            tokens, mask, labels = task.batch()
            seen.clear()
            model(tokens, mask)
            scored = labels != -100  # MQAR asks at some positions, the others at all
            per_layer = []
            for layer, (x, real) in zip(layers, seen):
                q, k, _ = layer.split(x)
                real = mask if real is None else real
                scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.size(-1))
                A = scores.masked_fill(~real[:, None, None, :], -math.inf).softmax(-1)
                per_layer.append(dict(query=q, key=k, attention=A, real=real,
                                      scored=scored & real))
            batches.append(per_layer)
    finally:
        for handle in handles:
            handle.remove()
    return batches


def _edge_prob(p: Tensor) -> Tensor:
    return p.clamp(0, 1)


def _statistics(sbm: CandidateSBM, batches: Sequence[Batch]) -> Dict[str, float]:
    density = recall = top = pairs = rows = 0.0
    tops: List[Tensor] = []
    with torch.no_grad():
        for b in batches:
            P = _edge_prob(sbm(b["query"], b["key"]))
            A, real = b["attention"], b["real"]
            valid = (real[:, None, :, None] & real[:, None, None, :]).expand_as(P)
            density += float((P * valid).sum())
            pairs += float(valid.sum())
            rows_mask = real[:, None, :].expand(-1, P.size(1), -1)
            recall += float(((A * P).sum(-1) * rows_mask).sum())
            rows += float(rows_mask.sum())
            top_p = P.gather(-1, A.argmax(-1, keepdim=True)).squeeze(-1)
            tops.append(top_p[b["scored"][:, None, :].expand_as(top_p)])
    top_all = torch.cat(tops)
    top = float(top_all.mean()) if top_all.numel() else float("nan")
    return dict(expected_density=density / pairs, expected_recall=recall / rows,
                top_key_probability=top,
                top_key_probability_p5=float(top_all.quantile(0.05))
                if top_all.numel() else float("nan"))


def fit_selector(batches: Sequence[Batch], held_out: Sequence[Batch],
                 candidate: str, rho: float, *, num_clusters: int = 128,
                 steps: int = 600, lr: float = 1e-2, mu: float = 100.0,
                 init_std: float = 0.3, seed: int = 0
                 ) -> Tuple[CandidateSBM, Dict[str, float]]:
    r"""Fits a :class:`CandidateSBM` to one layer's :obj:`batches` (from
    :func:`teacher_batches`) at expected density at most :obj:`rho`, and
    returns it with its :obj:`held_out` statistics and its last loss."""
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not batches or not held_out:
        raise ValueError("batches and held_out must not be empty")
    torch.manual_seed(seed)
    first = batches[0]
    sbm = CandidateSBM(candidate, first["query"].size(1), first["query"].size(-1),
                       num_clusters, init_std)
    optimizer = torch.optim.Adam(sbm.parameters(), lr=lr)
    for step in range(steps):
        b = batches[step % len(batches)]
        P = _edge_prob(sbm(b["query"], b["key"]))
        A, real = b["attention"], b["real"]
        valid = (real[:, None, :, None] & real[:, None, None, :]).expand_as(P)
        rows = real[:, None, :].expand(-1, P.size(1), -1)
        mass = (P * valid).sum(-1, keepdim=True).clamp(min=1e-12)
        kl = (A * (A.clamp(min=1e-12).log() - (P.clamp(min=1e-12) / mass).log())
              ).sum(-1)
        recall = (A * P).sum(-1)
        fit = ((kl + 1 - recall) * rows).sum() / rows.sum()
        excess = (P * valid).sum() / valid.sum() / rho - 1
        loss = fit + mu * excess.clamp(min=0) ** 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stats = _statistics(sbm, held_out)
    stats["loss"] = float(fit.detach())
    return sbm, stats


@contextmanager
def _sampled_attention(model: SBMTransformer, sbms: Sequence[CandidateSBM],
                       generator: torch.Generator) -> Iterator[None]:
    # Each full-attention layer attends only on a graph drawn from its SBM.
    layers = _attention_layers(model)
    saved = [layer.forward for layer in layers]

    def sampled(layer: FullAttention, sbm: CandidateSBM):
        def forward(x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
            q, k, v = layer.split(x)
            P = _edge_prob(sbm(q, k))
            edges = torch.rand(P.shape, generator=generator) < P
            if mask is not None:
                edges &= mask[:, None, None, :]
            scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.size(-1))
            weights = scores.masked_fill(~edges, -math.inf).softmax(-1)
            weights = weights.nan_to_num(0.0)  # a row without an edge: zero
            return layer.merge(weights @ v)
        return forward

    try:
        for layer, sbm in zip(layers, sbms):
            layer.forward = sampled(layer, sbm)  # type: ignore[method-assign]
        yield
    finally:
        for layer, forward in zip(layers, saved):
            layer.forward = forward  # type: ignore[method-assign]


@torch.no_grad()
def sampled_accuracy(model: SBMTransformer, task, sbms: Sequence[CandidateSBM],
                     num_batches: int, seed: int = 0) -> float:
    r"""The frozen :obj:`model`'s accuracy on :obj:`task`'s test batches
    when each layer attends only on a graph sampled from its SBM in
    :obj:`sbms` (one per layer, in order)."""
    generator = torch.Generator().manual_seed(seed)
    correct = count = 0.0
    with _sampled_attention(model, sbms, generator):
        for tokens, mask, labels in task.eval_batches("test", num_batches):
            out = task_forward(model, task, (tokens, mask, labels), tokens.device)
            _, c, n = task.loss_and_correct(out, mask, labels)
            correct, count = correct + float(c), count + n
    return correct / count


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", help="run directory of a full-attention model")
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES),
                        choices=CANDIDATES)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.02, 0.05, 0.1])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batches", type=int, default=8,
                        help="training batches of the teacher's rows")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--init-std", type=float, default=0.3,
                        help="the cluster embeddings' start N(0, std^2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model, run_args = load_run(args.teacher)
    for p in model.parameters():
        p.requires_grad_(False)
    run = argparse.Namespace(**dict(run_args, batch_size=args.batch_size))
    task = make_task(run, torch.Generator().manual_seed(args.seed + 1))
    train = teacher_batches(model, task, args.batches)
    held_out = teacher_batches(model, task, 2)
    rows = []
    result = dict(teacher=str(args.teacher), task=run_args["task"],
                  seq_len=run_args["seq_len"], steps=args.steps, seed=args.seed,
                  init_std=args.init_std,
                  batches=args.batches, batch_size=args.batch_size,
                  num_clusters=run_args["num_clusters"], rows=rows)
    for candidate in args.candidates:
        for rho in args.rho:
            start = time.perf_counter()
            sbms = []
            for layer in range(len(train[0])):
                sbm, stats = fit_selector([b[layer] for b in train],
                                          [b[layer] for b in held_out], candidate, rho,
                                          num_clusters=run_args["num_clusters"],
                                          steps=args.steps, init_std=args.init_std,
                                          seed=args.seed)
                sbms.append(sbm)
                rows.append(dict(candidate=candidate, rho=rho, layer=layer, **stats))
            accuracy = sampled_accuracy(model, task, sbms, args.eval_batches, args.seed)
            for row in rows[-len(sbms):]:
                row.update(sampled_accuracy=accuracy,
                           seconds=time.perf_counter() - start)
            for row in rows[-len(sbms):]:
                print(json.dumps(row), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
