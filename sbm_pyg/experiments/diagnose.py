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
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import conv as conv_module
from sbm_pyg.nn.functional import STE_MODES

__all__ = ["repeat_diagnostics"]

CLASSES = ("self", "same_token", "other")


def _pair_classes(tokens: Tensor) -> Tensor:
    # [B, N, N] class index of (query i, key j): 0 self, 1 same token, 2 other.
    same = tokens[:, :, None] == tokens[:, None, :]
    eye = torch.eye(tokens.size(1), dtype=torch.bool, device=tokens.device)
    return torch.where(eye, 0, torch.where(same, 1, 2))


@torch.no_grad()
def _sbm_probability(model: SBMTransformer, tokens: Tensor) -> Tensor:
    # [B, H, N, N] the first block's SBM edge probabilities p_ij, formed
    # densely: a reference for diagnostics, O(N^2) per sequence.
    B, N = tokens.shape
    x = model.token_embedding(tokens) + model.position_embedding(
        torch.arange(N, device=tokens.device))
    flat = model.blocks[0].norm1(x).reshape(B * N, -1)
    conv = model.blocks[0].attention.conv
    H, C = conv.heads, conv.out_channels
    q_memb, block, k_memb = conv.sbm(conv.lin_query(flat).view(-1, H, C),
                                     conv.lin_key(flat).view(-1, H, C))
    return torch.einsum("bihu,huv,bjhv->bhij", q_memb.view(B, N, H, -1), block,
                        k_memb.view(B, N, H, -1))


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
    classes = _pair_classes(tokens)  # [B, N, N]
    conv = model.blocks[0].attention.conv
    result: Dict[str, dict] = {}
    for ste in STE_MODES:
        captured: List = []

        def probability(*args, _f=conv_module._ste_probability):
            p = _f(*args)
            p.register_hook(lambda g: captured.append(g.detach()))
            return p

        graphs: List = []
        handle = conv.register_graph_hook(lambda _, g: graphs.append(g))
        was_training, old_ste, old_fuse = model.training, conv.ste, conv.fuse
        model.train()
        conv.ste = ste
        # The message path forms the edge probabilities as a tensor, whose
        # gradient is what is captured; the fused kernels never form it.
        conv.fuse = False
        try:
            with mock.patch.object(conv_module, "_ste_probability", probability):
                out = model(tokens, generator=torch.Generator(device)
                            .manual_seed(seed + 1), output="token")
                loss = F.binary_cross_entropy_with_logits(
                    out.token_logits.squeeze(-1), labels)
                model.zero_grad()
                loss.backward()
        finally:
            handle.remove()
            model.train(was_training)
            conv.ste, conv.fuse = old_ste, old_fuse
        (graph,), (grad,) = graphs, captured
        j, i = graph.edge_index
        edge_class = classes[i // N, i % N, j % N]
        stats = {}
        for c, name in enumerate(CLASSES):
            sel = edge_class == c
            g = grad[sel]
            stats[name] = dict(
                sampled_edges=int(sel.sum()),
                mean_grad=float(g.mean()) if g.numel() else None,
                descent_raises_p=float((g < 0).double().mean())
                if g.numel() else None)
        result[ste] = stats
    # SBM probabilities and sampled fractions by class (graph of the last
    # forward; exploration as in training).
    p = _sbm_probability(model, tokens)
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
    from sbm_pyg.experiments.train import load_run
    model, run_args = load_run(args.run)
    if run_args["task"] != "repeat" or run_args["attention"] != "sbm":
        parser.error("the run must train attention sbm on the repeat task")
    result = repeat_diagnostics(model, args.batch, args.seed)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
