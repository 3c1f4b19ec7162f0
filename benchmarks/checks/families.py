r"""The Triton kernels' checks split by family, so that a change to one
family's own files re-runs that family's checks alone
(``.ci/kernel_checks.sh``).

* ``sampler``: the fastRG sampler's kernels. Its tests draw graphs and
  compare them with the C++ sampler's; they call no attention code, so
  their outcome does not depend on the attention's own files
  (:data:`ATTENTION_OWN`), which its key leaves out.
* ``attention``: the sparse attention's, the dense regime's and the
  dropout's kernels. Their tests draw graphs with the sampler, so their key
  covers every input, the sampler's files included.

A change to a shared file (validation, the compiled extension's build, the
sampler, the test helpers, the checks themselves) re-runs both. The compile
check's baselines (:data:`BASELINES`) hold both families' rows; each
family's keys take its own rows (:func:`baselines`), so that a kernel
change that rewrites one family's rows (``triton_compile --update --family``)
re-runs that family's checks alone.
``tests/benchmarks/checks/test_families.py`` walks the imports of the
sampler's tests through ``sbm_pyg`` and fails if they reach an attention
module (package ``__init__`` files aside, which import every submodule).

The version matrix (other torch and Triton versions) has a key of its own
per family, :func:`matrix_inputs` and the launches' compiled signatures
(:func:`signatures`): what can differ between Triton versions is how they
compile and interpret the kernels, their wrappers and the launches they are
given, and how the extension builds against another torch. A change
elsewhere (the layer, the sampler's torch code) re-runs the development
pin's interpreter and compile, whose recorded launches decide whether the
matrix's key moved; with the same key the matrix's pass on record holds.

``python -m benchmarks.checks.families
inputs|tests|record|matrix-inputs|baselines FAMILY`` prints a family's key
inputs (git pathspecs), the tests the interpreter runs, the tests whose
launches the ahead-of-time compile records, the version matrix's inputs, or
the family's rows of the baselines; ``signatures FILE`` prints the distinct
compiled signatures of a compile check's rows, one a line, sorted;
``baseline-files`` the baselines' paths.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]

#: Everything the kernel checks exercise: the code the Triton tests import
#: (sbm_pyg's nn, ops, sampling, validation and the compiled extension's
#: sources), those tests and the layer's (whose launches the compile
#: records), their helpers, the compile check and the scripts that run
#: them; beside the family's rows of the baselines (:data:`BASELINES`).
INPUTS = ["sbm_pyg/__init__.py", "sbm_pyg/validation.py", "sbm_pyg/nn", "sbm_pyg/ops",
          "sbm_pyg/sampling", "csrc", "setup.py", "pyproject.toml", "tests/conftest.py",
          "tests/helpers.py", "tests/triton_abi.py", "tests/ops", "tests/sampling",
          "tests/nn/test_conv.py", "benchmarks/checks/__init__.py",
          "benchmarks/checks/families.py", "benchmarks/checks/triton_compile.py",
          "benchmarks/checks/version_matrix.sh", ".ci/kernel_checks.sh"]

#: The compile check's baselines: the development pin's Triton, then the
#: version matrix's. Each holds every family's rows; a family's key takes
#: its own rows alone (:func:`key_lines`), so that rewriting one family's
#: rows re-runs that family's checks alone.
BASELINES = ["benchmarks/checks/results-triton-compile.json",
             "benchmarks/checks/results-triton-compile-3.6.0.json",
             "benchmarks/checks/results-triton-compile-3.8.0.json"]

#: The attention's own files: the sampler's tests run none of their code.
ATTENTION_OWN = ["sbm_pyg/nn", "sbm_pyg/ops/dense_attention.py", "sbm_pyg/ops/dropout.py",
                 "sbm_pyg/ops/fused_attention.py", "sbm_pyg/ops/torch_attention.py",
                 "sbm_pyg/ops/triton_attention.py", "sbm_pyg/ops/triton_dense.py",
                 "sbm_pyg/ops/triton_dense_kernels.py", "csrc/attention", "tests/ops",
                 "tests/nn/test_conv.py"]

#: Per family: the Triton tests run under the plain interpreter, the tests
#: whose launches the compile records (the layer's launch both families'
#: kernels and are recorded with the attention's), and what its key leaves
#: out.
FAMILIES: Dict[str, Dict[str, List[str]]] = {
    "sampler": dict(
        tests=["tests/sampling/test_fastrg_op.py", "tests/sampling/test_backends.py",
               "tests/sampling/test_fastrg.py"],
        record=[], excludes=ATTENTION_OWN,
        triton=["sbm_pyg/sampling/fastrg_triton.py",
                "sbm_pyg/sampling/fastrg_triton_kernels.py",
                "sbm_pyg/sampling/key_masses.py", "tests/sampling/conftest.py",
                "tests/sampling/cases.py"]),
    "attention": dict(
        tests=["tests/ops/test_triton_attention.py", "tests/ops/test_triton_dense.py",
               "tests/ops/test_dropout.py"],
        record=["tests/nn/test_conv.py"], excludes=[],
        triton=["sbm_pyg/ops/triton_attention.py", "sbm_pyg/ops/triton_dense.py",
                "sbm_pyg/ops/triton_dense_kernels.py"]),
}

#: What every family's version matrix depends on besides its own Triton
#: files (``triton`` above: the kernels, their wrappers and the tests'
#: fixtures) and tests: the extension's build, the Triton helpers and
#: backend probe every kernel module imports, the tests' harness and the
#: checks (beside the family's rows of the baselines).
MATRIX_COMMON = ["csrc", "setup.py", "pyproject.toml", "sbm_pyg/ops/backend_info.py",
                 "sbm_pyg/ops/triton_streams.py", "tests/conftest.py", "tests/helpers.py",
                 "tests/triton_abi.py", "benchmarks/checks/__init__.py",
                 "benchmarks/checks/families.py", "benchmarks/checks/triton_compile.py",
                 "benchmarks/checks/version_matrix.sh", ".ci/kernel_checks.sh"]


def inputs(family: str) -> List[str]:
    """:obj:`family`'s key inputs as git pathspecs."""
    return INPUTS + [f":(exclude){path}" for path in FAMILIES[family]["excludes"]]


def tests(family: str) -> List[str]:
    """The Triton tests of :obj:`family` (``all``: every family's)."""
    names = list(FAMILIES) if family == "all" else [family]
    return [test for name in names for test in FAMILIES[name]["tests"]]


def recorded(family: str) -> List[str]:
    """The tests whose launches the compile records for :obj:`family`."""
    names = list(FAMILIES) if family == "all" else [family]
    return tests(family) + [test for name in names for test in FAMILIES[name]["record"]]


def matrix_inputs(family: str) -> List[str]:
    """The files :obj:`family`'s version matrix depends on, as git paths
    (beside the launches' :func:`signatures`)."""
    spec = FAMILIES[family]
    return MATRIX_COMMON + spec["triton"] + spec["tests"] + spec["record"]


def owns(family: str, module: str) -> bool:
    """Whether compiled rows of :obj:`module` (a dotted name) are
    :obj:`family`'s: its kernels live in one of the family's Triton files."""
    return module.replace(".", "/") + ".py" in FAMILIES[family]["triton"]


def baselines(family: str) -> List[str]:
    """:obj:`family`'s rows of each baseline (:data:`BASELINES`), as sorted
    JSON lines under the baseline's path: what its keys take of them."""
    lines = []
    for name in BASELINES:
        path = ROOT / name
        rows = json.loads(path.read_text())["kernels"] if path.is_file() else []
        lines += [name] + sorted(json.dumps(row, sort_keys=True) for row in rows
                                 if owns(family, row.get("module", "")))
    return lines


def signatures(path: Path) -> List[str]:
    """The distinct compiled signatures (kernel, architecture, argument
    types, constexprs, warps) in a compile check's rows at :obj:`path`, as
    sorted JSON lines: what the matrix compiles, whatever the launches'
    other values."""
    rows = json.loads(Path(path).read_text())["kernels"]
    return sorted({json.dumps([row["module"], row["kernel"], row["arch"], row["signature"],
                               row["constexprs"], row["num_warps"]], sort_keys=True)
                   for row in rows})


def main(argv: List[str]) -> int:
    what = {"inputs": inputs, "tests": tests, "record": recorded,
            "matrix-inputs": matrix_inputs, "baselines": baselines}
    if len(argv) == 2 and argv[0] == "signatures" and Path(argv[1]).is_file():
        print("\n".join(signatures(Path(argv[1]))))
        return 0
    if argv == ["baseline-files"]:
        print("\n".join(BASELINES))
        return 0
    per_family = ("inputs", "matrix-inputs", "baselines")
    if (len(argv) != 2 or argv[0] not in what
            or argv[1] not in (FAMILIES if argv[0] in per_family else [*FAMILIES, "all"])):
        print(f"usage: python -m benchmarks.checks.families {{{'|'.join(what)}}} "
              f"{{{'|'.join(FAMILIES)}}}, signatures FILE or baseline-files",
              file=sys.stderr)
        return 2
    print("\n".join(what[argv[0]](argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
