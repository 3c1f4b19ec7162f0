r"""LFR benchmark graphs (`Lancichinetti, Fortunato and Radicchi, 2008
<https://arxiv.org/abs/0805.4770>`_) generated in tensors, at sizes where
:func:`networkx.LFR_benchmark_graph` (the reference, a Python loop per
edge) is too slow: power-law degrees (exponent :math:`\tau_1`) and
community sizes (:math:`\tau_2`), each node sharing a fraction
:math:`1 - \mu` of its links with its own community.

The law is LFR's: a degree sequence and a community-size sequence from
truncated discrete power laws, every node placed in a community larger
than its internal degree :math:`\mathrm{round}((1 - \mu) k)`, then the
internal stubs of each community and the external stubs of all paired at
random (a configuration model). Pairs that would make a self-loop, a
repeated edge or (for external stubs) a link inside one community are
drawn again from the stubs left over, for a few rounds; the stubs still
left are dropped, so the realised degrees and mixing fall slightly short
of the targets (:func:`lfr_statistics` measures both).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

__all__ = ["powerlaw_sequence", "lfr_graph", "lfr_statistics"]

# Re-pairing rounds for the stubs whose pair was refused.
_ROUNDS = 20


def _pmf(tau: float, low: int, high: int) -> Tensor:
    k = torch.arange(low, high + 1, dtype=torch.float64)
    w = k.pow(-tau)
    return w / w.sum()


def powerlaw_sequence(size: int, tau: float, low: int, high: int,
                      generator: Optional[torch.Generator] = None) -> Tensor:
    r""":obj:`size` integers from the discrete power law
    :math:`P(k) \propto k^{-\tau}` on :math:`[\mathrm{low}, \mathrm{high}]`
    (the Zipf law cut at :obj:`high`, as networkx's generator draws it).

    Example:
        >>> k = powerlaw_sequence(1000, 2.5, 1, 10, torch.Generator().manual_seed(0))
        >>> int(k.min()), int(k.max()) <= 10, bool((k == 1).sum() > (k == 2).sum())
        (1, True, True)
    """
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high, got low={low}, high={high}")
    cdf = _pmf(tau, low, high).cumsum(0)
    u = torch.rand(size, generator=generator, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[-1]).clamp_(max=high - low) + low


def _min_degree(tau: float, average: float, high: int) -> int:
    # The least degree whose truncated law has the mean nearest `average`
    # (the mean grows with the least degree: a bisection).
    def mean(low: int) -> float:
        p = _pmf(tau, low, high)
        return float((p * torch.arange(low, high + 1, dtype=torch.float64)).sum())
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi) // 2
        if mean(mid) < average:
            lo = mid + 1
        else:
            hi = mid
    return min((lo, max(lo - 1, 1)), key=lambda k: abs(mean(k) - average))


def _community_sizes(n: int, tau2: float, low: int, high: int,
                     generator: Optional[torch.Generator]) -> Tensor:
    # Sizes drawn until they cover n; the last is cut to what is left, and
    # a remainder below `low` joins a random community that can take it.
    sizes = powerlaw_sequence(n // low + 1, tau2, low, high, generator)
    count = int((sizes.cumsum(0) < n).sum()) + 1
    sizes = sizes[:count].clone()
    sizes[-1] -= int(sizes.sum()) - n
    if sizes[-1] < low and count > 1:
        rest, sizes = int(sizes[-1]), sizes[:-1]
        room = (sizes + rest <= high).nonzero().flatten()
        pick = room[torch.randint(room.numel(), (1,), generator=generator)] \
            if room.numel() else sizes.argmin().view(1)
        sizes[pick] += rest
    return sizes


def _assign(internal: Tensor, sizes: Tensor,
            generator: Optional[torch.Generator]) -> Tensor:
    # Each node into a community larger than its internal degree, uniformly
    # among the free places its degree allows: the most constrained nodes
    # (largest internal degree) choose first, one degree value at a time.
    n = internal.numel()
    order = sizes.argsort()
    slot_community = order.repeat_interleave(sizes[order])  # slots by size
    slot_size = sizes[slot_community]
    free = torch.ones(n, dtype=torch.bool)
    community = torch.empty(n, dtype=torch.long)
    levels = internal.unique().flip(0)
    for level in levels[levels >= sizes.min()].tolist():
        nodes = (internal == level).nonzero().flatten()
        allowed = (free & (slot_size > level)).nonzero().flatten()
        if allowed.numel() < nodes.numel():
            raise ValueError(
                f"no community can hold the nodes of internal degree {level}: "
                f"raise max_community or lower max_degree or mu")
        chosen = allowed[torch.randperm(allowed.numel(), generator=generator)
                         [:nodes.numel()]]
        community[nodes], free[chosen] = slot_community[chosen], False
    rest = (internal < sizes.min()).nonzero().flatten()
    slots = free.nonzero().flatten()
    community[rest] = slot_community[slots[torch.randperm(slots.numel(),
                                                          generator=generator)]]
    return community


def _pair(stubs: Tensor, group: Tensor, community: Tensor, internal: bool,
          n: int, generator: Optional[torch.Generator]) -> Tensor:
    # Random pairs of the stubs (nodes, one entry per stub) within each
    # group (a community, or one group for all), refused pairs re-drawn
    # from the leftovers; returns the accepted edges' keys u * n + v, u < v.
    keys = torch.empty(0, dtype=torch.long)
    for _ in range(_ROUNDS):
        if stubs.numel() < 2:
            break
        shuffle = torch.randperm(stubs.numel(), generator=generator)
        stubs, group = stubs[shuffle], group[shuffle]
        by_group = group.argsort(stable=True)
        stubs, group = stubs[by_group], group[by_group]
        # Consecutive stubs of one group pair up; an odd one out waits.
        start = torch.ones_like(group, dtype=torch.bool)
        start[1:] = group[1:] != group[:-1]
        rank = torch.arange(group.numel()) - torch.cummax(
            torch.where(start, torch.arange(group.numel()), 0), 0).values
        first = (rank % 2 == 0) & torch.cat([group[1:] == group[:-1],
                                              torch.tensor([False])])
        a = first.nonzero().flatten()
        u, v = stubs[a], stubs[a + 1]
        lo, hi = torch.minimum(u, v), torch.maximum(u, v)
        key = lo * n + hi
        ok = lo != hi
        if not internal:
            ok &= community[lo] != community[hi]
        # The first of repeated new keys, and none already taken.
        uniq, inverse = key.unique(return_inverse=True)
        firsts = torch.full((uniq.numel(),), key.numel()).scatter_reduce(
            0, inverse, torch.arange(key.numel()), "amin")
        ok &= torch.zeros_like(ok).index_fill_(0, firsts, True)
        if keys.numel():
            at = torch.searchsorted(keys, key).clamp_(max=keys.numel() - 1)
            ok &= keys[at] != key
        keys = torch.cat([keys, key[ok]]).sort().values
        paired = torch.zeros_like(group, dtype=torch.bool)
        paired[a[ok]], paired[a[ok] + 1] = True, True
        stubs, group = stubs[~paired], group[~paired]
    return keys


def lfr_graph(n: int, tau1: float = 3.0, tau2: float = 1.5, mu: float = 0.1,
              average_degree: float = 20.0, max_degree: Optional[int] = None,
              min_community: Optional[int] = None, max_community: Optional[int] = None,
              generator: Optional[torch.Generator] = None) -> Data:
    r"""An LFR benchmark graph of :obj:`n` nodes, undirected, its
    communities as :obj:`y`.

    Args:
        n (int): nodes.
        tau1 (float): the degrees' power-law exponent (> 1).
        tau2 (float): the community sizes' exponent (> 1).
        mu (float): the mixing: the share of each node's links that leave
            its community, in :math:`[0, 1]`.
        average_degree (float): the degrees' target mean (the least degree
            is chosen for it).
        max_degree (int, optional): the largest degree (default
            :math:`\lceil n / 10 \rceil`).
        min_community (int, optional): the smallest community (default:
            the least degree).
        max_community (int, optional): the largest (default: the largest
            degree, as networkx's).
        generator (torch.Generator, optional): the random draws' source.

    Shapes:
        **output:** :obj:`edge_index` :math:`(2, |\mathcal{E}|)` (both
        directions), :obj:`y` :math:`(n)` community ids (largest first),
        :obj:`degree` :math:`(n)` the target degrees.

    Example:
        >>> g = lfr_graph(1000, mu=0.2, average_degree=10,
        ...               generator=torch.Generator().manual_seed(0))
        >>> g.num_nodes, int(g.y.max()) + 1 > 1
        (1000, True)
    """
    _check(n, tau1, tau2, mu, average_degree)
    high = max_degree if max_degree is not None else max(-(-n // 10), 2)
    if not 0 < high <= n - 1:
        raise ValueError(f"max_degree must lie in [1, n - 1], got {high}")
    low = _min_degree(tau1, average_degree, high)
    degree = powerlaw_sequence(n, tau1, low, high, generator)
    c_low = low if min_community is None else min_community
    c_high = high if max_community is None else max_community
    if not 2 <= c_low <= c_high <= n:
        raise ValueError(f"need 2 <= min_community <= max_community <= n, got "
                         f"{c_low} and {c_high}")
    sizes = _community_sizes(n, tau2, c_low, c_high, generator)
    internal = torch.round((1 - mu) * degree.double()).long()
    community = _assign(internal, sizes, generator)
    external = degree - internal
    inside = _pair(torch.arange(n).repeat_interleave(internal),
                   community.repeat_interleave(internal), community, True, n, generator)
    across = _pair(torch.arange(n).repeat_interleave(external),
                   torch.zeros(int(external.sum()), dtype=torch.long), community,
                   False, n, generator)
    keys = torch.cat([inside, across])
    edge_index = to_undirected(torch.stack([keys // n, keys % n]), num_nodes=n)
    # Communities numbered largest first.
    rank = torch.empty_like(sizes)
    rank[sizes.argsort(descending=True, stable=True)] = torch.arange(sizes.numel())
    return Data(edge_index=edge_index, y=rank[community], degree=degree, num_nodes=n)


def lfr_statistics(data: Data) -> Dict[str, float]:
    r"""What an LFR graph realised: its mean degree, its mixing (the share
    of edge ends that leave their community), its communities' count and
    smallest and largest size, and the mean of the target degrees."""
    row, col = data.edge_index
    n = data.num_nodes
    sizes = torch.bincount(data.y, minlength=int(data.y.max()) + 1)
    return dict(mean_degree=row.numel() / n,
                mixing=float((data.y[row] != data.y[col]).double().mean()),
                communities=float(sizes.numel()), min_community=float(sizes.min()),
                max_community=float(sizes.max()),
                target_mean_degree=float(data.degree.double().mean()))


def _check(n: int, tau1: float, tau2: float, mu: float, average_degree: float) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 3:
        raise ValueError(f"n must be an int >= 3, got {n!r}")
    if not tau1 > 1 or not tau2 > 1:
        raise ValueError(f"tau1 and tau2 must be > 1, got {tau1} and {tau2}")
    if not 0 <= mu <= 1:
        raise ValueError(f"mu must lie in [0, 1], got {mu}")
    if not 1 <= average_degree < n:
        raise ValueError(f"average_degree must lie in [1, n), got {average_degree}")

