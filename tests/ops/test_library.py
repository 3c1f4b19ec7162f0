"""The operator library: every CUDA kernel runs on its inputs' device."""
import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from sbm_pyg.ops import library

# The tests fake a tensor on a second GPU: FakeTensorMode makes one where
# CUDA is absent (CI) or has that device, and refuses on one GPU.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="fakes cuda:1, which a one-GPU machine refuses")


@pytest.fixture
def entered(monkeypatch):
    """The devices torch.cuda.device was entered with (mocked: no GPU
    needed), and whether the kernel ran inside."""
    log = {"devices": [], "inside": False, "ran_inside": []}

    @contextlib.contextmanager
    def device(d):
        log["devices"].append(torch.device(d))
        log["inside"] = True
        try:
            yield
        finally:
            log["inside"] = False
    monkeypatch.setattr(torch.cuda, "device", device)
    return log


def _on_cuda1():
    with FakeTensorMode():
        return torch.empty(3, device="cuda:1"), torch.empty(2, device="cuda:1")


def test_the_guard_makes_the_inputs_device_current(entered):
    def kernel(scale, a, b):
        entered["ran_inside"].append(entered["inside"])
        return scale
    a, b = _on_cuda1()
    assert library.device_guard(kernel)(2.0, a, b) == 2.0
    assert entered["devices"] == [torch.device("cuda:1")]
    assert entered["ran_inside"] == [True]


def test_define_ops_registers_the_cuda_kernels_guarded(entered, monkeypatch):
    registered = {}

    class Recorder:
        def define(self, schema):
            pass

        def impl(self, name, kernel, key):
            registered[(name, key)] = kernel
    monkeypatch.setattr(library, "LIBRARY", Recorder())
    monkeypatch.setattr(library, "WITH_TRITON", True)
    monkeypatch.setattr(torch.library, "register_fake", lambda *a, **k: None)

    def kernel(a, b):
        entered["ran_inside"].append(entered["inside"])
        return a
    library.define_ops({"op": ("(Tensor a, Tensor b) -> Tensor", None, kernel)})
    a, b = _on_cuda1()
    assert registered[("op", "CUDA")](a, b) is a
    assert entered["devices"] == [torch.device("cuda:1")]
    assert entered["ran_inside"] == [True]
