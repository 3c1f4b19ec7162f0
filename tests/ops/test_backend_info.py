import os
import subprocess
import sys
import warnings

import pytest
import torch

from sbm_pyg.ops import backend_info, backends

pytestmark = pytest.mark.host


def test_backends_names_what_runs(monkeypatch):
    expected = "cpp" if backend_info.WITH_EXTENSION else "torch"
    assert backends("cpu") == dict(sampler=expected, attention=expected)
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    assert backends("cpu") == dict(sampler="torch", attention="torch")
    monkeypatch.setattr(backend_info, "WITH_TRITON", True)
    assert backends("cuda") == dict(sampler="triton", attention="triton")
    monkeypatch.setattr(backend_info, "WITH_TRITON", False)
    monkeypatch.setattr(backend_info, "_WARNED", {})
    with pytest.warns(RuntimeWarning, match="triton is not installed"):
        assert backends("cuda") == dict(sampler="torch", attention="torch")
    # Once: the second call says nothing, and the CPU never did.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends("cuda") == dict(sampler="torch", attention="torch")
        backends("cpu")


def test_resolve_backend_raises_where_the_kernel_cannot_run(monkeypatch):
    resolve = backend_info.resolve_backend
    for op in backend_info.OPS:
        assert resolve(op, "torch", "cuda") == "torch"
        assert resolve(op, None, "cpu") == resolve(op, "auto", "cpu")
        with pytest.raises(ValueError, match="backend must be one of"):
            resolve(op, "compiled", "cpu")
        monkeypatch.setattr(backend_info, "WITH_EXTENSION", True)
        assert resolve(op, "cpp", "cpu") == "cpp"
        with pytest.raises(ValueError, match=f"{op} backend 'cpp' runs on the CPU"):
            resolve(op, "cpp", "cuda")
        monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
        with pytest.raises(ValueError, match="not built"):
            resolve(op, "cpp", "cpu")
        monkeypatch.setattr(backend_info, "WITH_TRITON", False)
        with pytest.raises(ValueError, match=f"{op} backend 'triton' needs triton"):
            resolve(op, "triton", "cuda")
        monkeypatch.undo()
    with pytest.raises(ValueError, match="op must be one of"):
        resolve("softmax", "auto", "cpu")
    # Dropout is no argument: every kernel has it, so it changes no choice.
    with pytest.raises(TypeError, match="dropout"):
        resolve("attention", "auto", "cpu", dropout=0.1)


WITHOUT_EXTENSION = """
import importlib.abc, sys, warnings
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "sbm_pyg._C":
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import sbm_pyg
print([str(w.message) for w in caught if "sbm_pyg._C" in str(w.message)])
"""


@pytest.mark.parametrize("silenced", [False, True])
def test_a_missing_extension_is_announced(silenced):
    env = {"SBM_PYG_NO_EXT": "1"} if silenced else {}
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXTENSION],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout
    assert ("pure-PyTorch path" in out) != silenced


def test_the_dense_kernel_runs_on_the_cpu_and_cuda(monkeypatch):
    resolve = backend_info.resolve_backend
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", True)
    monkeypatch.setattr(backend_info, "WITH_TRITON", True)
    monkeypatch.setattr(backend_info, "_device_name", lambda index: "GPU X")
    for device in ("cpu", "cuda"):
        assert backend_info.dense_runs(torch.device(device))
        assert resolve("attention", "dense", device) == "dense"
        # "auto" is a sparse kernel here: sbm_attention chooses the dense
        # regime per (sequence, head), by expected density.
        assert resolve("attention", "auto", device) != "dense"
    monkeypatch.setattr(backend_info, "WITH_TRITON", False)
    assert not backend_info.dense_runs(torch.device("cuda"))
    monkeypatch.setattr(backend_info, "_WARNED", {})
    with pytest.warns(RuntimeWarning, match="triton is not installed"):
        assert resolve("attention", "auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="'dense' needs triton"):
        resolve("attention", "dense", "cuda")
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    assert not backend_info.dense_runs(torch.device("cpu"))
    with pytest.raises(ValueError, match="not built"):
        resolve("attention", "dense", "cpu")


def test_dense_crossover_is_the_devices_own_where_measured(monkeypatch):
    # A GPU without a measured value takes the CPU's, and says so; one with
    # a value takes it.
    monkeypatch.setattr(backend_info, "_device_name", lambda index: "GPU X")
    monkeypatch.setattr(backend_info, "dense_runs", lambda device: True)
    monkeypatch.setattr(backend_info, "DEVICE_CROSSOVERS", {})
    assert backend_info.dense_crossover("cuda") == (
        backend_info.DENSE_CROSSOVER, "cpu (not measured on GPU X)")
    assert backend_info.dense_crossover("cpu") == (backend_info.DENSE_CROSSOVER, "cpu")
    monkeypatch.setattr(backend_info, "DEVICE_CROSSOVERS", {"GPU X": 0.05})
    assert backend_info.dense_crossover("cuda:0") == (0.05, "GPU X")


def test_tiles_min_edges_is_the_devices_own_where_measured(monkeypatch):
    monkeypatch.setattr(backend_info, "_device_name", lambda index: "GPU X")
    monkeypatch.setattr(backend_info, "DEVICE_TILES_MIN_EDGES", {"GPU Y": 5e6})
    assert backend_info.tiles_min_edges("cuda") == (5e6, "GPU Y (not measured on GPU X)")
    assert backend_info.tiles_min_edges("cpu") == (backend_info.TILES_MIN_EDGES, "cpu")
    monkeypatch.setattr(backend_info, "DEVICE_TILES_MIN_EDGES", {"GPU X": 2e6, "GPU Y": 5e6})
    assert backend_info.tiles_min_edges("cuda:0") == (2e6, "GPU X")


def test_the_static_sampler_has_no_triton_and_auto_never_takes_it(monkeypatch):
    resolve = backend_info.resolve_backend
    monkeypatch.setattr(backend_info, "WITH_TRITON", True)
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", True)
    assert resolve("sampler", "auto", "cpu", static=True) == "cpp"
    assert resolve("sampler", "auto", "cuda", static=True) == "torch"
    assert resolve("sampler", "auto", "cuda") == "triton"  # the default route's
    assert resolve("sampler", "torch", "cpu", static=True) == "torch"
    with pytest.raises(ValueError, match="sampler backend 'cpp' runs on the CPU"):
        resolve("sampler", "cpp", "cuda", static=True)
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'cpp', 'torch'\)"):
        resolve("sampler", "triton", "cuda", static=True)
    with pytest.raises(ValueError, match="static=True chooses the sampler's"):
        resolve("attention", "auto", "cpu", static=True)
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    assert resolve("sampler", "auto", "cpu", static=True) == "torch"
    with pytest.raises(ValueError, match="not built"):
        resolve("sampler", "cpp", "cpu", static=True)
