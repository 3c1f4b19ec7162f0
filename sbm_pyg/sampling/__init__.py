r"""Sampling bipartite query→key graphs from mixed-membership SBMs.

Each head :math:`h` of each sequence :math:`g` is an SBM with query
memberships :math:`\mathbf{Y} \in \mathbb{R}_+^{n_q \times k}`, block matrix
:math:`\mathbf{B} \in \mathbb{R}_+^{k \times k}` and key memberships
:math:`\mathbf{Z} \in \mathbb{R}_+^{n_k \times k}`, with edge rate

.. math::
    p_{ij} = \mathbf{Y}_i \mathbf{B} \mathbf{Z}_j^{\top}.

:func:`fastrg` samples all sequences and heads of a ragged batch at once, in
time and memory linear in the number of edges; :func:`bernoulli` and
:func:`expected_adjacency` are dense :math:`O(N_q N_k)` references for tests
and small inputs. :func:`plan_tiles` splits a sharp head's law into dense
tiles of cluster-sorted tokens and a rest for fastRG;
:func:`sample_tiled` draws a graph through that split.
:func:`fastrg_static` samples :func:`fastrg`'s law into buffers of a size
fixed before the call, for a layer traced or captured as one graph.
"""
from sbm_pyg.sampling.edges import edge_pairs
from sbm_pyg.sampling.fastrg import BACKENDS, MODES, fastrg
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.sampling.reference import bernoulli, expected_adjacency
from sbm_pyg.sampling.static_fastrg import (
    StaticGraph,
    expected_draws,
    fastrg_static,
    round_capacity,
    valid_graph,
)
from sbm_pyg.sampling.tiled_graph import sample_tiled
from sbm_pyg.sampling.tiles import TilePlan, plan_tiles

__all__ = ["SampledGraph", "fastrg", "bernoulli", "expected_adjacency",
           "edge_pairs", "MODES", "BACKENDS", "TilePlan", "plan_tiles",
           "sample_tiled", "fastrg_static", "StaticGraph", "valid_graph",
           "round_capacity", "expected_draws"]
