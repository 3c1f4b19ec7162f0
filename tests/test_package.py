import ast
import importlib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import sbm_pyg

pytestmark = pytest.mark.host


SUBPACKAGES = ["sampling", "nn", "nn.functional", "ops", "models", "theory", "datasets",
               "experiments"]


def test_top_level_names_are_the_subpackages_own():
    # Each name at the top is the very object its subpackage exports (a
    # re-export that drifted to another object, or a stale copy, fails).
    homes = {}
    for sub in SUBPACKAGES:
        module = importlib.import_module(f"sbm_pyg.{sub}")
        for name in module.__all__:
            homes.setdefault(name, getattr(module, name))
    for name in sbm_pyg.__all__:
        obj = getattr(sbm_pyg, name)
        if name in ("models", "experiments", "theory", "datasets"):
            assert obj is importlib.import_module(f"sbm_pyg.{name}")
        else:
            assert obj is homes[name], name
    assert len(set(sbm_pyg.__all__)) == len(sbm_pyg.__all__)
    assert set(dir(sbm_pyg)) >= set(sbm_pyg.__all__)
    # Nothing at the top but the API and the package's own submodules (no
    # helper imports such as typing.Any or importlib).
    extra = {n for n, obj in vars(sbm_pyg).items() if not n.startswith("_")
             and n not in sbm_pyg.__all__ and not (
                 isinstance(obj, type(sbm_pyg))
                 and obj.__name__.startswith("sbm_pyg."))}
    assert not extra, extra
    with pytest.raises(AttributeError, match="no_such_name"):
        sbm_pyg.no_such_name


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_every_exported_name_is_defined(sub):
    module = importlib.import_module(f"sbm_pyg.{sub}")
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing and len(set(module.__all__)) == len(module.__all__)


def test_no_private_name_is_imported_across_packages():
    # "from sbm_pyg.x import _name" between sbm_pyg's subpackages couples them
    # to each other's internals; so would a script of the docs importing one.
    root = Path(sbm_pyg.__file__).parent
    docs = root.parent / "docs"
    found = []
    for path in [*root.rglob("*.py"), *docs.rglob("*.py")]:
        package = ("docs" if docs in path.parents
                   else path.relative_to(root).parts[0])
        text = path.read_text()
        for source, names in re.findall(
                r"^from sbm_pyg\.?([\w.]*) import (\([^)]*\)|[^\n]*)", text, re.M):
            if source.split(".")[0] in ("", package) and package != "__init__.py":
                continue
            imported = [n.split(" as ")[0].strip(" ()\n")
                        for n in names.split(",")]
            found += [f"{path.name}: {source}.{n}"
                      for n in imported if n.startswith("_")]
    assert not found, found


def test_the_kernels_do_not_import_the_sampler():
    # sbm_pyg.ops holds the kernels the sampler builds on (the graph, the
    # random streams, the attention): no module of it imports
    # sbm_pyg.sampling, which would make the layering a cycle.
    root = Path(sbm_pyg.__file__).parent / "ops"
    found = [f"{path.name}: {line.strip()}" for path in root.glob("*.py")
             for line in path.read_text().splitlines()
             if re.match(r"\s*(from sbm_pyg\.sampling|import sbm_pyg\.sampling|"
                         r"from sbm_pyg import .*\bsampling\b)", line)]
    assert not found, found


def test_the_package_imports_without_triton():
    # triton is optional: without it the package runs its C++ and PyTorch
    # paths (the README's install line does not install it).
    code = ("import sys; sys.modules['triton'] = None; import sbm_pyg; "
            "from sbm_pyg.ops import backends; print(backends()['sampler'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("cpp", "torch")


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


def _sbm_pyg_imports(root: Path, rel: str) -> set:
    # The package's files that sbm_pyg/<rel> imports from.
    import ast
    out = set()
    for node in ast.walk(ast.parse((root / rel).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sbm_pyg"):
            for name in [node.module] + [f"{node.module}.{a.name}" for a in node.names]:
                path = name.replace("sbm_pyg", "", 1).lstrip(".").replace(".", "/")
                out.update(c for c in (f"{path}.py", f"{path}/__init__.py")
                           if (root / c).exists())
    return out


def _import_edges(root: Path) -> list:
    # (importer, imported) between the package's files, every import
    # counted (deferred ones in functions too): `from P import m` of a
    # submodule m is an edge to m, of a name an edge to P's own file.
    def path_of(dotted: str):
        base = root / dotted.replace("sbm_pyg", "", 1).lstrip(".").replace(".", "/")
        for c in (base.with_suffix(".py"), base / "__init__.py"):
            if c.exists():
                return str(c.relative_to(root))
        return None

    edges = []
    for p in root.rglob("*.py"):
        rel = str(p.relative_to(root))
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sbm_pyg"):
                for a in node.names:
                    target = path_of(f"{node.module}.{a.name}") or path_of(node.module)
                    if target and target != rel:
                        edges.append((rel, target))
    return edges


def _cycles(edges: list) -> list:
    import networkx as nx
    return list(nx.simple_cycles(nx.DiGraph(edges)))


def test_the_package_has_no_import_circle():
    # A circle hidden by a deferred import still ties the modules together
    # (the layer, the per-layer distillation and the model-level losses
    # once were one).
    root = Path(sbm_pyg.__file__).parent
    assert _cycles(_import_edges(root)) == []
    # The check sees a circle through a deferred import.
    assert _cycles([("nn/conv.py", "nn/distillation.py"),
                    ("nn/distillation.py", "nn/losses.py"),
                    ("nn/losses.py", "nn/conv.py")])


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_fastrg_calls_go_down_the_import_graph(backend):
    # Every call from one of the package's modules into another goes to a
    # module the caller imports: a sampler call never climbs back up.
    import torch

    from sbm_pyg.ops import WITH_EXTENSION
    from sbm_pyg.sampling import fastrg
    if backend == "cpp" and not WITH_EXTENSION:
        pytest.skip("compiled sampler not built")
    root = Path(sbm_pyg.__file__).parent
    g = torch.Generator().manual_seed(0)
    q, k = torch.rand(50, 2, 4, generator=g), torch.rand(50, 2, 4, generator=g)
    calls = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_back is not None:
            callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
            if str(root) in callee and str(root) in caller and callee != caller:
                calls.add((str(Path(caller).relative_to(root)),
                           str(Path(callee).relative_to(root))))

    sys.setprofile(profile)
    try:
        fastrg(q, torch.rand(2, 4, 4, generator=g) * 0.1, k, ptr_q=[0, 20, 50],
               ptr_k=[0, 20, 50], mode="exact", include_edges=torch.tensor([[0], [1]]),
               backend=backend, generator=g)
    finally:
        sys.setprofile(None)
    assert len(calls) >= 5
    upward = [(a, b) for a, b in calls if b not in _sbm_pyg_imports(root, a)]
    assert not upward, upward


def code_lines(source: str) -> int:
    """The lines of :obj:`source` that hold code: docstrings (a string
    expression standing alone), comments and blank lines are not counted."""
    tree = ast.parse(source)
    doc = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            doc.update(range(node.lineno, node.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                        tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc)


def test_code_lines_counts_code_only():
    source = ('def f(x):\n    """Doc.\n\n    More."""\n    # why\n\n'
              '    return (x +\n            1)\n')
    assert code_lines(source) == 3  # def, and the two lines of the return


#: Code lines (docstrings and comments not counted) past which a module is
#: due for a split along its seams: a rule on raw lines taxed documentation.
MAX_CODE_LINES = 300


def test_no_module_is_over_300_code_lines():
    root = Path(sbm_pyg.__file__).parent
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := code_lines(p.read_text())) > MAX_CODE_LINES}
    assert not long, long
