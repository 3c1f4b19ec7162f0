import pytest

from benchmarks.measure import loglog_slope

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


def test_loglog_slope():
    assert abs(loglog_slope([1, 10, 100], [3, 30, 300]) - 1) < 1e-12
    assert abs(loglog_slope([1, 10, 100], [5, 500, 50000]) - 2) < 1e-12
