"""docs/api.md is generated from the docstrings and must be current; every
public name has a docstring."""
import importlib
import inspect
import runpy
from pathlib import Path

import pytest

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host

MAKE_API = Path(__file__).parents[1] / "docs" / "make_api.py"
make_api = runpy.run_path(str(MAKE_API))


def test_api_reference_is_current():
    assert make_api["main"](["--check"]) == 0, "run python docs/make_api.py"


@pytest.mark.parametrize("module_name", list(make_api["MODULES"]) + ["sbm_pyg"])
def test_public_names_have_docstrings(module_name):
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"
        if inspect.isclass(obj):
            for member, value in make_api["_members"](obj):
                target = value.fget if isinstance(value, property) else value
                assert inspect.getdoc(target), f"{name}.{member} has no docstring"
