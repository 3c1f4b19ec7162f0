"""Run helpers (sbm_pyg/experiments/runs.py) not covered through the CLI."""
import pytest
import torch

from sbm_pyg.experiments.runs import PeakMemory


def test_peak_memory_counts_what_a_stretch_adds():
    # On Linux the resident set's peak beyond the start: a 64 MiB buffer
    # touched within the stretch shows, at least most of it.
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    buf = torch.ones(16 * 2**20, device="cpu")  # 64 MiB, written
    got = peak.read()
    del buf
    if got is None:
        pytest.skip("no /proc/self/status here")
    assert got >= 48 * 2**20
