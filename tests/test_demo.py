import re

import pytest

from sbm_pyg.demo import main

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_demo_prints_both_tables(capsys):
    main(["--lengths", "16", "64", "--steps", "20", "--num-clusters", "8"])
    out = capsys.readouterr().out
    assert "SBM head at initialization" in out and "The trained SBM head" in out
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+([\d.]+)\s+(\w+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [16, 64, 16, 64]
    for n, edges, density, expected, ms, rate, kernel in rows:
        assert kernel in ("cpp", "dense", "torch", "triton")
        assert abs(int(edges) - float(density) * int(n) ** 2) <= 0.5 + 1e-4 * int(n) ** 2
        assert 0 < float(density) <= 1 and 0 < float(expected) <= 1
        # Medges/s is the edges over the printed (rounded) time.
        assert abs(float(rate) - int(edges) / float(ms) / 1e3) <= (
            0.01 + int(edges) / 1e3 * abs(1 / float(ms) - 1 / (float(ms) + 0.05)))
    assert re.search(r"trained 20 steps", out)


@pytest.mark.slow
def test_demo_training_learns_the_task(capsys):
    # The default run: a user's first result must beat the majority class
    # (from the library's earlier initialization it collapsed onto it).
    main(["--lengths", "16"])
    out = capsys.readouterr().out
    found = re.search(r"token accuracy ([\d.]+) \(majority class ([\d.]+)\), "
                      r"test density ([\d.]+)", out)
    assert found, out
    accuracy, majority, density = map(float, found.groups())
    assert accuracy > majority + 0.15 and density > 0.05
