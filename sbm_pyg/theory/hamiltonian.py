r"""Hamiltonian paths and cycles of attention graphs: exact (Held-Karp) and
heuristic search, and counting."""
from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple, Union

import networkx as nx
import numpy as np

PathResult = Union[List[int], None, str]
EXACT_MAX_NODES = 24  # Held-Karp holds 2^n int64 words: 128 MiB at 24


# Hamiltonian paths


def _adjacency(G: nx.DiGraph) -> Tuple[np.ndarray, list]:
    nodes = list(G.nodes)
    index = {v: t for t, v in enumerate(nodes)}
    adj = np.zeros((len(nodes), len(nodes)), dtype=bool)
    for u, v in G.edges:
        if u != v:
            adj[index[u], index[v]] = True  # u -> v
    return adj, nodes


def _popcount(x: np.ndarray) -> np.ndarray:
    count = np.zeros_like(x)
    while np.any(x):
        count += x & 1
        x = x >> 1
    return count


def _held_karp(adj: np.ndarray, start: Optional[int] = None) -> np.ndarray:
    """reach[mask] = bitset of end nodes v of a path visiting exactly `mask`
    (starting at `start` if given), following edges u -> v; vectorized over
    all masks of one size at a time."""
    n = adj.shape[0]
    pred = np.array([int(sum(1 << u for u in np.nonzero(adj[:, v])[0]))
                     for v in range(n)], dtype=np.int64)
    reach = np.zeros(1 << n, dtype=np.int64)
    for v in ([start] if start is not None else range(n)):
        reach[1 << v] = 1 << v
    masks = np.arange(1 << n, dtype=np.int64)
    size = _popcount(masks)
    for k in range(1, n):
        ms = masks[(size == k) & (reach != 0)]
        for v in range(n):
            bit = np.int64(1 << v)
            sel = ((ms & bit) == 0) & ((reach[ms] & pred[v]) != 0)
            targets = ms[sel] | bit
            reach[targets] |= bit
    return reach, pred


def _reconstruct(reach: np.ndarray, pred: np.ndarray, mask: int, end: int) -> List[int]:
    path = [end]
    while mask & (mask - 1):
        prev = mask ^ (1 << end)
        candidates = int(reach[prev] & pred[end])
        end = (candidates & -candidates).bit_length() - 1
        path.append(end)
        mask = prev
    return path[::-1]


def _exact_path(adj: np.ndarray) -> Optional[List[int]]:
    n = adj.shape[0]
    reach, pred = _held_karp(adj)
    ends = int(reach[(1 << n) - 1])
    if not ends:
        return None
    return _reconstruct(reach, pred, (1 << n) - 1, (ends & -ends).bit_length() - 1)


def _no_path_certificate(G: nx.DiGraph) -> bool:
    """Sound "no": the condensation (DAG of strongly connected components)
    of a graph with a Hamiltonian path is itself a path."""
    C = nx.condensation(G)
    order = list(nx.topological_sort(C))
    return any(not C.has_edge(a, b) for a, b in zip(order, order[1:]))


def _heuristic_path(adj: np.ndarray, budget: float) -> Optional[List[int]]:
    """Depth-first search with Warnsdorff's ordering (fewest unvisited
    successors first) and backtracking, until ``budget`` seconds."""
    n = adj.shape[0]
    succ = [np.nonzero(adj[u])[0].tolist() for u in range(n)]
    indeg = adj.sum(0)
    deadline = time.perf_counter() + budget
    starts = sorted(range(n), key=lambda v: indeg[v])
    for start in starts:
        visited = [False] * n
        visited[start] = True
        path = [start]
        stack = [iter(sorted(succ[start], key=lambda w: len(succ[w])))]
        while stack:
            if time.perf_counter() > deadline:
                return None
            nxt = next((w for w in stack[-1] if not visited[w]), None)
            if nxt is None:
                stack.pop()
                visited[path.pop()] = False
                continue
            visited[nxt] = True
            path.append(nxt)
            if len(path) == n:
                return path
            stack.append(iter(sorted(
                (w for w in succ[nxt] if not visited[w]),
                key=lambda w: sum(not visited[x] for x in succ[w]))))
    return None


def hamiltonian_path(G: nx.DiGraph, method: str = "auto",
                     time_budget: float = 2.0) -> PathResult:
    r"""A directed Hamiltonian path of :obj:`G` (self-loops ignored).

    Returns the path as a node list, :obj:`None` if there is none, or
    ``"unknown"`` if the heuristic ran out of time: it never answers "no"
    without a proof.

    Args:
        G (networkx.DiGraph): the graph.
        method (str): ``"exact"`` (Held–Karp dynamic programming over
            :math:`2^n` subsets, bitsets vectorized with numpy; up to
            :obj:`EXACT_MAX_NODES` nodes), ``"heuristic"`` (depth-first
            search with Warnsdorff's ordering under :obj:`time_budget`), or
            ``"auto"`` (exact up to 20 nodes). Both first apply a sound
            necessary condition: the condensation of :obj:`G` must be a path.
        time_budget (float): seconds for the heuristic.

    Example:
        >>> hamiltonian_path(nx.DiGraph([(0, 2), (2, 1)]))
        [0, 2, 1]
    """
    if method not in ("auto", "exact", "heuristic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'heuristic', got {method!r}")
    n = G.number_of_nodes()
    if n == 0:
        return []
    if _no_path_certificate(G):
        return None
    adj, nodes = _adjacency(G)
    if method == "exact" or (method == "auto" and n <= 20):
        if n > EXACT_MAX_NODES:
            raise ValueError(f"method='exact' handles up to {EXACT_MAX_NODES} "
                             f"nodes, got {n}")
        path = _exact_path(adj)
        return None if path is None else [nodes[t] for t in path]
    path = _heuristic_path(adj, time_budget)
    return "unknown" if path is None else [nodes[t] for t in path]


def is_hamiltonian_path(G: nx.DiGraph, path: Sequence) -> bool:
    """Certificate check: every node exactly once, consecutive nodes joined
    by an edge of G in path order."""
    return (len(path) == G.number_of_nodes() and set(path) == set(G.nodes)
            and all(G.has_edge(u, v) for u, v in zip(path, path[1:])))


def has_hamiltonian_cycle(adj: np.ndarray) -> bool:
    r"""Whether the directed graph of the boolean adjacency matrix
    :obj:`adj [n, n]` (:obj:`adj[i, j]`: edge :math:`i \to j`) has a
    Hamiltonian cycle (Held-Karp from node 0, :math:`O(2^n n^2)`)."""
    n = adj.shape[0]
    reach, pred = _held_karp(adj, start=0)
    return bool(int(reach[(1 << n) - 1]) & int(pred[0]))


def count_hamiltonian_cycles(adj: np.ndarray) -> int:
    r"""Number of directed Hamiltonian cycles of :obj:`adj` (``adj[u, v]``:
    edge :math:`u \to v`), each counted once: counting DP over subsets with
    the start fixed at node 0; :math:`O(2^n n^2)`."""
    adj = np.asarray(adj, dtype=bool)
    n = adj.shape[0]
    if n < 2:
        return 0
    if n > 20:
        raise ValueError(f"counting handles up to 20 nodes, got {n}")
    count = np.zeros((1 << n, n), dtype=np.int64)
    count[1, 0] = 1
    edges = adj.astype(np.int64)
    np.fill_diagonal(edges, 0)
    for mask in range(1, 1 << n, 2):  # masks containing node 0
        row = count[mask]
        if not row.any():
            continue
        nxt = row @ edges  # paths extended by one edge, per end node
        for v in np.nonzero(nxt)[0]:
            if not mask >> v & 1:
                count[mask | 1 << v, v] += nxt[v]
    return int(count[(1 << n) - 1] @ edges[:, 0])
