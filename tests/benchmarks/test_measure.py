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


def test_median_times_takes_turns_on_either_clock():
    # One timing function for every suite: each function warmed up once,
    # then called once per repeat in turns; CUDA events only on CUDA (the
    # host's clock elsewhere), no memory figure off CUDA.
    import torch

    from benchmarks.measure import cuda_peak, median_times
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    for clock in ("wall", "events"):
        calls.clear()
        times = median_times(fns, torch.device("cpu"), 3, clock=clock)
        assert calls == ["a", "b"] * 4
        assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    with pytest.raises(ValueError, match="clock"):
        median_times(fns, torch.device("cpu"), 1, clock="gpu")
    assert cuda_peak(lambda: None, torch.device("cpu")) is None
