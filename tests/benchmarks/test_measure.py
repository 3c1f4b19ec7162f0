import pytest

from benchmarks.measure import loglog_slope

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_loglog_slope():
    assert abs(loglog_slope([1, 10, 100], [3, 30, 300]) - 1) < 1e-12
    assert abs(loglog_slope([1, 10, 100], [5, 500, 50000]) - 2) < 1e-12


def test_peak_rss_counts_what_a_call_adds():
    # The benchmarks' memory figure: a 64 MiB buffer written within the call
    # shows, at least most of it (as the training runs' PeakMemory).
    import os

    import torch

    from benchmarks.measure import peak_rss
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("Linux only")
    assert peak_rss(lambda: torch.ones(16 * 2**20, device="cpu")) >= 48 * 2**20
