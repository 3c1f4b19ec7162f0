#!/usr/bin/env bash
# The Triton kernels' checks that need no GPU, skipped where a pass for the
# same inputs is on record:
#
#   1. the Triton tests under the plain interpreter (make test runs them in
#      the compiled kernels' ABI, tests/triton_abi.py);             ~5 min
#   2. every Triton launch compiled ahead of time for sm_80 and sm_90 with
#      the development pin's Triton (benchmarks.checks.triton_compile): fails on a
#      kernel that does not compile, fp32 scalars in fp64 kernels, new
#      spills, tl.dot without input_precision;                     ~6 min
#   3. both under the GPU image's torch 2.11 / Triton 3.6 and the newest
#      torch the index installs (benchmarks/checks/version_matrix.sh).   ~30 min
#
# What they exercise is the code the Triton tests import (sbm_pyg's nn,
# ops, sampling, validation and the compiled extension's sources), those
# tests (and the layer's, whose launches the compile records) and their
# helpers, the compile check, its baselines, this script, and the
# versions of Python, torch and Triton: the key below hashes exactly that
# (git's blob ids of the committed files and the versions).
# The checks are deterministic in their inputs, so a pass for a key holds
# for every run with that key.
#
# Where a pass is on record:
#   * .ci/kernel-checks.record, committed: written by this script (never by
#     hand) after a pass on a clean tree, to be committed with the inputs it
#     names, so that every clone sees it; trusted only if its key is this
#     tree's key and its commit is an ancestor of HEAD (the commit whose
#     files were checked);
#   * $SBM_PYG_CI_CACHE (default ~/.cache/sbm_pyg/kernel-checks): the same
#     pass with its logs, on the machine that ran it.
# What the record proves: that these checks, run by this script on these
# exact inputs and versions, passed on the 2-core development machine, with
# the summaries it quotes. What it does not: that they pass on another
# machine's CPU or Python build, or with the matrix's newest torch if the
# index has moved on since (the matrix's versions are in the record, not in
# the key); nor can a file in the tree prove who wrote it: review it as
# code. Uncommitted changes to the inputs, or KERNEL_CHECKS=always, run the
# checks whatever is recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CACHE=${SBM_PYG_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sbm_pyg/kernel-checks}
RECORD=.ci/kernel-checks.record
inputs=(sbm_pyg/__init__.py sbm_pyg/validation.py sbm_pyg/nn sbm_pyg/ops
        sbm_pyg/sampling csrc setup.py pyproject.toml tests/conftest.py
        tests/helpers.py tests/triton_abi.py tests/ops tests/sampling
        tests/nn/test_conv.py
        benchmarks/checks/__init__.py benchmarks/checks/triton_compile.py
        benchmarks/checks/version_matrix.sh
        benchmarks/checks/results-triton-compile.json
        benchmarks/checks/results-triton-compile-3.6.0.json
        benchmarks/checks/results-triton-compile-3.8.0.json .ci/kernel_checks.sh)
versions=$($PY -c 'import platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__,
      "triton", triton.__version__)')
key=$({ git ls-files -s -- "${inputs[@]}"; echo "$versions"; } | sha256sum | cut -c1-16)
record="$CACHE/$key"
commit=$(git rev-parse HEAD)
clean=1
git diff --quiet HEAD -- "${inputs[@]}" || clean=0
if [ "$clean" = 1 ] && [ "${KERNEL_CHECKS:-recorded}" != always ]; then
  if [ -f "$RECORD" ] && [ "$(sed -n 's/^key //p' "$RECORD")" = "$key" ] \
     && git merge-base --is-ancestor "$(sed -n 's/^commit //p' "$RECORD")" HEAD 2>/dev/null; then
    echo "kernel checks: passed for these inputs ($key, $versions) as" \
         "$RECORD records; not rerun:"
    sed 's/^/  /' "$RECORD"
    exit 0
  fi
  if [ -f "$record/passed" ]; then
    echo "kernel checks: passed for these inputs ($key) on" \
         "$(cat "$record/passed"); not rerun (logs in $record)"
    exit 0
  fi
fi
logs=$(mktemp -d)
TESTS=(tests/ops/test_triton_attention.py tests/ops/test_triton_dense.py
       tests/ops/test_dropout.py tests/sampling/test_fastrg_op.py
       tests/sampling/test_backends.py tests/sampling/test_fastrg.py)
start=$SECONDS
echo "kernel checks ($key): the Triton tests under the plain interpreter"
SBM_PYG_TRITON_ABI=plain $PY -m pytest -q -p no:cacheprovider -n auto -k triton \
  "${TESTS[@]}" 2>&1 | tee "$logs/plain.log" | tail -n 3
echo "kernel checks ($key): the ahead-of-time compile"
$PY -m benchmarks.checks.triton_compile --out "$logs/triton-compile.json" \
  2>&1 | tee "$logs/compile.log" | tail -n 5
echo "kernel checks ($key): the version matrix"
OUT="$logs/matrix" bash benchmarks/checks/version_matrix.sh
minutes=$(( (SECONDS - start + 30) / 60 ))
if [ "$clean" = 1 ]; then
  mkdir -p "$record"
  cp -r "$logs"/. "$record"/
  date -u +"%F %T UTC, commit $(git rev-parse --short HEAD)" > "$record/passed"
  # The committed record: what ran, on which versions, and each check's
  # last line. Commit it (alone, or with changes outside the inputs).
  {
    echo "# Written by .ci/kernel_checks.sh after its checks passed on a clean tree;"
    echo "# commit it as it is (see that script for what it proves)."
    echo "key $key"
    echo "commit $commit"
    echo "date $(date -u +'%F %T UTC')"
    echo "versions $versions"
    echo "minutes $minutes on $(nproc) cores"
    echo "plain-interpreter $(tail -n 1 "$logs/plain.log")"
    echo "aot-compile $(grep -v '^\s*$' "$logs/compile.log" | tail -n 1)"
    grep -E 'torch [0-9.]+: torch|exit|passed|failed' "$logs/matrix/matrix.log" \
      | sed 's/^\[version_matrix [0-9:]*\] /matrix /'
  } > "$RECORD"
  echo "kernel checks: passed; $RECORD written (commit it)"
fi
