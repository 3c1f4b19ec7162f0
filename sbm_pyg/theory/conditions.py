r"""The universal-approximation conditions, on patterns and on the sampled
graphs of a model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import networkx as nx
import numpy as np
import torch

from sbm_pyg.nn.recorder import GraphRecorder
from sbm_pyg.theory.convert import Pattern, as_digraph, as_mask, pattern_masks
from sbm_pyg.theory.hamiltonian import PathResult, hamiltonian_path

# The conditions


def check_self_loops(patterns: Sequence[Pattern]) -> List[Tuple[int, int]]:
    """Condition 1: the (pattern, node) pairs without a self-loop; empty if
    the condition holds."""
    missing = []
    for layer, pattern in enumerate(patterns):
        for node in np.nonzero(~np.diag(as_mask(pattern)))[0].tolist():
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
    masks = [torch.from_numpy(as_mask(p)) for p in patterns]
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
    r"""Checks conditions 1-3 on the patterns (masks or DiGraphs).

    Example:
        >>> eye = torch.eye(4, dtype=torch.bool)
        >>> ring = eye | eye.roll(1, 1)  # i attends i and i + 1 (mod 4)
        >>> report = check_conditions([ring])
        >>> report.self_loops, report.has_hamiltonian_path, report.all_hold
        (True, True, True)
    """
    masks = [as_mask(p) for p in patterns]
    if not masks:
        raise ValueError("need at least one pattern")
    union = as_digraph(np.logical_or.reduce(masks))
    s, unreached = check_reachability(masks, s_max)
    return ConditionReport(
        num_nodes=masks[0].shape[0], num_patterns=len(masks),
        missing_self_loops=check_self_loops(masks),
        hamiltonian_path=hamiltonian_path(union, method, time_budget),
        reachability_s=s, unreached=unreached,
        strongly_connected=nx.is_strongly_connected(union) if len(union) else False)


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
