"""Smoke test: the benchmark suite runs end to end at tiny sizes. Timings are
never asserted; only that every section produced well-formed results."""
import json

import os

import pytest

from benchmarks.attention import loglog_slope, main, peak_memory
from tests.helpers import seeded

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_quick_benchmark_runs(tmp_path, capsys):
    out = tmp_path / "results.json"
    results = main(["--quick", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text())["quick"] is True
    for row in results["attention"]:
        assert row["edges"] > 0
        for method in ("sbm", "sdpa", "math", "pyg"):
            assert row[method]["time"] > 0 and row[method]["memory"] >= 0
    assert all("fastrg_poisson" in row for row in results["sampler"])
    assert len(results["scaling"]["points"]) >= 2
    assert all(row["sbmconv_time"] > 0 for row in results["layer"])
    assert results["published"]["edges"] > 0
    assert results["published"]["published_edges"] > 0
    assert results["exact"]["exact"]["edges"] > 0
    assert all(row["bytes_per_edge"] > 0 for row in results["memory"])
    import torch_geometric.typing as pyg_typing
    if pyg_typing.WITH_TORCH_SCATTER and pyg_typing.WITH_TORCH_SPARSE:
        assert all(row[op]["ratio"] > 0 for row in results["ext"]["rows"]
                   for op in ("segment_max", "segment_sum", "spmm"))
    else:
        assert "skipped" in results["ext"]
    assert "[layer]" in capsys.readouterr().out


def test_loglog_slope():
    assert abs(loglog_slope([1, 10, 100], [3, 30, 300]) - 1) < 1e-12
    assert abs(loglog_slope([1, 10, 100], [5, 500, 50000]) - 2) < 1e-12


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux only")
def test_subprocess_peak_memory_sees_the_dense_scores():
    import torch
    # n=512, 2 heads: one [2, n, n] float32 matrix is 2 MiB; the math path
    # keeps scores, weights and their gradients.
    peak = peak_memory("math", 512, 0.0, torch.device("cpu"), threads=1)
    assert 2 * 2**21 <= peak <= 16 * 2**21


def test_published_baseline_samples_the_same_sbm():
    # The baseline must sample the SBM it is compared on: its mean edge
    # count matches fastrg's (poisson mode) within 4 standard errors.
    import torch
    from benchmarks.attention import kaiming_sbm, published_fastrg
    from sbm_pyg.sampling import expected_adjacency
    q, b, k, ptr = kaiming_sbm(2, 64, torch.device("cpu"))
    gen = seeded(0)
    runs = 20
    counts = torch.tensor([float(published_fastrg(q, b, k, 2, 64, gen))
                           for _ in range(runs)], dtype=torch.float64)
    P = expected_adjacency(q, b, k, ptr_q=ptr, ptr_k=ptr)
    mean, var = float(P.sum()), float((P * (1 - P)).sum())
    assert abs(float(counts.mean()) - mean) < 4 * (var / runs) ** 0.5
