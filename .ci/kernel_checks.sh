#!/usr/bin/env bash
# The Triton kernels' checks that need no GPU, cached by content:
#
#   1. the Triton tests under the plain interpreter (make test runs them in
#      the compiled kernels' ABI, tests/triton_abi.py);             ~5 min
#   2. every Triton launch compiled ahead of time for sm_80 and sm_90 with
#      the development pin's Triton (benchmarks.checks.triton_compile): fails on a
#      kernel that does not compile, fp32 scalars in fp64 kernels, new
#      spills, tl.dot without input_precision;                     ~8 min
#   3. both under the GPU image's torch 2.11 / Triton 3.6 and the newest
#      torch the index installs (benchmarks/checks/version_matrix.sh).   ~28 min
#
# What they exercise is the code the Triton tests import (sbm_pyg's nn,
# ops, sampling, validation and the compiled extension's sources), those
# tests and their helpers, the compile check, its baselines, and the
# versions of Python, torch and Triton. A pass is recorded under a hash of
# exactly that (git's blob ids of the committed files and the versions), in
# $SBM_PYG_CI_CACHE (default ~/.cache/sbm_pyg/kernel-checks); a later run
# with the same hash reuses the pass, since the checks are deterministic in
# their inputs, and prints where the record is. Uncommitted changes to
# those files, or KERNEL_CHECKS=always, run the checks whatever is cached.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CACHE=${SBM_PYG_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sbm_pyg/kernel-checks}
inputs=(sbm_pyg/__init__.py sbm_pyg/validation.py sbm_pyg/nn sbm_pyg/ops
        sbm_pyg/sampling csrc setup.py pyproject.toml tests/conftest.py
        tests/helpers.py tests/triton_abi.py tests/ops tests/sampling
        benchmarks/checks/__init__.py benchmarks/checks/triton_compile.py
        benchmarks/checks/version_matrix.sh
        benchmarks/checks/results-triton-compile.json
        benchmarks/checks/results-triton-compile-3.6.0.json
        benchmarks/checks/results-triton-compile-3.8.0.json .ci/kernel_checks.sh)
key=$({ git ls-files -s -- "${inputs[@]}"
        $PY -c 'import sys, torch, triton
print(sys.version, torch.__version__, triton.__version__)'; } \
      | sha256sum | cut -c1-16)
record="$CACHE/$key"
clean=1
git diff --quiet HEAD -- "${inputs[@]}" || clean=0
if [ "$clean" = 1 ] && [ "${KERNEL_CHECKS:-cached}" != always ] \
   && [ -f "$record/passed" ]; then
  echo "kernel checks: passed for these inputs ($key) on" \
       "$(cat "$record/passed"); not rerun (logs in $record)"
  exit 0
fi
logs=$(mktemp -d)
TESTS=(tests/ops/test_triton_attention.py tests/ops/test_triton_dense.py
       tests/ops/test_dropout.py tests/sampling/test_fastrg_op.py
       tests/sampling/test_backends.py tests/sampling/test_fastrg.py)
echo "kernel checks ($key): the Triton tests under the plain interpreter"
SBM_PYG_TRITON_ABI=plain $PY -m pytest -q -p no:cacheprovider -n auto -k triton \
  "${TESTS[@]}" 2>&1 | tee "$logs/plain.log" | tail -n 3
echo "kernel checks ($key): the ahead-of-time compile"
$PY -m benchmarks.checks.triton_compile --out "$logs/triton-compile.json" \
  2>&1 | tee "$logs/compile.log" | tail -n 5
echo "kernel checks ($key): the version matrix"
OUT="$logs/matrix" bash benchmarks/checks/version_matrix.sh
if [ "$clean" = 1 ]; then
  mkdir -p "$record"
  cp -r "$logs"/. "$record"/
  date -u +"%F %T UTC, commit $(git rev-parse --short HEAD)" > "$record/passed"
fi
