import re

import pytest

from sbm_pyg.demo import main

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_demo_prints_both_tables(capsys):
    main(["--lengths", "16", "64", "--seconds", "0.5", "--num-clusters", "8"])
    out = capsys.readouterr().out
    assert "SBM head at initialization" in out and "The trained SBM head" in out
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+([\d.]+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [16, 64, 16, 64]
    for n, edges, density, expected, ms, rate in rows:
        assert int(edges) == round(float(density) * int(n) ** 2)
        assert 0 < float(density) <= 1 and 0 < float(expected) <= 1
        # Medges/s is the edges over the printed (rounded) time.
        assert abs(float(rate) - int(edges) / float(ms) / 1e3) <= (
            0.01 + int(edges) / 1e3 * abs(1 / float(ms) - 1 / (float(ms) + 0.05)))
    assert re.search(r"trained \d+ steps", out)
