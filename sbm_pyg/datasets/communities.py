r"""Community classification on one large graph: CLUSTER's recipe scaled
to :math:`10^5` nodes and more, and the semi-supervised task on any graph
with communities (an LFR graph, :func:`~sbm_pyg.datasets.lfr.lfr_graph`).

The task is CLUSTER's (`"Benchmarking Graph Neural Networks"
<https://arxiv.org/abs/2003.00982>`_), on one graph: a few nodes of each
community carry their community as a one-hot feature (the seeds), every
other node a zero vector, so the features alone give nothing away; a node's
community must be found from the seeds it can reach. The other nodes are
split at random into training, validation and test nodes. Optionally every
node also gets noisy features of its community's random centre (the
setting of feature-similar nodes far apart in the graph, which a global
attention can join and a local layer cannot).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, to_undirected

__all__ = ["CLUSTER_DEGREES", "cluster_graph", "community_task"]

#: CLUSTER's expected within- and between-community degrees: 6 communities
#: of 5-34 nodes (mean 19.5), p = 0.55 within and q = 0.25 between, so a
#: node has about 0.55 * 18.5 = 10.2 links inside and 0.25 * 97.5 = 24.4
#: outside (a mixing of 0.70). Scaled, the degrees stay and p, q shrink.
CLUSTER_DEGREES = (0.55 * 18.5, 0.25 * 5 * 19.5)


def cluster_graph(n: int, communities: int = 6,
                  degrees: Tuple[float, float] = CLUSTER_DEGREES,
                  generator: Optional[torch.Generator] = None) -> Data:
    r"""A graph of :obj:`n` nodes by CLUSTER's recipe at scale: community
    sizes drawn as CLUSTER's (uniform on 5-34) and scaled to sum to
    :obj:`n`, then a stochastic block model whose expected within- and
    between-community degrees are :obj:`degrees` (CLUSTER's by default):
    each block's edge count Poisson, its endpoints uniform in its
    communities, repeated edges and self-loops dropped (a pair's chance of
    a second draw is :math:`O(d / n)`).

    Shapes:
        **output:** :obj:`edge_index` :math:`(2, |\mathcal{E}|)` (both
        directions), :obj:`y` :math:`(n)` communities.

    Example:
        >>> g = cluster_graph(6000, generator=torch.Generator().manual_seed(0))
        >>> g.num_nodes, abs(g.num_edges / 6000 - (10.2 + 24.4)) < 2  # mean degree
        (6000, True)
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 * communities:
        raise ValueError(f"n must be an int >= 2 * communities = {2 * communities}, "
                         f"got {n!r}")
    if not isinstance(communities, int) or communities < 2:
        raise ValueError(f"communities must be an int >= 2, got {communities!r}")
    inside, outside = degrees
    if not (inside >= 0 and outside >= 0 and inside + outside > 0):
        raise ValueError(f"degrees must be two numbers >= 0, not both 0, got {degrees}")
    raw = torch.randint(5, 35, (communities,), generator=generator).double()
    sizes = torch.floor(raw / raw.sum() * n).long().clamp_(min=1)
    sizes[sizes.argmax()] += n - int(sizes.sum())
    ends = sizes.cumsum(0)
    starts = ends - sizes
    # Edges per block pair (a, b), a <= b: the node pairs times p (within)
    # or q (between), chosen so that a node's mean degrees are `degrees`.
    # A node's mean community size (sum s^2 / n) sets the mean degrees.
    shared = float((sizes.double() ** 2).sum()) / n
    p = inside / max(shared - 1, 1.0)
    q = outside / (n - shared)
    a, b = torch.triu_indices(communities, communities)
    pairs = torch.where(a == b, sizes[a] * (sizes[a] - 1) / 2, sizes[a] * sizes[b])
    rate = pairs.double() * torch.where(a == b, p, q)
    count = torch.poisson(rate, generator=generator).long()
    block = torch.arange(a.numel()).repeat_interleave(count)
    u = starts[a[block]] + (torch.rand(block.numel(), generator=generator, dtype=torch.float64)
                            * sizes[a[block]]).long()
    v = starts[b[block]] + (torch.rand(block.numel(), generator=generator, dtype=torch.float64)
                            * sizes[b[block]]).long()
    keep = u != v
    edge_index = to_undirected(coalesce(torch.stack([u[keep], v[keep]]), num_nodes=n),
                               num_nodes=n)
    # Communities in a random order of the nodes, as CLUSTER shuffles them.
    order = torch.randperm(n, generator=generator)
    y = torch.arange(communities).repeat_interleave(sizes)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(n)
    return Data(edge_index=coalesce(inverse[edge_index], num_nodes=n), y=y[order],
                num_nodes=n)


def community_task(graph: Data, seeds: int = 1, split: Tuple[float, float] = (0.5, 0.25),
                   generator: Optional[torch.Generator] = None, features: int = 0,
                   noise: float = 1.0) -> Data:
    r"""CLUSTER's task on :obj:`graph` (its :obj:`y` the communities):
    :obj:`seeds` random nodes of each community get their community as a
    one-hot feature, the others zeros; the rest of the nodes are split at
    random into training, validation and test nodes by the shares
    :obj:`split` (training, validation; test the remainder).

    With :obj:`features` :math:`D > 0`, every node also gets :math:`D`
    noisy features of its community: :math:`\mu_{y_i} + \sigma
    \varepsilon_i`, each community's centre :math:`\mu_c` and each node's
    :math:`\varepsilon_i` standard normal in :math:`\mathbb{R}^D`,
    :math:`\sigma` = :obj:`noise`. A node's own features then tell its
    community only weakly where :math:`\sigma` is large; nodes of one
    community, linked or not, share a centre, which a global attention can
    find (and the seeds and splits are those without them).

    Shapes:
        **output:** :obj:`x` :math:`(n, C + 1 + D)` (column :math:`C` marks
        the seeds), :obj:`train_mask`, :obj:`val_mask`, :obj:`test_mask`
        :math:`(n)`, none of them on a seed.
    """
    y = graph.y
    n, classes = y.numel(), int(y.max()) + 1
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive int, got {seeds!r}")
    sizes = torch.bincount(y, minlength=classes)
    if int(sizes.min()) <= seeds:
        raise ValueError(f"seeds must be fewer than the smallest community's "
                         f"{int(sizes.min())} nodes, got {seeds}")
    if not isinstance(features, int) or isinstance(features, bool) or features < 0:
        raise ValueError(f"features must be an int >= 0, got {features!r}")
    if not noise > 0:
        raise ValueError(f"noise must be > 0, got {noise!r}")
    train, val = split
    if not (train > 0 and val >= 0 and train + val < 1):
        raise ValueError(f"split must be (train, val) shares > 0 and >= 0 summing "
                         f"below 1, got {split}")
    # The seeds: the `seeds` nodes of each community first in a random order.
    key = torch.rand(n, generator=generator, dtype=torch.float64)
    order = torch.argsort(y.double() * 2 + key)  # by community, random within
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n) - (sizes.cumsum(0) - sizes)[y[order]]
    seed = rank < seeds
    x = torch.zeros(n, classes + 1)
    x[seed, y[seed]] = 1.0
    x[seed, classes] = 1.0
    rest = (~seed).nonzero().flatten()
    rest = rest[torch.randperm(rest.numel(), generator=generator)]
    cut = (round(train * rest.numel()), round((train + val) * rest.numel()))
    masks = []
    for part in (rest[:cut[0]], rest[cut[0]:cut[1]], rest[cut[1]:]):
        masks.append(torch.zeros(n, dtype=torch.bool).index_fill_(0, part, True))
    if features:  # drawn last: the seeds and splits stay those without them
        centre = torch.randn(classes, features, generator=generator)
        x = torch.cat([x, centre[y] + noise * torch.randn(n, features, generator=generator)], 1)
    return Data(x=x, edge_index=graph.edge_index, y=y, train_mask=masks[0],
                val_mask=masks[1], test_mask=masks[2], seed_mask=seed, num_nodes=n)
