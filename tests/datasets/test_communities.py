"""CLUSTER's recipe at scale and the seed-feature community task."""
import pytest
import torch
from torch_geometric.data import Data

from sbm_pyg.datasets.communities import CLUSTER_DEGREES, cluster_graph, community_task
from tests.helpers import seeded


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cluster_graph_keeps_clusters_degrees(seed):
    n = 60_000
    g = cluster_graph(n, generator=seeded(seed))
    row, col = g.edge_index
    assert bool((row != col).all())
    key = row * n + col
    assert key.unique().numel() == key.numel()
    assert torch.equal(key.sort().values, (col * n + row).sort().values)
    sizes = torch.bincount(g.y)
    assert sizes.numel() == 6 and int(sizes.sum()) == n
    inside = float((g.y[row] == g.y[col]).sum()) / n
    outside = float((g.y[row] != g.y[col]).sum()) / n
    # Each block's count is Poisson (relative s.d. below 1e-2 here) and p
    # is set from the mean community size: 5% covers the sizes' spread.
    assert inside == pytest.approx(CLUSTER_DEGREES[0], rel=0.05)
    assert outside == pytest.approx(CLUSTER_DEGREES[1], rel=0.05)


def test_community_task_needs_room_for_its_seeds():
    graph = Data(edge_index=torch.empty(2, 0, dtype=torch.long),
                 y=torch.tensor([0, 0, 0, 1, 1]), num_nodes=5)
    with pytest.raises(ValueError, match="seeds must be fewer than the smallest"):
        community_task(graph, seeds=2)
    with pytest.raises(ValueError, match="seeds must be a positive int"):
        community_task(graph, seeds=0)
    with pytest.raises(ValueError, match="split must be"):
        community_task(graph, seeds=1, split=(0.8, 0.3))
    data = community_task(graph, seeds=1, split=(0.5, 0.0), generator=seeded(0))
    assert int(data.seed_mask.sum()) == 2 and int(data.val_mask.sum()) == 0
    assert sorted(data.y[data.seed_mask].tolist()) == [0, 1]


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="n must be an int >= 2 \\* communities"):
        cluster_graph(10)
    with pytest.raises(ValueError, match="communities must be an int >= 2"):
        cluster_graph(100, communities=1)
    with pytest.raises(ValueError, match="degrees must be two numbers"):
        cluster_graph(100, degrees=(0.0, 0.0))
