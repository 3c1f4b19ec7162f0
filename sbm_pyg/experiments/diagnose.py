r"""Why an SBM head does or does not learn "finding repeated tokens".

:func:`repeat_diagnostics` measures, for the first layer's heads of a trained
(or initial) model on a fresh batch, by the class of the query–key pair —
the same position (:math:`i = j`), the same token at another position (the
pairs the task needs), different tokens:

- the SBM's mean edge probability :math:`p_{ij}` (membership separation),
- the fraction of pairs sampled,
- the mean straight-through gradient :math:`\partial L / \partial p_e` on the
  sampled edges of that class, under each estimator (with the same sampled
  graphs), and the fraction of them that is negative (pushing
  :math:`p_e` up under gradient descent).

The probabilities are dense :math:`O(N^2)` per sequence: this is a
diagnostic for task-sized inputs, not a training path.

``python -m sbm_pyg.experiments.diagnose RUN_DIR [--batch 16]`` prints it as
JSON for a run's last checkpoint.
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.experiments.runs import load_run
from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn.functional import STE_MODES

__all__ = ["repeat_diagnostics", "pair_classes", "sbm_probability"]

CLASSES = ("self", "same_token", "other")


def pair_classes(tokens: Tensor) -> Tensor:
    r"""The class of each (query :math:`i`, key :math:`j`) pair,
    :obj:`[B, N, N]`: 0 self, 1 the same token elsewhere, 2 another token."""
    same = tokens[:, :, None] == tokens[:, None, :]
    eye = torch.eye(tokens.size(1), dtype=torch.bool, device=tokens.device)
    return torch.where(eye, 0, torch.where(same, 1, 2))


@torch.no_grad()
def sbm_probability(model: SBMTransformer, tokens: Tensor) -> Tensor:
    r"""The first block's SBM edge probabilities :math:`p_{ij}`
    :obj:`[B, H, N, N]` on :obj:`tokens` :obj:`[B, N]`, formed densely
    (:math:`O(N^2)` per sequence: a reference for diagnostics). Read off the
    memberships the layer's :class:`~sbm_pyg.nn.StochasticBlockModel`
    returns in one evaluation forward (a forward hook)."""
    conv = model.blocks[0].attention.conv
    captured: List = []
    handle = conv.sbm.register_forward_hook(
        lambda module, inputs, output: captured.append(output))
    was_training = model.training
    try:
        model.eval()
        model(tokens, generator=torch.Generator(tokens.device).manual_seed(0),
              output="token")
    finally:
        handle.remove()
        model.train(was_training)
    q_memb, block, k_memb = captured[0]  # rows (sequence, position)
    B, N = tokens.shape
    return torch.einsum("bihu,huv,bjhv->bhij", q_memb.view(B, N, conv.heads, -1),
                        block, k_memb.view(B, N, conv.heads, -1))


def _straight_through_gradients(model: SBMTransformer, tokens: Tensor,
                                labels: Tensor, ste: str, seed: int):
    # One training forward and backward under the estimator ste; returns the
    # first layer's graph and dL/dp of its edges. The message-passing path
    # forms the edge probabilities as a message argument, whose gradient a
    # message hook captures; the fused kernels never form them.
    conv = model.blocks[0].attention.conv
    graphs: List = []
    grads: List = []

    def capture(module, inputs, output):
        inputs[0]["edge_prob"].register_hook(lambda g: grads.append(g.detach()))

    handles = [conv.register_graph_hook(lambda _, g: graphs.append(g)),
               conv.register_message_forward_hook(capture)]
    saved = model.training, conv.ste, conv.attention_backend
    model.train()
    conv.ste, conv.attention_backend = ste, "message_passing"
    try:
        out = model(tokens, generator=torch.Generator(tokens.device)
                    .manual_seed(seed + 1), output="token")
        loss = F.binary_cross_entropy_with_logits(out.token_logits.squeeze(-1),
                                                  labels)
        model.zero_grad()
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        model.train(saved[0])
        conv.ste, conv.attention_backend = saved[1:]
    (graph,), (grad,) = graphs, grads
    return graph, grad


def repeat_diagnostics(model: SBMTransformer, batch: int = 16,
                       seed: int = 0) -> Dict[str, dict]:
    """The statistics above for :obj:`model` (attention ``"sbm"``, token
    output) on :obj:`batch` fresh sequences of its :obj:`max_len`."""
    if model.attention_kind != "sbm":
        raise ValueError("repeat_diagnostics needs an SBM model")
    N = model.max_len
    device = next(model.parameters()).device
    tokens, labels = repeat_batch(batch, N,
                                  torch.Generator().manual_seed(seed))
    tokens, labels = tokens.to(device), labels.to(device)
    classes = pair_classes(tokens)  # [B, N, N]
    result: Dict[str, dict] = {}
    for ste in STE_MODES:
        graph, grad = _straight_through_gradients(model, tokens, labels, ste, seed)
        j, i = graph.edge_index
        edge_class = classes[i // N, i % N, j % N]
        stats = {}
        for c, name in enumerate(CLASSES):
            g = grad[edge_class == c]
            stats[name] = dict(
                sampled_edges=g.numel(),
                mean_grad=float(g.mean()) if g.numel() else None,
                descent_raises_p=float((g < 0).double().mean())
                if g.numel() else None)
        result[ste] = stats
    # SBM probabilities and sampled fractions by class (graph of the last
    # forward; exploration as in training).
    p = sbm_probability(model, tokens)
    sampled = torch.zeros_like(p, dtype=torch.bool)
    j, i = graph.edge_index
    sampled[i // N, graph.head, i % N, j % N] = True
    cls = classes[:, None].expand_as(p)
    result["probability"] = {
        name: dict(mean_p=float(p[cls == c].mean()),
                   sampled_fraction=float(sampled[cls == c].double().mean()))
        for c, name in enumerate(CLASSES)}
    return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run directory of python -m sbm_pyg train")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model, run_args = load_run(args.run)
    if run_args["task"] != "repeat" or run_args["attention"] != "sbm":
        parser.error("the run must train attention sbm on the repeat task")
    result = repeat_diagnostics(model, args.batch, args.seed)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
