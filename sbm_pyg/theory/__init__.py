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
from sbm_pyg.nn.recorder import GraphRecorder
from sbm_pyg.theory.block_cap import block_masses, within_block_cap
from sbm_pyg.theory.conditions import (
    ConditionReport,
    check_conditions,
    check_reachability,
    check_self_loops,
    condition_frequencies,
    model_conditions,
)
from sbm_pyg.theory.convert import (
    as_digraph,
    as_mask,
    from_networkx,
    pattern_masks,
    to_networkx,
)
from sbm_pyg.theory.hamiltonian import (
    count_hamiltonian_cycles,
    hamiltonian_path,
    has_hamiltonian_cycle,
    is_hamiltonian_path,
)
from sbm_pyg.theory.lemma1 import (
    expected_hamiltonian_cycles,
    hamiltonian_cycle_probability,
    lemma1_probability,
)
from sbm_pyg.theory.proof import proof_hamiltonian_path, proof_patterns, proof_sbm

__all__ = [
    "to_networkx", "from_networkx", "pattern_masks", "as_mask", "as_digraph",
    "GraphRecorder", "hamiltonian_path", "is_hamiltonian_path",
    "has_hamiltonian_cycle", "count_hamiltonian_cycles", "check_self_loops",
    "check_reachability", "check_conditions", "ConditionReport",
    "proof_patterns", "proof_sbm", "proof_hamiltonian_path",
    "lemma1_probability", "expected_hamiltonian_cycles",
    "hamiltonian_cycle_probability", "model_conditions", "condition_frequencies",
    "within_block_cap", "block_masses",
]
