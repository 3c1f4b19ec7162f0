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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_community_features_share_a_centre_per_community(seed):
    g = cluster_graph(30_000, generator=seeded(seed))
    plain = community_task(g, seeds=3, generator=seeded(seed + 10))
    data = community_task(g, seeds=3, generator=seeded(seed + 10), features=16, noise=2.0)
    classes = int(g.y.max()) + 1
    # The seeds, the one-hot columns and the splits are those without them.
    assert data.x.shape == (30_000, classes + 1 + 16)
    assert torch.equal(data.x[:, :classes + 1], plain.x)
    for name in ("train_mask", "val_mask", "test_mask", "seed_mask"):
        assert torch.equal(data[name], plain[name])
    f = data.x[:, classes + 1:].double()
    counts = torch.bincount(g.y, minlength=classes).double()
    centre = torch.zeros(classes, 16, dtype=torch.float64).index_add_(0, g.y, f) / counts[:, None]
    within = f - centre[g.y]
    # Each community has >= 500 nodes here: its mean's s.d. is at most
    # 2 / sqrt(500) < 0.09 a coordinate, so the centres' spread (s.d. 1) and
    # the noise (s.d. 2) are read within 10% over 16 or more coordinates.
    assert float(counts.min()) >= 500
    assert float(within.std()) == pytest.approx(2.0, rel=0.02)
    assert float(centre.std()) == pytest.approx(1.0, rel=0.25)  # 6 x 16 centres
    with pytest.raises(ValueError, match="features must be an int >= 0"):
        community_task(g, features=-1)
    with pytest.raises(ValueError, match="noise must be > 0"):
        community_task(g, features=4, noise=0.0)
