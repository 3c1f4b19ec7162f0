"""The kernel checks' families (benchmarks/checks/families.py): every Triton
test in one family, the sampler's key leaving out only files its tests do
not reach."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.checks import families
from benchmarks.checks.families import (
    ATTENTION_OWN,
    FAMILIES,
    INPUTS,
    MATRIX_COMMON,
    inputs,
    main,
    matrix_inputs,
    signatures,
)

pytestmark = pytest.mark.host
ROOT = Path(__file__).resolve().parents[3]


def test_every_test_file_is_in_one_family_and_exists():
    listed = families.recorded("all")
    assert len(listed) == len(set(listed)) == sum(
        len(f["tests"]) + len(f["record"]) for f in FAMILIES.values())
    assert all((ROOT / test).is_file() for test in listed)
    assert families.tests("all") == [t for f in FAMILIES.values() for t in f["tests"]]


def _imports(path: Path, package: str = "sbm_pyg") -> set:
    # The modules of package a file imports, at any depth of its code.
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] == package}


def _file(module: str):
    path = ROOT / (module.replace(".", "/") + ".py")
    return path if path.is_file() else None


def test_the_sampler_tests_reach_no_attention_module():
    # From the sampler family's tests through every sbm_pyg module they
    # import (package __init__ files aside: they import every submodule, to
    # define them, not to run them), no module of the attention's own.
    own = {path.removesuffix(".py") for path in ATTENTION_OWN}
    seen, todo = set(), [ROOT / test for test in FAMILIES["sampler"]["tests"]]
    todo += [ROOT / "tests/conftest.py", ROOT / "tests/helpers.py",
             ROOT / "tests/sampling/conftest.py", ROOT / "tests/sampling/cases.py"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path):
            target = _file(module)
            if target is not None and target.name != "__init__.py":
                todo.append(target)
    reached = {str(path.relative_to(ROOT)).removesuffix(".py") for path in seen}
    assert not {r for r in reached for o in own if r == o or r.startswith(o + "/")}
    assert "sbm_pyg/sampling/fastrg_triton" in reached  # the walk follows imports


def test_inputs_and_their_exclusions():
    assert inputs("attention") == INPUTS
    sampler = inputs("sampler")
    assert sampler[:len(INPUTS)] == INPUTS
    excluded = [spec.removeprefix(":(exclude)") for spec in sampler[len(INPUTS):]]
    assert excluded == ATTENTION_OWN
    # Each exclusion lies inside an input and exists.
    assert all(any(path == i or path.startswith(i + "/") for i in INPUTS)
               and (ROOT / path).exists() for path in excluded)


def test_the_command_line(capsys):
    assert main(["tests", "sampler"]) == 0
    assert capsys.readouterr().out.split() == FAMILIES["sampler"]["tests"]
    assert main(["record", "attention"]) == 0
    assert capsys.readouterr().out.split()[-1] == "tests/nn/test_conv.py"
    assert main(["inputs", "all"]) == 2 and main(["tests", "nope"]) == 2
    assert "usage" in capsys.readouterr().err
    # As the scripts call it, from the repository's root.
    out = subprocess.run([sys.executable, "-m", "benchmarks.checks.families", "tests", "all"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == families.tests("all")


def _inside(path: str, specs) -> bool:
    return any(path == spec or path.startswith(spec + "/") for spec in specs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_matrix_inputs_lie_inside_the_family_key(family):
    # A family trusted by its key has its matrix's inputs unchanged too.
    excluded = FAMILIES[family]["excludes"]
    listed = matrix_inputs(family)
    assert len(listed) == len(set(listed))
    for path in listed:
        assert (ROOT / path).exists(), path
        assert _inside(path, INPUTS) and not _inside(path, excluded), path


def test_every_module_that_imports_triton_is_a_matrix_input():
    # The matrix keys on the Triton files: a module that imports Triton and
    # is no matrix input could change what the versions see unnoticed.
    listed = set(MATRIX_COMMON) | {p for f in FAMILIES.values() for p in f["triton"]}
    for path in sorted((ROOT / "sbm_pyg").rglob("*.py")):
        if _imports(path, "triton"):
            assert str(path.relative_to(ROOT)) in listed, path


def test_signatures_are_the_distinct_compiled_ones(tmp_path):
    row = dict(kernel="k", module="m", arch="sm_80", signature={"x": "*fp32"},
               constexprs={"B": "16"}, num_warps=4, registers=40, seconds=0.3)
    rows = [row, dict(row, registers=41, seconds=0.5),  # the same signature
            dict(row, arch="sm_90"), dict(row, constexprs={"B": "32"})]
    path = tmp_path / "compile.json"
    path.write_text(json.dumps(dict(triton="3.9.0", kernels=rows)))
    lines = signatures(path)
    assert lines == sorted(lines) and len(lines) == 3
    assert json.loads(lines[0]) == ["m", "k", "sm_80", {"x": "*fp32"}, {"B": "16"}, 4]
    assert main(["signatures", str(path)]) == 0
    assert main(["matrix-inputs", "all"]) == 2 and main(["signatures", "nope.json"]) == 2


def test_each_baseline_row_is_one_familys():
    # Every row of the committed baselines belongs to exactly one family, so
    # that the families' keys together take all of them.
    for name in families.BASELINES:
        rows = json.loads((ROOT / name).read_text())["kernels"]
        assert rows and all(sum(families.owns(f, row["module"]) for f in FAMILIES) == 1
                            for row in rows), name


def test_a_familys_key_takes_its_own_baseline_rows(tmp_path, monkeypatch):
    sampler = dict(module="sbm_pyg.sampling.fastrg_triton_kernels", kernel="draw", registers=40)
    attention = dict(module="sbm_pyg.ops.triton_attention", kernel="forward", registers=40)
    monkeypatch.setattr(families, "ROOT", tmp_path)
    (tmp_path / "benchmarks/checks").mkdir(parents=True)
    pin = tmp_path / families.BASELINES[0]

    def lines(rows):
        pin.write_text(json.dumps(dict(triton="3.9.0", kernels=rows)))
        return {f: families.baselines(f) for f in FAMILIES}

    before = lines([sampler, attention])
    assert before["sampler"] == [families.BASELINES[0], json.dumps(sampler, sort_keys=True),
                                 *families.BASELINES[1:]]  # absent files: no rows
    # The attention's rows rewritten: the sampler's key input unchanged.
    after = lines([sampler, dict(attention, registers=41)])
    assert after["sampler"] == before["sampler"]
    assert after["attention"] != before["attention"]
    assert lines([dict(sampler, registers=41), attention])["sampler"] != before["sampler"]
    assert main(["baseline-files"]) == 0 and main(["baselines", "all"]) == 2
