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
#   3. step 2 with its tests in the compiled kernels' ABI under the GPU
#      image's torch 2.11 / Triton 3.6 and the newest torch the index
#      installs (benchmarks/checks/version_matrix.sh), ~10 min a version
#      and family, where the matrix's own key moved: the family's Triton
#      files (kernels, wrappers, their tests and fixtures), the extension's
#      sources, the checks, the family's rows of the baselines and the
#      signatures step 2 compiled
#      (benchmarks.checks.families matrix-inputs / signatures). A change
#      to the layer or the sampler's torch code re-runs steps 1 and 2 (about
#      5 minutes a family); if their launches compile to the same
#      signatures, the matrix's pass on record holds (its own lines, with
#      its key and commit, in the record).
#
# They run per family of kernels (benchmarks/checks/families.py): the
# sampler's, and the attention's (sparse, dense regime, dropout). What a
# family's checks exercise is the code its Triton tests import (sbm_pyg's
# nn, ops, sampling, validation and the compiled extension's sources), those
# tests (and the layer's, whose launches the compile records) and their
# helpers, the compile check, its rows of the baselines, this script, and
# the versions of Python, torch and Triton; the sampler's leave out the
# attention's own files, which its tests do not run. A family's key hashes
# exactly that (git's blob ids of the committed files, the family's rows of
# the baselines, and the versions): a kernel change that rewrites one
# family's rows (triton_compile --update --family F, UPDATE=1 FAMILY=F
# version_matrix.sh) re-runs that family alone. The checks are
# deterministic in their inputs, so a pass for a key holds for every run
# with that key, and a change to the attention's own files re-runs the
# attention's checks alone.
#
# Where a family's pass is on record:
#   * .ci/kernel-checks.record, committed: written by this script (never by
#     hand) after its checks passed on a clean tree, to be committed with the
#     inputs it names, so that every clone sees it; a family's lines are
#     trusted only if their key is this tree's key for that family and their
#     commit is an ancestor of HEAD (the commit whose files were checked);
#   * $SBM_PYG_CI_CACHE (default ~/.cache/sbm_pyg/kernel-checks): the same
#     pass with its logs, on the machine that ran it.
# What the record proves: that these checks, run by this script on these
# exact inputs and versions, passed on the 2-core development machine, with
# the summaries it quotes. What it does not: that they pass on another
# machine's CPU or Python build, or with the matrix's newest torch if the
# index has moved on since (the matrix's versions are in the record, not in
# the key); nor can a file in the tree prove who wrote it: review it as
# code. Uncommitted changes to a family's inputs, or KERNEL_CHECKS=always,
# run its checks whatever is recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CACHE=${SBM_PYG_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sbm_pyg/kernel-checks}
RECORD=.ci/kernel-checks.record
versions=$($PY -c 'import platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__,
      "triton", triton.__version__)')
commit=$(git rev-parse HEAD)
new=$(mktemp)
mapfile -t baselines < <($PY -m benchmarks.checks.families baseline-files)
for family in sampler attention; do
  mapfile -t inputs < <($PY -m benchmarks.checks.families inputs $family)
  # The baselines enter the keys by the family's rows alone.
  rows=$($PY -m benchmarks.checks.families baselines $family | sha256sum)
  key=$({ echo "$family"; git ls-files -s -- "${inputs[@]}"; echo "$rows"
          echo "$versions"; } | sha256sum | cut -c1-16)
  clean=1
  git diff --quiet HEAD -- "${inputs[@]}" "${baselines[@]}" || clean=0
  if [ "$clean" = 1 ] && [ "${KERNEL_CHECKS:-recorded}" != always ]; then
    if [ -f "$RECORD" ] && [ "$(sed -n "s/^$family key //p" "$RECORD")" = "$key" ] \
       && git merge-base --is-ancestor "$(sed -n "s/^$family commit //p" "$RECORD")" \
            HEAD 2>/dev/null; then
      echo "kernel checks, $family: passed for these inputs ($key, $versions) as" \
           "$RECORD records; not rerun:"
      grep "^$family " "$RECORD" | tee -a "$new" | sed 's/^/  /'
      continue
    fi
    if [ -f "$CACHE/$key/passed" ] && git merge-base --is-ancestor \
         "$(sed -n "s/^$family commit //p" "$CACHE/$key/record")" HEAD 2>/dev/null; then
      echo "kernel checks, $family: passed for these inputs ($key) on" \
           "$(cat "$CACHE/$key/passed"); not rerun (logs in $CACHE/$key)"
      cat "$CACHE/$key/record" >> "$new"
      continue
    fi
  fi
  logs=$(mktemp -d)
  mapfile -t tests < <($PY -m benchmarks.checks.families tests $family)
  start=$SECONDS
  echo "kernel checks, $family ($key): the Triton tests under the plain interpreter"
  SBM_PYG_TRITON_ABI=plain $PY -m pytest -q -p no:cacheprovider -n auto -k triton \
    "${tests[@]}" 2>&1 | tee "$logs/plain.log" | tail -n 3
  echo "kernel checks, $family ($key): the ahead-of-time compile"
  $PY -m benchmarks.checks.triton_compile --family $family \
    --out "$logs/triton-compile.json" 2>&1 | tee "$logs/compile.log" | tail -n 5
  # The matrix's own key: its inputs and the signatures just compiled.
  mapfile -t minputs < <($PY -m benchmarks.checks.families matrix-inputs $family)
  mkey=$({ echo "$family matrix"; git ls-files -s -- "${minputs[@]}"; echo "$rows"
           $PY -m benchmarks.checks.families signatures "$logs/triton-compile.json"; } \
         | sha256sum | cut -c1-16)
  mclean=1
  git diff --quiet HEAD -- "${minputs[@]}" "${baselines[@]}" || mclean=0
  if [ "$mclean" = 1 ] && [ "${KERNEL_CHECKS:-recorded}" != always ] && [ -f "$RECORD" ] \
     && [ "$(sed -n "s/^$family matrix-key //p" "$RECORD")" = "$mkey" ] \
     && git merge-base --is-ancestor "$(sed -n "s/^$family matrix-commit //p" "$RECORD")" \
          HEAD 2>/dev/null; then
    echo "kernel checks, $family: the version matrix passed for these kernels," \
         "signatures and tests ($mkey) as $RECORD records; not rerun"
    grep "^$family matrix" "$RECORD" | sed "s/^$family //" > "$logs/matrix-record"
  elif [ "$mclean" = 1 ] && [ "${KERNEL_CHECKS:-recorded}" != always ] \
       && [ -f "$CACHE/matrix-$mkey/passed" ] && git merge-base --is-ancestor \
         "$(sed -n "s/^matrix-commit //p" "$CACHE/matrix-$mkey/record")" HEAD 2>/dev/null; then
    echo "kernel checks, $family: the version matrix passed for $mkey on" \
         "$(cat "$CACHE/matrix-$mkey/passed"); not rerun"
    cp "$CACHE/matrix-$mkey/record" "$logs/matrix-record"
  else
    echo "kernel checks, $family ($key): the version matrix ($mkey)"
    OUT="$logs/matrix" FAMILY=$family bash benchmarks/checks/version_matrix.sh
    { echo "matrix-key $mkey"; echo "matrix-commit $commit"
      grep -E 'torch [0-9.]+: torch|exit|passed|failed' "$logs/matrix/matrix.log" \
        | sed "s/^\[version_matrix [0-9:]*\] //; s/^/matrix /"; } > "$logs/matrix-record"
    if [ "$mclean" = 1 ]; then
      mkdir -p "$CACHE/matrix-$mkey"
      cp "$logs/matrix-record" "$CACHE/matrix-$mkey/record"
      date -u +"%F %T UTC, commit $(git rev-parse --short HEAD)" > "$CACHE/matrix-$mkey/passed"
    fi
  fi
  minutes=$(( (SECONDS - start + 30) / 60 ))
  {
    echo "$family key $key"
    echo "$family commit $commit"
    echo "$family date $(date -u +'%F %T UTC')"
    echo "$family versions $versions"
    echo "$family minutes $minutes on $(nproc) cores"
    echo "$family plain-interpreter $(tail -n 1 "$logs/plain.log")"
    echo "$family aot-compile $(grep -v '^\s*$' "$logs/compile.log" | tail -n 1)"
    sed "s/^/$family /" "$logs/matrix-record"
  } > "$logs/record"
  cat "$logs/record" >> "$new"
  if [ "$clean" = 1 ]; then
    mkdir -p "$CACHE/$key"
    cp -r "$logs"/. "$CACHE/$key"/
    date -u +"%F %T UTC, commit $(git rev-parse --short HEAD)" > "$CACHE/$key/passed"
  fi
  echo "kernel checks, $family: passed in $minutes minutes"
done
# The committed record: each family's pass, what ran, on which versions, and
# each check's last line. Written when the whole tree's inputs are
# committed; commit it (alone, or with changes outside the inputs).
mapfile -t all < <($PY -m benchmarks.checks.families inputs attention)
if git diff --quiet HEAD -- "${all[@]}" "${baselines[@]}"; then
  if ! cmp -s <(grep -v '^#' "$RECORD" 2>/dev/null) "$new"; then
    {
      echo "# Written by .ci/kernel_checks.sh after its checks passed on a clean tree;"
      echo "# commit it as it is (see that script for what it proves)."
      cat "$new"
    } > "$RECORD"
    echo "kernel checks: passed; $RECORD written (commit it)"
  fi
fi
rm -f "$new"
