#!/usr/bin/env bash
# The Triton kernels under the torch / Triton pairs users and the GPU image
# have, beside the development pin (torch 2.13, Triton 3.9) that make test
# uses: the GPU image's torch 2.11 with Triton 3.6, and the newest torch
# this machine's package index installs (2.14.1: /etc/xdg/pip caps it) with
# the Triton it requires (3.8). For each, on a copy of the tree with the
# extension built against that torch:
#
#   * the ahead-of-time compile (python -m benchmarks.checks.triton_compile): the
#     Triton tests under the interpreter with the compiled kernels' scalar
#     types (tests/triton_abi.py), then every launch compiled for sm_80
#     and sm_90 with that Triton; a kernel that does not compile, a dense
#     kernel asked for tensor cores without mma, an fp32 scalar in an fp64
#     kernel or a spill that this Triton's baseline
#     (benchmarks/checks/results-triton-compile-<triton>.json, written with
#     UPDATE=1) did not have fails; rows to $OUT/triton-compile-torchX.json.
#
# Not the plain interpreter (Python scalars handed to the kernels exact):
# no compiled kernel receives its scalars so, whichever Triton built it;
# the compile step's tests pass them as a compiled kernel gets them, and
# the development pin's plain run (.ci/kernel_checks.sh) stays. The plain
# run here took half of each version's tests (the records: 5.5-8.4
# minutes a version and family).
#
# The virtual environments are kept in $SBM_PYG_MATRIX (default
# ~/.cache/sbm_pyg/matrix; each about 4.7 GB, torch with its CUDA
# libraries, installed once), and the extension built against each torch
# in $MATRIX/builds, per sources. About 10 minutes a version on two cores
# (build 2-4 where the sources are new, the compile with its tests 5-7).
# FAMILY (sampler or attention; default all) checks one family's kernels
# alone (benchmarks/checks/families.py); with UPDATE=1 it rewrites that
# family's rows of the baseline and keeps the other's. Exits 1 if any step
# of any version failed.
#
#   OUT=/tmp/matrix [FAMILY=F] [UPDATE=1] bash benchmarks/checks/version_matrix.sh [torch==T,triton==R ...]
set -u
OUT=${OUT:-/tmp/version-matrix}
MATRIX=${SBM_PYG_MATRIX:-$HOME/.cache/sbm_pyg/matrix}
ROOT=$(pwd)
mkdir -p "$OUT" "$MATRIX"
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=("torch==2.11.0,triton==3.6.0" "torch==2.14.1")
FAMILY=${FAMILY:-all}
python3 -m benchmarks.checks.families tests "$FAMILY" > /dev/null \
  || { echo "FAMILY=$FAMILY: no such family" >&2; exit 2; }
failed=0
log() { echo "[version_matrix $(date +%T)] $*" | tee -a "$OUT/matrix.log"; }
check() { log "$1 exit $2"; [ "$2" = 0 ] || failed=1; }

for spec in "${specs[@]}"; do
  IFS=, read -r -a pins <<< "$spec"
  name=${pins[0]#torch==}
  venv="$MATRIX/torch$name"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, triton, torch_geometric, xdist' 2>/dev/null; then
    log "torch $name: installing ${pins[*]}"
    # Triton 3.6's interpreter needs numpy < 2.4 (np.uint64 shifts).
    python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q "${pins[@]}" \
      "numpy<2.4" "setuptools>=77" wheel pytest pytest-xdist hypothesis networkx \
      "torch_geometric>=2.5" \
      > "$OUT/install-torch$name.log" 2>&1
    check "torch $name install" $?
  fi
  PY="$venv/bin/python"
  log "torch $name: $($PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
  # A copy of the tree (tracked and untracked files, no build outputs), so
  # that the extension built against this torch stays out of the checkout.
  work=$(mktemp -d)
  git ls-files -z --cached --others --exclude-standard | \
    (cd "$ROOT" && xargs -0 cp --parents -t "$work" 2>/dev/null)
  # The extension built once per torch and sources (the working tree's
  # bytes, committed or not), kept in $MATRIX/builds: the same sources and
  # torch build the same library, and the build costs 2-4 minutes.
  built="$MATRIX/builds/torch$name-$(cd "$ROOT" && find csrc setup.py pyproject.toml -type f \
           | sort | xargs sha256sum | sha256sum | cut -c1-16)"
  if ls "$built"/*.so > /dev/null 2>&1; then
    cp "$built"/*.so "$work/sbm_pyg/"
    log "torch $name build: the library built from these sources, $built"
    check "torch $name build" 0
  else
    (cd "$work" && MAX_JOBS=2 $PY setup.py build_ext --inplace > "$OUT/build-torch$name.log" 2>&1)
    status=$?
    check "torch $name build" $status
    [ "$status" = 0 ] && mkdir -p "$built" && cp "$work"/sbm_pyg/*.so "$built/"
  fi
  # Judged by this Triton's own baseline (where it spills), which
  # UPDATE=1 writes into the checkout.
  triton=$($PY -c 'import triton; print(triton.__version__)')
  base="$ROOT/benchmarks/checks/results-triton-compile-$triton.json"
  if [ "${UPDATE:-0}" = 1 ]; then
    # FAMILY's rows rewritten, the other family's kept.
    opts=(--update --family "$FAMILY" --baseline "$base" --out "$base")
  else
    opts=(--family "$FAMILY" --baseline "$base" --baseline-only
          --out "$OUT/triton-compile-torch$name.json")
    [ -f "$base" ] || { log "no baseline $base (UPDATE=1 writes it)"; failed=1; }
  fi
  (cd "$work" && $PY -m benchmarks.checks.triton_compile "${opts[@]}" \
     > "$OUT/compile-torch$name.log" 2>&1)
  check "torch $name compile" $?
  tail -n 5 "$OUT/compile-torch$name.log" | tee -a "$OUT/matrix.log"
  rm -rf "$work"
done
exit $failed
