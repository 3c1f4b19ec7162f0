import pytest
import torch
from torch_geometric.utils import is_undirected

from benchmarks import gps_scaling

# Host-side tools (the GPS CLI and the CPU benchmark): on the CPU whatever
# SBM_PYG_TEST_DEVICE says.
pytestmark = [pytest.mark.host, pytest.mark.slow]


def test_scaled_pattern_graph_keeps_the_degree():
    # PATTERN's mean degree is about 50; the scaled recipe keeps it.
    for n in (1024, 4096):
        data = gps_scaling.scaled_pattern_graph(n, torch.Generator().manual_seed(0))
        assert data.num_nodes == n and is_undirected(data.edge_index)
        assert bool((data.edge_index[0] != data.edge_index[1]).all())
        degree = data.edge_index.size(1) / n
        assert 40 < degree < 60, degree
        assert 0.1 < float(data.y.float().mean()) < 0.25  # the pattern's share


def test_benchmark_runs_and_reports_limits(tmp_path):
    rows = gps_scaling.main(["--sizes", "256", "--variants", "performer", "sbm",
                             "--repeats", "1", "--threads", "1",
                             "--json", str(tmp_path / "out.json")])
    assert [r["variant"] for r in rows] == ["performer", "sbm"]
    for r in rows:
        assert r["status"] == "ok" and r["step_s"] > 0 and r["peak_memory_bytes"] > 0
    assert rows[1]["density"] > 0
    # A case past its memory limit is reported, not run.
    rows = gps_scaling.main(["--sizes", "256", "--variants", "multihead", "--repeats", "1",
                             "--threads", "1", "--memory-limit-gib", "0.5"])
    assert rows[0]["status"].startswith(("out of memory", "failed")) and "step_s" not in rows[0]
