"""The test device switch.

``SBM_PYG_TEST_DEVICE=cuda pytest`` runs every device-relevant test with
torch's default device set to CUDA, so the tensors, modules and generators
the tests create (through :func:`tests.helpers.seeded`) live there and the
library runs its CUDA paths. Tests of host-side tools (CLI, demo, docs,
notebooks, benchmarks) carry the ``host`` marker and stay on the CPU.

Without a GPU the Triton kernels run under Triton's interpreter
(``TRITON_INTERPRET=1``, set before anything imports them), with their
scalar arguments passed as the compiled kernels receive them
(:mod:`tests.triton_abi`); ``SBM_PYG_TRITON_ABI=plain`` runs the plain
interpreter instead, which passes Python floats exact.
"""
import importlib.util
import os

import pytest
import torch

from tests.helpers import TEST_DEVICE

if TEST_DEVICE.type == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if (importlib.util.find_spec("triton") is not None
            and os.environ.get("SBM_PYG_TRITON_ABI") != "plain"):
        from tests import triton_abi
        triton_abi.install()


def pytest_configure(config):
    # Set for the whole session, so that tensors the test modules build at
    # import (constants, masks) are on the test device too.
    torch.set_default_device(TEST_DEVICE)
    config.addinivalue_line(
        "markers", "many_draws: a sampler test too large for Triton's "
        "interpreter (skipped there for the Triton backend)")
    config.addinivalue_line(
        "markers", "host: a host-side test that runs on the CPU whatever "
        "SBM_PYG_TEST_DEVICE says")
    config.addinivalue_line(
        "markers", "slow: an end-to-end test (training to a target, a "
        "notebook, a benchmark's quick run, a statistical test of many "
        "draws): `make test-slow` runs them, `make test` leaves them out")
    # pytest-xdist's workers share the cores: one worker's OpenMP threads
    # on every core would oversubscribe them (the kernels then slow down
    # several times).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_report_header(config):
    return f"sbm_pyg test device: {TEST_DEVICE}"


@pytest.fixture(autouse=True)
def _default_device(request):
    device = "cpu" if request.node.get_closest_marker("host") else TEST_DEVICE
    previous = torch.get_default_device()
    torch.set_default_device(device)
    yield
    torch.set_default_device(previous)


@pytest.fixture
def device():
    """The device the test runs on (see the module docstring)."""
    return torch.get_default_device()
