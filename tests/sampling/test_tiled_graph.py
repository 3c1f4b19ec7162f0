"""A graph drawn through a tile plan: its law, small and degenerate
sequences, bad arguments."""
import pytest
import torch

from sbm_pyg.sampling.tiled_graph import sample_tiled
from sbm_pyg.sampling.tiles import in_tiles, plan_tiles
from tests.helpers import seeded
from tests.sampling.cases import repeated
from tests.sampling.test_tiles import (
    all_pairs,
    assert_has_the_law,
    in_selected_blocks,
    sharp_sbm,
)


@pytest.mark.slow
@pytest.mark.parametrize("mode,exploration,self_loops", [
    ("poisson", 0.0, False), ("exact", 0.0, False), ("exact", 0.03, True)])
def test_graph_through_the_plan_has_the_law(mode, exploration, self_loops):
    # Repeated copies of one sequence drawn through one plan: each pair's
    # frequency against the mode's probability (z-test, Bonferroni), tiles
    # and rest both exercised; the other mode's marginals are rejected.
    memb, block = sharp_sbm([0, 2, 1, 1, 0, 2, 1])
    q, b, k, ptr_q, ptr_k = repeated(memb, block, memb)
    plan = plan_tiles(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, tile_q=2, tile_k=2,
                      min_fill=0.3)
    graph = sample_tiled(q, b, k, plan, mode=mode, exploration=exploration,
                         self_loops=self_loops, generator=seeded(3))
    assert_has_the_law(graph, memb, block, mode=mode, exploration=exploration,
                       self_loops=self_loops)
    head, query, key = all_pairs([0, 7], [0, 7], 2)
    tiled = in_tiles(plan, head, query, key)
    assert tiled.any() and (~tiled).any()


@pytest.mark.parametrize("case", ["one token", "one cluster", "wide tiles"])
def test_small_and_degenerate_sequences(case):
    clusters = {"one token": [1], "one cluster": [2] * 5,
                "wide tiles": [0, 1, 0, 1]}[case]
    memb, block = sharp_sbm(clusters)
    n = len(clusters)
    head, query, key = all_pairs([0, n], [0, n], 2)
    # 64-token tiles are mostly padding here: at the default fill, none.
    assert plan_tiles(memb, block, memb).num_tiles == 0
    plan = plan_tiles(memb, block, memb, min_fill=1e-4)
    assert plan.selected.any() and plan.q_len.max() <= n
    assert torch.equal(in_tiles(plan, head, query, key),
                       in_selected_blocks(plan, memb, memb, head, query, key))
    graph = sample_tiled(memb, block, memb, plan, mode="exact", self_loops=True,
                         generator=seeded(0))
    assert n * 2 <= graph.num_edges <= 2 * n * n  # the self-loops at least


def test_bad_arguments_name_themselves():
    memb, block = sharp_sbm([0, 1, 2])
    plan = plan_tiles(memb, block, memb)
    with pytest.raises(ValueError, match="plan must be made from these memberships"):
        sample_tiled(memb[:2], block, memb[:2], plan)
    with pytest.raises(ValueError, match="mode must be one of"):
        sample_tiled(memb, block, memb, plan, mode="bernoulli")
    # Mixed precision is computed in the wider one (it raised in einsum).
    sample_tiled(memb, block.float(), memb, plan, generator=seeded(0))
