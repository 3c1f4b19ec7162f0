r"""PATTERN and CLUSTER, the node-classification benchmarks of `"Benchmarking
Graph Neural Networks" <https://arxiv.org/abs/2003.00982>`_, generated here
by their published recipe instead of downloaded."""
from __future__ import annotations

import os.path as osp
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

__all__ = ["SBMBenchmarkDataset", "generate_sbm_graphs", "RECIPES"]

#: The published generators' parameters: communities, their sizes
#: (``randint(low, high)``, high exclusive), the within/between edge
#: probabilities, and for PATTERN the pattern's size range, its edge
#: probability, the pattern-base link probability and the feature values.
RECIPES: Dict[str, dict] = {
    "PATTERN": dict(communities=5, size=(5, 35), p=0.5, q=0.35,
                    pattern_size=(5, 35), p_pattern=0.5, q_pattern=0.5,
                    vocab=3, patterns=100,
                    graphs=dict(train=100, val=20, test=20)),  # per pattern
    "CLUSTER": dict(communities=6, size=(5, 35), p=0.55, q=0.25,
                    graphs=dict(train=10000, val=1000, test=1000)),
}
SPLITS = ("train", "val", "test")

# Graphs generated at once: padded [G, n, n] uniforms, about 80 MB.
_CHUNK = 500


def _check(name: str, split: str, seed: int) -> None:
    if name not in RECIPES:
        raise ValueError(f"name must be one of {sorted(RECIPES)}, got {name!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _randint(low: int, high: int, size: Tuple[int, ...],
             generator: torch.Generator) -> Tensor:
    return torch.randint(low, high, size, generator=generator)


def _patterns(recipe: dict, generator: torch.Generator) -> List[Tuple[Tensor, Tensor]]:
    # PATTERN's patterns, each drawn once: its undirected adjacency (an
    # Erdos-Renyi graph with p_pattern) and its features.
    out = []
    sizes = _randint(*recipe["pattern_size"], (recipe["patterns"],), generator)
    for n in sizes.tolist():
        upper = torch.rand(n, n, generator=generator).triu(1) < recipe["p_pattern"]
        upper = upper & torch.ones(n, n, dtype=torch.bool).triu(1)
        feats = _randint(0, recipe["vocab"], (n,), generator)
        out.append((upper | upper.T, feats))
    return out


def _chunk(recipe: dict, count: int, generator: torch.Generator,
           pattern: Optional[Tuple[Tensor, Tensor]]) -> List[Data]:
    # `count` graphs at once, padded to the largest: community labels
    # [G, n] (-1: padding; `communities`: the pattern's nodes), a dense
    # uniform per pair, each pair's probability, then a random order.
    k = recipe["communities"]
    sizes = _randint(*recipe["size"], (count, k), generator)
    n_pat = 0 if pattern is None else pattern[0].size(0)
    base = sizes.sum(1)
    nodes = base + n_pat
    n_max = int(nodes.max())
    slot = torch.arange(n_max)
    ends = sizes.cumsum(1)  # [G, k]
    comm = torch.searchsorted(ends, slot.expand(count, n_max).contiguous(),
                              right=True)  # [G, n]: community of each slot
    comm = torch.where(slot < base[:, None], comm, torch.full_like(comm, k))
    comm = torch.where(slot < nodes[:, None], comm, torch.full_like(comm, -1))
    same = comm[:, :, None] == comm[:, None, :]
    prob = torch.where(same, recipe["p"], recipe["q"])
    if pattern is not None:
        in_pat = comm == k
        cross = in_pat[:, :, None] ^ in_pat[:, None, :]
        prob = torch.where(cross, recipe["q_pattern"], prob)
    uniform = torch.rand(count, n_max, n_max, generator=generator)
    upper = (uniform < prob) & torch.ones(n_max, n_max, dtype=torch.bool).triu(1)
    real = comm >= 0
    upper &= real[:, :, None] & real[:, None, :]
    if pattern is not None:
        # The pattern's own edges as drawn once, the same in every graph:
        # its nodes are the last n_pat slots before the padding.
        both = in_pat[:, :, None] & in_pat[:, None, :]
        upper &= ~both
        pairs = pattern[0].triu(1).nonzero()  # [P, 2]
        rows = (base[:, None] + pairs[:, 0]).reshape(-1)
        cols = (base[:, None] + pairs[:, 1]).reshape(-1)
        upper[torch.arange(count).repeat_interleave(pairs.size(0)), rows, cols] = True
    adj = upper | upper.transpose(1, 2)
    # Shuffle the real nodes of each graph (padding stays last).
    keys = torch.rand(count, n_max, generator=generator).masked_fill(~real, 2.0)
    order = keys.argsort(dim=1)  # new position -> old slot
    adj = adj.gather(1, order[:, :, None].expand(-1, -1, n_max))
    adj = adj.gather(2, order[:, None, :].expand(-1, n_max, -1))
    comm = comm.gather(1, order)
    if pattern is None:
        # CLUSTER's signal: one random node per community gets r + 1.
        feat = torch.zeros(count, n_max, dtype=torch.long)
        pick = (torch.rand(count, k, generator=generator) * sizes).long()  # [G, k]
        starts = ends - sizes
        inverse = order.argsort(dim=1)  # old slot -> new position
        feat.scatter_(1, inverse.gather(1, starts + pick),
                      torch.arange(1, k + 1).expand(count, k).contiguous())
        label, num_feats = comm, k + 1
    else:
        feat = _randint(0, recipe["vocab"], (count, n_max), generator)
        pat_feat = pattern[1].expand(count, n_pat)
        pat_slots = base[:, None] + torch.arange(n_pat)
        feat.scatter_(1, pat_slots, pat_feat.contiguous())
        feat = feat.gather(1, order)
        label, num_feats = (comm == k).long(), recipe["vocab"]
    g, i, j = adj.nonzero(as_tuple=True)  # sorted by graph, row, column
    per_graph = torch.bincount(g, minlength=count).tolist()
    edges = torch.stack([i, j]).split(per_graph, dim=1)
    x = torch.nn.functional.one_hot(feat, num_feats).float()
    return [Data(x=x[b, :n], edge_index=edges[b], y=label[b, :n])
            for b, n in enumerate(nodes.tolist())]


def generate_sbm_graphs(name: str, split: str, seed: int = 0) -> List[Data]:
    r"""The graphs of one split of PATTERN or CLUSTER by the published recipe
    (:obj:`RECIPES`), from generators seeded with :obj:`seed`: the same seed
    gives the same graphs; PATTERN's patterns are shared by its splits.

    Each graph: :obj:`x` one-hot features :math:`(N, 3)` (PATTERN) or
    :math:`(N, 7)` (CLUSTER), :obj:`edge_index` :math:`(2, E)` undirected,
    sorted, without self-loops, :obj:`y` :math:`(N)` (pattern membership,
    or community).
    """
    _check(name, split, seed)
    # The graphs are host data, as a PyG dataset's are, drawn from CPU
    # generators: the same whatever default device the caller has set.
    with torch.device("cpu"):
        return _generate(RECIPES[name], name, split, seed)


def _generate(recipe: dict, name: str, split: str, seed: int) -> List[Data]:
    count = recipe["graphs"][split]
    # One stream per split, so that the splits do not depend on each other.
    generator = torch.Generator().manual_seed(seed * 10 + 1 + SPLITS.index(split))
    graphs: List[Data] = []
    if name == "CLUSTER":
        for start in range(0, count, _CHUNK):
            graphs += _chunk(recipe, min(_CHUNK, count - start), generator, None)
        return graphs
    patterns = _patterns(recipe, torch.Generator().manual_seed(seed * 10))
    for pattern in patterns:
        graphs += _chunk(recipe, count, generator, pattern)
    return graphs


class SBMBenchmarkDataset(InMemoryDataset):
    r"""PATTERN or CLUSTER (`"Benchmarking Graph Neural Networks"
    <https://arxiv.org/abs/2003.00982>`_), generated by their published
    recipe (:func:`generate_sbm_graphs`) and cached under :obj:`root`, with
    the conventions of PyG's
    :class:`~torch_geometric.datasets.GNNBenchmarkDataset`, which downloads
    the published files instead.

    * **PATTERN** (10,000 / 2,000 / 2,000 graphs): 100 patterns (random
      graphs of 5–34 nodes, edge probability 0.5, own features in {0, 1,
      2}) each planted in 140 fresh SBMs of 5 communities of 5–34 nodes
      (:math:`p = 0.5`, :math:`q = 0.35`, features in {0, 1, 2}), every
      pattern–base pair linked with probability 0.5; label 1 on the
      pattern's nodes.
    * **CLUSTER** (10,000 / 1,000 / 1,000): SBMs of 6 communities of 5–34
      nodes (:math:`p = 0.55`, :math:`q = 0.25`); features 0 except one
      random node per community :math:`r`, whose feature is :math:`r + 1`;
      the label is the community.

    Args:
        root (str): where the generated splits are cached.
        name (str): :obj:`"PATTERN"` or :obj:`"CLUSTER"`.
        split (str): :obj:`"train"`, :obj:`"val"` or :obj:`"test"`.
            (default: :obj:`"train"`)
        seed (int): the generators' seed. (default: :obj:`0`)
        transform, pre_transform (callable, optional): as in
            :class:`~torch_geometric.data.InMemoryDataset`.

    Example:
        >>> dataset = SBMBenchmarkDataset(root, "CLUSTER", "test")  # doctest: +SKIP
        >>> dataset.num_features, dataset.num_classes  # doctest: +SKIP
        (7, 6)
    """

    def __init__(self, root: str, name: str, split: str = "train",
                 seed: int = 0, transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 force_reload: bool = False):
        _check(name, split, seed)
        self.name, self.split, self.seed = name, split, seed
        super().__init__(root, transform, pre_transform,
                         force_reload=force_reload)
        self.load(self.processed_paths[0])

    @property
    def raw_file_names(self) -> List[str]:
        """None: the graphs are generated, nothing is downloaded."""
        return []

    @property
    def processed_dir(self) -> str:
        """``root/name/processed``."""
        return osp.join(self.root, self.name, "processed")

    @property
    def processed_file_names(self) -> List[str]:
        """One file per split and seed."""
        return [f"{self.split}_seed{self.seed}.pt"]

    def download(self) -> None:
        """Nothing to download."""

    def process(self) -> None:
        """Generates the split (:func:`generate_sbm_graphs`) and saves it."""
        graphs = generate_sbm_graphs(self.name, self.split, self.seed)
        if self.pre_transform is not None:
            graphs = [self.pre_transform(g) for g in graphs]
        self.save(graphs, self.processed_paths[0])

    def __repr__(self) -> str:
        return f"{self.name}({len(self)}, split={self.split!r}, seed={self.seed})"
