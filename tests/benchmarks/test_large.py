import json

import pytest

from benchmarks.large import main, one_size


def test_one_size_starts_at_its_density():
    row = one_size(1500, degree=30, threads=1)
    assert row["init_density"] == pytest.approx(0.02) and row["exploration"] == pytest.approx(0.002)
    # Sampled at the start plus the exploration (1.1x the start), every head.
    for density in row["sampled_density"]:
        assert 1.1 * 0.02 * 0.85 < density < 1.1 * 0.02 * 1.15
    assert row["time_s"] > 0 and row["peak_bytes"] > 0


def test_sizes_in_their_own_processes(tmp_path):
    out = tmp_path / "large.json"
    res = main(["--sizes", "600", "1200", "--degree", "24", "--threads", "1",
                "--out", str(out)])
    assert [r["n"] for r in res["rows"]] == [600, 1200]
    assert json.loads(out.read_text())["time_slope"] == res["time_slope"]
    assert res["command"].startswith("python -m benchmarks.large --sizes 600 1200")
