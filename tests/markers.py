"""The skip markers the tests share, named for what a test needs.

Imported by test modules only, after ``tests/conftest.py`` has set up
Triton's interpreter and the test device."""
import importlib.util

import pytest

from sbm_pyg.ops import WITH_EXTENSION, triton_runs
from tests.helpers import TEST_DEVICE

# The compiled extension (sbm_pyg._C), wherever the tests run: its
# operators take tensors of any device for the checks these tests make.
needs_extension = pytest.mark.skipif(
    not WITH_EXTENSION, reason="the compiled extension (sbm_pyg._C) is not built")
# The extension's CPU kernels on the test device: a CUDA test run has none.
needs_cpp = pytest.mark.skipif(
    not WITH_EXTENSION or TEST_DEVICE.type != "cpu",
    reason="sbm_pyg._C not built, or the tests run on another device")
# Triton importable: its kernels run interpreted on the CPU, compiled on
# a GPU.
needs_triton_installed = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed")
# The Triton kernels run on the test device.
needs_triton = pytest.mark.skipif(
    not triton_runs(TEST_DEVICE),
    reason="the Triton kernels do not run on the test device")
