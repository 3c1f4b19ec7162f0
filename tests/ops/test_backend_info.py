import os
import subprocess
import sys

import pytest

from sbm_pyg.ops import backend_info, backends

pytestmark = pytest.mark.host


def test_backends_names_what_runs(monkeypatch):
    expected = "compiled" if backend_info.WITH_EXTENSION else "torch"
    assert backends("cpu") == dict(sampler=expected, attention=expected)
    monkeypatch.setattr(backend_info, "WITH_EXTENSION", False)
    assert backends("cpu") == dict(sampler="torch", attention="torch")
    monkeypatch.setattr(backend_info, "WITH_TRITON", True)
    assert backends("cuda") == dict(sampler="torch", attention="triton")


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
