import subprocess
import sys

import pytest

import sbm_pyg

pytestmark = pytest.mark.host


def test_public_names_resolve():
    for name in sbm_pyg.__all__:
        assert getattr(sbm_pyg, name) is not None, name
    assert set(dir(sbm_pyg)) >= set(sbm_pyg.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        sbm_pyg.no_such_name


def test_import_loads_neither_networkx_nor_the_training_code():
    code = ("import sys, sbm_pyg; "
            "print(sorted(m for m in ('networkx', 'sbm_pyg.theory', "
            "'sbm_pyg.experiments', 'sbm_pyg.experiments.train', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"
    # ... and they load on first use.
    code = ("import sys, sbm_pyg; sbm_pyg.theory.lemma1_probability; "
            "print('networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "True"
