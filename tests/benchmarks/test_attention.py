import os

import pytest

from benchmarks.attention import peak_memory

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux only")
def test_subprocess_peak_memory_sees_the_dense_scores():
    import torch
    # n=512, 2 heads: one [2, n, n] float32 matrix is 2 MiB; the math path
    # keeps scores, weights and their gradients.
    peak = peak_memory("math", 512, 0.0, torch.device("cpu"), threads=1)
    assert 2 * 2**21 <= peak <= 16 * 2**21
