r"""The universal-approximation conditions of SBM-Transformer (the paper's
Appendix A, after Yun et al., 2020), checked on attention patterns.

An attention pattern :math:`\mathcal{A}^l` is a boolean matrix
:obj:`A[i, j]` (query :math:`i` attends key :math:`j`), or the directed graph
:math:`G^l` with an edge :math:`j \to i` for each such pair. For :math:`p`
patterns the conditions are:

1. every node has a self-loop in every :math:`G^l`;
2. the union :math:`G^*` of the patterns has a Hamiltonian path;
3. for a finite :math:`s`, the sets :math:`S_i^1 = \mathcal{A}_i^1`,
   :math:`S_i^t = \bigcup_{j \in \mathcal{A}_i^{((t-1) \bmod p) + 1}}
   S_j^{t-1}` equal all :math:`n` nodes for every :math:`i`.

Lemma 1 of the paper: a directed Erdős–Rényi :math:`G(n, p)` with
:math:`p^* = (e/n)\, n^{1/n}` has :math:`\mathbb{E}[\#\text{Hamiltonian
cycles}] = p^n (n-1)! \geq 1`. That is a statement about an *expectation*;
it does not say that such a graph has a Hamiltonian cycle with high
probability, and it does not: with expected degree about :math:`e`, a node has
no incoming edge with probability :math:`(1-p^*)^{n-1} \approx e^{-e}
\approx 6.6\%`, and one such node already rules a cycle out.
:func:`hamiltonian_cycle_probability` measures this.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable, List, Optional, Sequence, Tuple, Union

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from sbm_pyg.sampling import SampledGraph, _from_keys

__all__ = [
    "to_networkx", "from_networkx", "pattern_masks", "GraphRecorder",
    "hamiltonian_path", "is_hamiltonian_path", "count_hamiltonian_cycles",
    "check_self_loops", "check_reachability", "check_conditions",
    "ConditionReport", "proof_patterns", "proof_sbm", "proof_hamiltonian_path",
    "lemma1_probability", "expected_hamiltonian_cycles",
    "hamiltonian_cycle_probability", "model_conditions", "condition_frequencies",
]

Pattern = Union[Tensor, np.ndarray, nx.DiGraph]
PathResult = Union[List[int], None, str]
EXACT_MAX_NODES = 24  # Held-Karp holds 2^n int64 words: 128 MiB at 24


# --------------------------------------------------------------------------
# Conversions


def _sequence_rows(graph: SampledGraph, sequence: int) -> Tuple[int, int]:
    if not 0 <= sequence < graph.num_graphs:
        raise ValueError(f"sequence must be in [0, {graph.num_graphs}), got {sequence}")
    q0, q1 = graph.ptr_q[sequence:sequence + 2].tolist()
    k0, k1 = graph.ptr_k[sequence:sequence + 2].tolist()
    if q1 - q0 != k1 - k0:
        raise ValueError(f"sequence {sequence} has {q1 - q0} queries but "
                         f"{k1 - k0} keys: the conditions are about "
                         f"self-attention patterns")
    return q0, k0


def pattern_masks(graph: SampledGraph, sequence: int = 0) -> Tensor:
    r"""The attention patterns of one sequence, :obj:`[H, n, n]` bool with
    :obj:`A[h, i, j]` = query :math:`i` attends key :math:`j` in head
    :math:`h`."""
    q0, k0 = _sequence_rows(graph, sequence)
    n = int(graph.ptr_q[sequence + 1]) - q0
    j, i = graph.edge_index
    keep = (i >= q0) & (i < q0 + n)
    masks = torch.zeros(graph.num_heads, n, n, dtype=torch.bool)
    masks[graph.head[keep].cpu(), (i[keep] - q0).cpu(), (j[keep] - k0).cpu()] = True
    return masks


def to_networkx(graph: SampledGraph, head: int = 0, sequence: int = 0) -> nx.DiGraph:
    r"""One head and sequence as a :class:`networkx.DiGraph` on nodes
    :math:`0..n-1` with an edge :math:`j \to i` when query :math:`i` attends
    key :math:`j`."""
    if not 0 <= head < graph.num_heads:
        raise ValueError(f"head must be in [0, {graph.num_heads}), got {head}")
    return _digraph(pattern_masks(graph, sequence)[head])


def from_networkx(G: nx.DiGraph) -> SampledGraph:
    r"""A :class:`networkx.DiGraph` on nodes :math:`0..n-1` as a one-head,
    one-sequence :class:`SampledGraph` (edge :math:`j \to i`: query :math:`i`
    attends key :math:`j`)."""
    n = G.number_of_nodes()
    if set(G.nodes) != set(range(n)):
        raise ValueError("G's nodes must be 0..n-1")
    edges = torch.tensor(list(G.edges), dtype=torch.long).view(-1, 2)
    key = torch.unique(edges[:, 1] * n + edges[:, 0])  # (query, key) order
    ptr = torch.tensor([0, n])
    return _from_keys(key, 1, n, n, ptr, ptr, key.numel(), float(key.numel()))


def _mask(pattern: Pattern) -> np.ndarray:
    """[n, n] bool numpy, A[i, j] = i attends j."""
    if isinstance(pattern, nx.DiGraph):
        n = pattern.number_of_nodes()
        if set(pattern.nodes) != set(range(n)):
            raise ValueError("graph nodes must be 0..n-1")
        A = np.zeros((n, n), dtype=bool)
        for j, i in pattern.edges:
            A[i, j] = True
        return A
    A = pattern.cpu().numpy() if isinstance(pattern, Tensor) else np.asarray(pattern)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"a pattern must be a square [n, n] mask, got shape {A.shape}")
    return A.astype(bool)


def _digraph(A) -> nx.DiGraph:
    A = _mask(A)
    G = nx.DiGraph()
    G.add_nodes_from(range(A.shape[0]))
    i, j = np.nonzero(A)
    G.add_edges_from(zip(j.tolist(), i.tolist()))
    return G


class GraphRecorder:
    r"""Records every sampled graph of every :class:`~sbm_pyg.nn.SBMConv` in
    a model during forward passes.

    .. code-block:: python

        with GraphRecorder(model) as recorder:
            model(tokens, mask)
        recorder.graphs   # [(layer_index, SampledGraph), ...] in call order

    Layers are numbered by their order in :meth:`model.modules`.
    """

    def __init__(self, model: torch.nn.Module):
        from sbm_pyg.nn import SBMConv
        self.convs = [m for m in model.modules() if isinstance(m, SBMConv)]
        if not self.convs:
            raise ValueError("model has no SBMConv layer to record")
        self.graphs: List[Tuple[int, SampledGraph]] = []
        self._handles = []

    def __enter__(self) -> "GraphRecorder":
        for index, conv in enumerate(self.convs):
            self._handles.append(conv.register_graph_hook(
                lambda module, graph, index=index: self.graphs.append((index, graph))))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


# --------------------------------------------------------------------------
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


# --------------------------------------------------------------------------
# The conditions


def check_self_loops(patterns: Sequence[Pattern]) -> List[Tuple[int, int]]:
    """Condition 1: the (pattern, node) pairs without a self-loop; empty if
    the condition holds."""
    missing = []
    for layer, pattern in enumerate(patterns):
        for node in np.nonzero(~np.diag(_mask(pattern)))[0].tolist():
            missing.append((layer, node))
    return missing


def check_reachability(patterns: Sequence[Pattern],
                       s_max: Optional[int] = None) -> Tuple[Optional[int], List[int]]:
    r"""Condition 3, exactly as defined: :math:`S^1 = \mathcal{A}^1`,
    :math:`S^t_i = \bigcup_{j \in \mathcal{A}_i^{((t-1) \bmod p) + 1}}
    S^{t-1}_j`, computed as boolean products :math:`S^t = A^{l(t)} S^{t-1}`.

    Returns:
        :obj:`(s, [])` with the smallest :math:`s \leq` :obj:`s_max` at which
        every :math:`S_i^s` is all :math:`n` nodes, or :obj:`(None, nodes)`
        with the nodes :math:`i` whose :math:`S_i^{s_{max}}` is still short.
        :obj:`s_max` defaults to :math:`p (n + 1)`.
    """
    masks = [torch.from_numpy(_mask(p)) for p in patterns]
    if not masks:
        raise ValueError("need at least one pattern")
    n = masks[0].shape[0]
    if any(m.shape != (n, n) for m in masks):
        raise ValueError("all patterns must have the same size")
    p = len(masks)
    s_max = p * (n + 1) if s_max is None else s_max
    sparse = [m.float().to_sparse() for m in masks]
    S = masks[0].float()
    for s in range(1, s_max + 1):
        if s > 1:
            S = (torch.sparse.mm(sparse[(s - 1) % p], S) > 0).float()
        if bool((S > 0).all()):
            return s, []
    return None, torch.nonzero(~(S > 0).all(1)).view(-1).tolist()


@dataclass
class ConditionReport:
    r"""Verdicts and witnesses of the three conditions (:func:`check_conditions`).

    Attributes:
        missing_self_loops: (pattern, node) pairs without a self-loop.
        hamiltonian_path: a path of the union (a witness), :obj:`None` (none
            exists) or ``"unknown"``.
        reachability_s: the :math:`s` of condition 3, or :obj:`None`.
        unreached: nodes whose :math:`S_i^{s_{max}}` is short (if no s).
        strongly_connected: whether the union is strongly connected
            (necessary for condition 3).
    """

    num_nodes: int
    num_patterns: int
    missing_self_loops: List[Tuple[int, int]] = field(default_factory=list)
    hamiltonian_path: PathResult = None
    reachability_s: Optional[int] = None
    unreached: List[int] = field(default_factory=list)
    strongly_connected: bool = False

    @property
    def self_loops(self) -> bool:
        """Condition 1: every node has a self-loop in every pattern."""
        return not self.missing_self_loops

    @property
    def has_hamiltonian_path(self) -> Optional[bool]:
        """Condition 2; :obj:`None` when the search ran out of time."""
        if self.hamiltonian_path == "unknown":
            return None
        return self.hamiltonian_path is not None

    @property
    def all_hold(self) -> bool:
        """Conditions 1-3 all hold (an unknown path counts as not held)."""
        return (self.self_loops and self.has_hamiltonian_path is True
                and self.reachability_s is not None)


def check_conditions(patterns: Sequence[Pattern], s_max: Optional[int] = None,
                     method: str = "auto", time_budget: float = 2.0) -> ConditionReport:
    """Checks conditions 1-3 on the patterns (masks or DiGraphs)."""
    masks = [_mask(p) for p in patterns]
    if not masks:
        raise ValueError("need at least one pattern")
    union = _digraph(np.logical_or.reduce(masks))
    s, unreached = check_reachability(masks, s_max)
    return ConditionReport(
        num_nodes=masks[0].shape[0], num_patterns=len(masks),
        missing_self_loops=check_self_loops(masks),
        hamiltonian_path=hamiltonian_path(union, method, time_budget),
        reachability_s=s, unreached=unreached,
        strongly_connected=nx.is_strongly_connected(union) if len(union) else False)


# --------------------------------------------------------------------------
# The proof's patterns


def _check_nk(n: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(k, int) and 1 <= k < n):
        raise ValueError(f"need integers 1 <= k < n, got n={n}, k={k}")


def proof_patterns(n: int, k: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The three patterns of the proof of Lemma 2, with self-loops, as
    :obj:`[n, n]` bool masks (0-indexed; the relays are the last :math:`k`
    tokens):

    * :math:`\mathcal{A}^1_i = \{i\} \cup \{j : \lfloor ik/n \rfloor =
      \lfloor jk/n \rfloor\}` (:math:`k` blocks),
    * :math:`\mathcal{A}^2_i = \{i\} \cup \{n-k, \dots, n-1\}` (everyone
      attends the relays),
    * :math:`\mathcal{A}^3_i = \{i\}` for :math:`i < n - k`, all tokens for
      the relays.

    Condition 3 as defined cycles through the patterns in order. In this
    order the relays gather every token at :math:`t = 3` (:math:`\mathcal{A}^3`)
    but pass it on only when :math:`\mathcal{A}^2` comes round again, so
    :math:`s = 5` (4 when :math:`k = 2`); the order :math:`(\mathcal{A}^1,
    \mathcal{A}^3, \mathcal{A}^2)` gives the paper's :math:`s = 3`.
    """
    _check_nk(n, k)
    idx = torch.arange(n)
    cluster = idx * k // n
    eye = idx[:, None] == idx[None, :]
    relay = idx >= n - k
    A1 = (cluster[:, None] == cluster[None, :]) | eye
    A2 = relay[None, :].expand(n, n) | eye
    A3 = relay[:, None].expand(n, n) | eye
    return A1, A2, A3


def proof_sbm(n: int, k: int) -> List[Tuple[Tensor, Tensor, Tensor]]:
    r"""SBM parameters :obj:`(q_memb [n, 1, c], block [1, c, c], k_memb [n,
    1, c])` whose edge probabilities are 0/1 and equal the proof's patterns
    without their diagonal; with ``self_loops=True`` and ``mode="exact"``,
    :func:`~sbm_pyg.sampling.fastrg` samples exactly
    :func:`proof_patterns`."""
    _check_nk(n, k)
    idx = torch.arange(n)
    one_hot = torch.nn.functional.one_hot(idx * k // n, k).double()[:, None, :]
    relay = (idx >= n - k).double().view(n, 1, 1)
    ones = torch.ones(n, 1, 1, dtype=torch.float64)
    unit = torch.ones(1, 1, 1, dtype=torch.float64)
    return [(one_hot, torch.eye(k, dtype=torch.float64)[None], one_hot),
            (ones, unit, relay),   # every query attends the relays
            (relay, unit, ones)]   # relays attend every key


def proof_hamiltonian_path(n: int, k: int) -> List[int]:
    r"""The proof's Hamiltonian path through the union of the three
    patterns: the non-relay tokens in order, block by block (:math:`\mathcal{
    A}^1` joins a block), hopping from one block to the next through an
    unused relay (token → relay by :math:`\mathcal{A}^3`, relay → token by
    :math:`\mathcal{A}^2`), then the remaining relays (relay → relay by
    :math:`\mathcal{A}^3`)."""
    _check_nk(n, k)
    relays = list(range(n - k, n))
    path, used, previous = [], 0, None
    for token in range(n - k):
        block = token * k // n
        if previous is not None and block != previous:
            path.append(relays[used])
            used += 1
        path.append(token)
        previous = block
    return path + relays[used:]


# --------------------------------------------------------------------------
# Lemma 1


def lemma1_probability(n: int) -> float:
    r""":math:`p^*(n) = (e / n)\, n^{1/n}`, the edge probability of Lemma 1.

    It exceeds 1 for :math:`n \leq 3` (:math:`p^*(2) = 1.92`), where it is no
    probability; from :math:`n = 4` on it is below 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.e / n * n ** (1.0 / n)


def expected_hamiltonian_cycles(n: int, p: float) -> float:
    r""":math:`\mathbb{E}[\#\text{Hamiltonian cycles of } G(n, p)] = p^n
    (n-1)!` (directed, no self-loops)."""
    if n < 2 or not 0 <= p <= 1:
        raise ValueError(f"need n >= 2 and p in [0, 1], got n={n}, p={p}")
    if p == 0:
        return 0.0
    return math.exp(n * math.log(p) + math.lgamma(n))


def _wilson(successes: int, trials: int, confidence: float = 0.95) -> Tuple[float, float]:
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials ** 2)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def hamiltonian_cycle_probability(n: int, p: Optional[float] = None,
                                  trials: int = 200, seed: int = 0) -> dict:
    r"""Monte Carlo over directed :math:`G(n, p)` (default :math:`p^*(n)`),
    with the exact dynamic program for each sample (:math:`n \leq 16`).

    Returns a dict with ``p``, ``expected_cycles`` (:math:`p^n (n-1)!`),
    ``mean_cycles`` (sample mean of the cycle count, for :math:`n \leq 12`),
    ``probability`` (fraction with a Hamiltonian cycle) and its 95% Wilson
    interval ``ci``, and ``zero_indegree`` (mean fraction of nodes without an
    incoming edge).
    """
    if not 2 <= n <= 16:
        raise ValueError(f"n must be in [2, 16], got {n}")
    p = lemma1_probability(n) if p is None else p
    gen = torch.Generator().manual_seed(seed)
    hits, zero_in, counts = 0, 0.0, []
    for _ in range(trials):
        adj = (torch.rand(n, n, generator=gen) < p).numpy()
        np.fill_diagonal(adj, False)
        zero_in += float((~adj.any(0)).mean())
        if n <= 12:
            c = count_hamiltonian_cycles(adj)
            counts.append(c)
            hits += c > 0
        else:
            reach, pred = _held_karp(adj, start=0)
            hits += bool(int(reach[(1 << n) - 1]) & int(pred[0]))
    return dict(n=n, p=p, trials=trials,
                expected_cycles=expected_hamiltonian_cycles(n, p),
                mean_cycles=float(np.mean(counts)) if counts else None,
                probability=hits / trials, ci=_wilson(hits, trials),
                zero_indegree=zero_in / trials)


# --------------------------------------------------------------------------
# Trained models


def model_conditions(model: torch.nn.Module, forward: Callable[[], object],
                     num_sequences: int, **kwargs) -> List[ConditionReport]:
    r"""Runs :obj:`forward()` (a call of :obj:`model`) under a
    :class:`GraphRecorder` and checks the conditions for each input sequence
    on the patterns of all its layers and heads together (:math:`p = L
    \cdot H` patterns, layer-major).

    Args:
        model (torch.nn.Module): a model with :class:`~sbm_pyg.nn.SBMConv`
            layers.
        forward (callable): runs one forward pass of :obj:`model`.
        num_sequences (int): sequences in that batch.
        **kwargs: passed to :func:`check_conditions`.

    Returns:
        One :class:`ConditionReport` per sequence.
    """
    with GraphRecorder(model) as recorder:
        forward()
    reports = []
    for g in range(num_sequences):
        patterns = [mask for _, graph in recorder.graphs
                    for mask in pattern_masks(graph, g)]
        reports.append(check_conditions(patterns, **kwargs))
    return reports


def condition_frequencies(reports: Sequence[ConditionReport]) -> dict:
    """How often each condition holds across inputs (fractions of
    :obj:`reports`; a Hamiltonian path counts as held only when found)."""
    if not reports:
        raise ValueError("need at least one report")
    n = len(reports)
    return dict(
        inputs=n,
        self_loops=sum(r.self_loops for r in reports) / n,
        hamiltonian_path=sum(r.has_hamiltonian_path is True for r in reports) / n,
        hamiltonian_unknown=sum(r.has_hamiltonian_path is None for r in reports) / n,
        reachability=sum(r.reachability_s is not None for r in reports) / n,
        strongly_connected=sum(r.strongly_connected for r in reports) / n,
        all_hold=sum(r.all_hold for r in reports) / n)
