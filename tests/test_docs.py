"""The documentation's code runs: every Python block of README, and the
examples in the docstrings (doctests); every public name has a docstring, and
each main public function and class an example."""
import doctest
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import pytest

import sbm_pyg

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host

ROOT = Path(__file__).parents[1]
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
INSTALL_BLOCKS = re.findall(r"```python\n(.*?)```",
                            (ROOT / "docs" / "install.md").read_text(), re.S)
MODULES = sorted(m.name for m in pkgutil.walk_packages(sbm_pyg.__path__, "sbm_pyg.")
                 if m.name not in ("sbm_pyg._C", "sbm_pyg.__main__"))
PUBLIC_MODULES = ["sbm_pyg", "sbm_pyg.sampling", "sbm_pyg.nn", "sbm_pyg.nn.functional",
                  "sbm_pyg.models", "sbm_pyg.theory", "sbm_pyg.experiments",
                  "sbm_pyg.datasets"]
# The main public functions and classes: each has an Examples section.
WITH_EXAMPLES = [
    "sbm_pyg.sampling.fastrg", "sbm_pyg.sampling.SampledGraph",
    "sbm_pyg.sampling.SampledGraph.from_keys", "sbm_pyg.sampling.bernoulli",
    "sbm_pyg.nn.functional.sparse_attention", "sbm_pyg.nn.functional.edge_probability",
    "sbm_pyg.nn.StochasticBlockModel", "sbm_pyg.nn.SBMConv",
    "sbm_pyg.nn.SBMMultiheadAttention", "sbm_pyg.nn.SBMGPSConv", "sbm_pyg.nn.GraphRecorder",
    "sbm_pyg.models.SBMTransformer", "sbm_pyg.theory.check_conditions",
    "sbm_pyg.nn.density_loss", "sbm_pyg.sampling.SampledGraph.sequence",
    "sbm_pyg.ops.backends", "sbm_pyg.nn.GatedGCNConv", "sbm_pyg.nn.EdgeGPSConv",
    "sbm_pyg.theory.hamiltonian_path", "sbm_pyg.experiments.repeat_batch",
    "sbm_pyg.experiments.tasks.repeat_accuracy_bound",
]


def test_readme_quickstart_and_commands():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "```python" in quickstart and "import sbm_pyg" in quickstart.replace(
        "from sbm_pyg", "import sbm_pyg")
    # The install line and the test command CI runs are the ones README gives.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --no-build-isolation ." in readme
    assert "pip install -v --no-build-isolation ." in ci
    assert "make test" in readme and "\nmake test\n" in ci


def test_readme_is_a_front_page():
    # What it is, install, a quickstart, one table per task: the runs'
    # narrative belongs to docs/experiments.md.
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for section in ("## Install", "## Quickstart", "## Results"):
        assert section in readme
    assert "docs/experiments.md" in readme


def _documented() -> set:
    # Names the API page documents: automodule with all members, or listed.
    names, module = set(), None
    for line in (ROOT / "docs" / "api.rst").read_text().splitlines():
        if line.startswith(".. automodule:: "):
            module = line.split()[-1]
            names.add(module)
        elif line.strip() == ":members:":
            mod = importlib.import_module(module)
            # autodoc's rule: __all__, else the public names defined there.
            public = getattr(mod, "__all__", None) or [
                n for n, o in vars(mod).items() if not n.startswith("_")
                and getattr(o, "__module__", None) == module]
            names.update(f"{module}.{n}" for n in public)
        elif line.strip().startswith(":members: "):
            names.update(f"{module}.{n.strip()}"
                         for n in line.split(":members: ")[1].split(","))
    return names


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_api_page_documents_every_public_name(module_name):
    module = importlib.import_module(module_name)
    documented = _documented()
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        home = f"{obj.__module__}.{obj.__qualname__}"
        assert home in documented, f"{module_name}.{name} ({home}) is not in docs/api.rst"


@pytest.mark.parametrize("block", README_BLOCKS,
                         ids=[f"block{i}" for i in range(len(README_BLOCKS))])
def test_readme_python_blocks_run(block):
    exec(compile(block, "README.md", "exec"), {})


@pytest.mark.parametrize("block", INSTALL_BLOCKS,
                         ids=[f"block{i}" for i in range(len(INSTALL_BLOCKS))])
def test_install_page_python_blocks_run(block):
    assert INSTALL_BLOCKS  # the page has its quickstart
    exec(compile(block, "docs/install.md", "exec"), {})


@pytest.mark.parametrize("module_name", MODULES)
def test_doctests(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module_name}"


def _resolve(path: str):
    module, _, rest = path.partition(".")
    obj = importlib.import_module(module)
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("path", WITH_EXAMPLES)
def test_main_names_have_examples(path):
    doc = inspect.getdoc(_resolve(path)) or ""
    assert re.search(r"^\s*Examples?:\s*$", doc, re.M), f"{path} has no Examples section"
    assert ">>>" in doc


def _members(cls) -> list:
    # Public methods and properties written in the class's own module (PyG
    # adds generated ones, e.g. `propagate`, when a layer is instantiated).
    out = []
    for name, value in vars(cls).items():
        target = value.fget if isinstance(value, property) else value
        if (not name.startswith("_") and inspect.isfunction(target)
                and target.__module__ == cls.__module__):
            out.append((name, target))
    return out


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_names_have_docstrings(module_name):
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"
        if inspect.isclass(obj):
            for member, target in _members(obj):
                assert inspect.getdoc(target), f"{name}.{member} has no docstring"


def _expand(path: str) -> list:
    # A cited path with shell braces ({a,b}) expanded, one per choice.
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [p for choice in m.group(1).split(",")
            for p in _expand(path[:m.start()] + choice + path[m.end():])]


def cited_artifacts(text: str) -> list:
    """The run directories and files a page cites (``docs/runs/...``,
    ``benchmarks/results-*.json``), braces expanded."""
    found = re.findall(r"(?:docs/runs|benchmarks/results)"
                       r"(?:\{[^}\s]*\}|[^\s`)\]\"',;:{])*", text)
    return [p.rstrip(".") for cited in found for p in _expand(cited)]


def test_cited_runs_exist():
    # Every figure's run: each path README and the docs cite exists (a glob
    # matches something), so a figure cannot outlive its artifact.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [f"{page.name}: {path}" for page in pages
               for path in cited_artifacts(page.read_text())
               if not list(ROOT.glob(path.rstrip("/")))]
    assert not missing, missing
    assert _expand("a{1,2}-s{0,1}") == ["a1-s0", "a1-s1", "a2-s0", "a2-s1"]
    assert cited_artifacts("see `docs/runs/nope-{x,y}/`.") == [
        "docs/runs/nope-x/", "docs/runs/nope-y/"]


def test_ring_example_table_is_its_runs():
    # docs/gps.md's table of the ring example: each row's accuracy and
    # seconds per epoch as its JSON under docs/runs/ has them.
    rows = {line.split("|")[1].strip(): line
            for line in (ROOT / "docs/gps.md").read_text().splitlines()
            if line.startswith("| ")}
    labels = {("gps", "none"): "none (local GIN only)",
              ("gps", "multihead"): "multihead (`GPSConv`, padded)",
              ("gps", "performer"): "performer (`GPSConv`, padded)",
              ("gps", "sbm"): "sbm (`SBMGPSConv`, k=32), λ = 0",
              ("gps-sbm-input-edges", "sbm"): "sbm, λ = 0, `--include-input-edges`",
              ("gps-sbm-lam0.01", "sbm"): "sbm, λ = 0.01",
              ("gps-sbm-lam0.1", "sbm"): "sbm, λ = 0.1"}
    for (run, attention), label in labels.items():
        path = ROOT / "docs/runs/gps" / f"{run}.json"
        result = next(r for r in json.loads(path.read_text())["results"]
                      if r["attention"] == attention)
        cells = [c.strip() for c in rows[label].split("|")]
        assert cells[2].strip("*") == f"{100 * result['accuracy']:.2f}%", label
        assert cells[3] == f"{result['seconds_per_epoch']:.2f}", label


def test_runs_are_grouped_by_study_with_an_index():
    # docs/runs/: one folder per study, each with its README, all listed on
    # the index page; nothing loose beside them.
    runs = ROOT / "docs/runs"
    index = (runs / "README.md").read_text()
    studies = sorted(p.name for p in runs.iterdir() if p.is_dir())
    loose = sorted(p.name for p in runs.iterdir()
                   if p.is_file() and p.name != "README.md")
    assert not loose, loose
    for study in studies:
        assert (runs / study / "README.md").is_file(), study
        assert f"({study}/README.md)" in index, study
