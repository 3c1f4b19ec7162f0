r"""GPS graph transformers on a generated long-range task:
``python -m sbm_pyg.examples.gps``.

**Task ("anchor colour").** Each graph is a ring of :math:`n` nodes
(:obj:`--min-nodes` to :obj:`--max-nodes`). One node, the anchor, is flagged;
every node has one of :obj:`--colors` colours, independently and uniformly
(so a node's neighbourhood says nothing about the anchor's colour). A node's
label is whether its colour equals the anchor's. The anchor is on average
:math:`n/4` hops away, further than the local layers reach, so local message
passing alone is at chance for most nodes; one attention edge from each node
to the anchor solves it.

**Models.** A linear encoder, :obj:`--num-layers` GPS layers (GIN local
convolution, batch norm) and a linear node classifier. The global attention
is ``none`` (local layers only), ``multihead`` or ``performer`` (PyG's
:class:`~torch_geometric.nn.conv.GPSConv`, which pads each batch with
:func:`~torch_geometric.utils.to_dense_batch`) or ``sbm``
(:class:`~sbm_pyg.nn.SBMGPSConv`, on the ragged batch), optionally with the
density penalty :obj:`--lam` and the input edges in every head's graph
(:obj:`--include-input-edges`).

Prints test accuracy, seconds per training epoch and, for ``sbm``, the
test-time density of each layer and head; :obj:`--json` writes them too.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import BatchNorm1d, Linear, Module, ModuleList, ReLU, Sequential
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv, GPSConv

from sbm_pyg.nn import SBMGPSConv

ATTENTIONS = ("none", "multihead", "performer", "sbm")


def anchor_colour_graphs(num_graphs: int, min_nodes: int, max_nodes: int,
                         colors: int, seed: int) -> List[Data]:
    r"""The generated dataset (see the module docstring): rings with node
    features :obj:`[n, colors + 1]` (one-hot colour, anchor flag) and node
    labels :obj:`y [n]` (float)."""
    if not 3 <= min_nodes <= max_nodes:
        raise ValueError(f"need 3 <= min_nodes <= max_nodes, got {min_nodes}, "
                         f"{max_nodes}")
    if colors < 2:
        raise ValueError(f"colors must be >= 2, got {colors}")
    g = torch.Generator().manual_seed(seed)
    graphs = []
    # Generated on the CPU, as a loaded dataset is, whatever torch's default
    # device is: the loader moves batches to the model's device.
    with torch.device("cpu"):
        for _ in range(num_graphs):  # dataset generation, once: not a hot path
            graphs.append(_anchor_colour_graph(min_nodes, max_nodes, colors, g))
    return graphs


def _anchor_colour_graph(min_nodes: int, max_nodes: int, colors: int,
                         g: torch.Generator) -> Data:
    n = int(torch.randint(min_nodes, max_nodes + 1, (), generator=g))
    anchor = int(torch.randint(n, (), generator=g))
    node_colour = torch.randint(colors, (n,), generator=g)
    same = node_colour == node_colour[anchor]
    flag = torch.zeros(n, 1)
    flag[anchor] = 1.0
    x = torch.cat([F.one_hot(node_colour, colors).float(), flag], dim=1)
    i = torch.arange(n)
    edge_index = torch.stack([torch.cat([i, (i + 1) % n]),
                              torch.cat([(i + 1) % n, i])])
    return Data(x=x, edge_index=edge_index, y=same.float())


class _LocalLayer(Module):
    # GPSConv's layout without the global attention.
    def __init__(self, channels: int, conv: Module):
        super().__init__()
        self.conv, self.norm1, self.norm3 = conv, BatchNorm1d(channels), BatchNorm1d(channels)
        self.mlp = Sequential(Linear(channels, 2 * channels), ReLU(),
                              Linear(2 * channels, channels))

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        h = self.norm1(self.conv(x, edge_index) + x)
        return self.norm3(h + self.mlp(h))


class GPSNet(Module):
    r"""Encoder → GPS layers → node classifier; see the module docstring.

    Shapes:
        - **input:** x :math:`(|\mathcal{V}|, F)`, edge_index
          :math:`(2, |\mathcal{E}|)`, batch :math:`(|\mathcal{V}|)`
        - **output:** logits :math:`(|\mathcal{V}|)`
    """

    def __init__(self, in_channels: int, channels: int, num_layers: int,
                 heads: int, attention: str, num_clusters: int = 32,
                 include_input_edges: bool = False):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got "
                             f"{attention!r}")
        self.attention = attention
        self.encoder = Linear(in_channels, channels)
        self.layers = ModuleList()
        for _ in range(num_layers):
            gin = GINConv(Sequential(Linear(channels, channels), ReLU(),
                                     Linear(channels, channels)))
            if attention == "none":
                layer = _LocalLayer(channels, gin)
            elif attention == "sbm":
                # A fixed seed per layer for the graphs sampled in eval():
                # the test figures repeat from run to run.
                layer = SBMGPSConv(channels, gin, heads,
                                   attn_kwargs=dict(num_clusters=num_clusters,
                                                    eval_seed=len(self.layers)),
                                   include_input_edges=include_input_edges)
            else:
                layer = GPSConv(channels, gin, heads, attn_type=attention)
            self.layers.append(layer)
        self.classifier = Linear(channels, 1)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        x = self.encoder(x)
        for layer in self.layers:
            x = layer(x, edge_index, batch)
        return self.classifier(x).squeeze(-1)

    def density(self) -> Optional[Tensor]:
        r"""Sampled density of the last forward :obj:`[layers, heads]`
        (:obj:`None` unless ``sbm``)."""
        if self.attention != "sbm":
            return None
        return torch.stack([layer.sampled_density for layer in self.layers])

    def density_loss(self) -> Tensor:
        r"""Mean expected density over layers and heads (differentiable)."""
        if self.attention != "sbm":
            return self.classifier.weight.new_zeros(())
        return torch.stack([layer.expected_density
                            for layer in self.layers]).mean()


def run(args) -> dict:
    r"""Trains and tests one model; returns its figures."""
    torch.manual_seed(args.seed)
    data = anchor_colour_graphs(args.train + args.test, args.min_nodes,
                                args.max_nodes, args.colors, args.seed)
    train_loader = DataLoader(data[:args.train], batch_size=args.batch_size,
                              shuffle=True,
                              # The sampler draws its permutation on torch's
                              # default device, with this generator.
                              generator=torch.Generator(
                                  torch.get_default_device()).manual_seed(args.seed))
    test_loader = DataLoader(data[args.train:], batch_size=args.batch_size)
    device = torch.device(args.device)
    model = GPSNet(args.colors + 1, args.hidden, args.num_layers, args.heads,
                   args.attention, args.num_clusters,
                   args.include_input_edges).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    epoch_seconds = []
    for epoch in range(args.epochs):
        model.train()
        start = time.perf_counter()
        total = count = 0
        for batch in train_loader:
            batch = batch.to(device)
            logits = model(batch.x, batch.edge_index, batch.batch)
            loss = F.binary_cross_entropy_with_logits(logits, batch.y)
            optimizer.zero_grad()
            (loss + args.lam * model.density_loss()).backward()
            optimizer.step()
            total, count = total + float(loss.detach()) * batch.num_nodes, count + batch.num_nodes
        epoch_seconds.append(time.perf_counter() - start)
        if args.verbose:
            print(f"{args.attention} epoch {epoch + 1}: loss {total / count:.4f}",
                  file=sys.stderr)
    model.eval()
    correct = nodes = 0
    densities = []
    with torch.no_grad():
        for batch in test_loader:
            batch = batch.to(device)
            logits = model(batch.x, batch.edge_index, batch.batch)
            correct += int(((logits > 0) == batch.y.bool()).sum())
            nodes += batch.num_nodes
            if model.density() is not None:
                densities.append(model.density())
    result = dict(attention=args.attention, accuracy=correct / nodes,
                  seconds_per_epoch=sum(epoch_seconds) / len(epoch_seconds),
                  train_loss=total / count)
    if densities:
        per_layer_head = torch.stack(densities).mean(0)
        result.update(density=float(per_layer_head.mean()),
                      density_per_layer_head=per_layer_head.tolist())
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sbm_pyg.examples.gps",
                                     description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--attention", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS))
    add("--epochs", type=int, default=20)
    add("--train", type=int, default=2000, help="training graphs")
    add("--test", type=int, default=500, help="test graphs")
    add("--min-nodes", type=int, default=32)
    add("--max-nodes", type=int, default=64)
    add("--colors", type=int, default=2)
    add("--hidden", type=int, default=32)
    add("--num-layers", type=int, default=2, help="GPS layers")
    add("--heads", type=int, default=2)
    add("--num-clusters", type=int, default=32, help="SBM clusters per head")
    add("--lam", type=float, default=0.0, help="density penalty (sbm)")
    add("--include-input-edges", action="store_true")
    add("--batch-size", type=int, default=32)
    add("--lr", type=float, default=1e-3)
    add("--seed", type=int, default=0)
    add("--device", default="cpu", help="where the model trains (cpu, cuda)")
    # Another thread count sums in another order: the runs' figures would
    # drift from docs/gps.md's (made with one).
    add("--threads", type=int, default=1, help="torch's CPU threads")
    add("--json", type=Path, help="write the results here")
    add("--verbose", action="store_true", help="print each epoch's loss")
    args = parser.parse_args(argv)
    for name in ("epochs", "train", "test", "hidden", "num_layers", "heads",
                 "num_clusters", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.hidden % args.heads:
        parser.error("--heads must divide --hidden")
    if not 3 <= args.min_nodes <= args.max_nodes or args.colors < 2:
        parser.error("need 3 <= --min-nodes <= --max-nodes and --colors >= 2")
    if args.lam < 0 or args.lr <= 0:
        parser.error("--lam must be >= 0 and --lr > 0")
    torch.set_num_threads(args.threads)
    results = []
    print(f"{'attention':>10} {'accuracy':>9} {'s/epoch':>8} {'density':>8}")
    for attention in args.attention:
        result = run(argparse.Namespace(**{**vars(args), "attention": attention}))
        results.append(result)
        density = f"{result['density']:.4f}" if "density" in result else "-"
        print(f"{attention:>10} {result['accuracy']:9.4f} "
              f"{result['seconds_per_epoch']:8.2f} {density:>8}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(dict(args={k: str(v) if isinstance(v, Path) else v
                                                   for k, v in vars(args).items()},
                                             results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
