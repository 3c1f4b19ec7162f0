#!/usr/bin/env bash
# One call of at most eight minutes on a freshly started GPU machine that has
# its own Python, torch, triton, torch_geometric and pytest-xdist: the most
# valuable results first, each stage writing its files under $OUT as it
# ends, so that a call cut short keeps what it made. For a machine lent for
# about a quarter of an hour (its start costs minutes of that). The full
# suite, the long benchmarks and the training runs are a second, optional
# call: benchmarks/gpu/gpu_run.sh. Run from the repository root:
#
#   OUT=/tmp/gpu-out bash benchmarks/gpu/gpu_short.sh
#
# Seconds from the start, the mark by which each stage is cut:
#   0    the GPU, driver and package versions (stages.log); the build of
#        the CPU kernels starts beside, niced on 12 jobs (the test subset
#        compares with them)
#   150  profile.json: where the time of SBMConv (n = 16384, 1%) and of an
#        LRA training step (n = 4096) goes, kernel by kernel; the sampler's
#        key masses and maxima (one Triton pass) and the memberships'
#        products against what they replaced (n = 16384 and 65536)
#   180  the host syncs of SBMConv's forward and backward, counted by
#        CUDA's sync debug mode (into stages.log; not in --tiny: the CPU
#        counts its reads in benchmarks.launches)
#   270  cuda-a.json: SBMConv vs MultiheadAttention (n = 16384), the
#        training step (n = 4096), the sampler (n = 65536, 1%)
#   330  cuda-dense.json: the dense-regime kernel vs SDPA at n = 16384
#        (exact float32 products, bfloat16 products, bfloat16 with dropout)
#   380  cuda-degree.json: SBMConv vs MultiheadAttention under bfloat16
#        autocast at a constant expected degree of 64, n = 16384 and 65536
#   440  bench-b.json: SBMConv on the sparse and the dense kernels at
#        n = 8192 and 16384 (crossover); a sharp head at 5%, n = 4096 and
#        16384, in bfloat16 on the edge path, the tiled regime and "auto"
#        against SDPA, and the sharp SBMConv at n = 4096 (sharp)
#   480  the CUDA tests of the attention function and the kernels
#        (SBM_PYG_TEST_DEVICE=cuda)
#
# At the end, targets.json: the targets' rows (benchmarks.gpu.targets),
# each with its time, its baseline's and its command, collected from the
# files above (copy it to docs/runs/gpu/graph/targets.json).
#
# The device returns at most eight files of $OUT: the stages' output goes
# to one log, stages.log (a header a stage, the build's tail among them),
# beside short.log, the five JSON files and targets.json; a check at the
# end says when more were written.
#
# A stage with less than MIN_SECONDS (default 20) left before its mark is
# skipped with a line saying so, never run for a second; a stage cut at its
# mark says that too (exit 124). short.log has every stage's line.
#
#   bash benchmarks/gpu/gpu_short.sh --tiny
#
# runs the same stages on CPU tensors, the Triton kernels under their
# interpreter, at the benchmarks' --quick sizes, with marks far apart: what
# CI runs (through gpu_run.sh's `short` stage) so that no stage meets a GPU
# with a missing argument.
set -u
. "$(dirname "$0")/common.sh" "$@"
[ $tiny = 1 ] && shift
MIN_SECONDS=${MIN_SECONDS:-20}
if [ $tiny = 1 ]; then
  export TRITON_INTERPRET=1
  DEV=cpu QUICK=(--quick --repeats 1) SCALE=10
else
  DEV=cuda QUICK=() SCALE=1
fi
start=$SECONDS
log() { echo "[gpu_short $((SECONDS - start))s] $*" | tee -a "$OUT/short.log"; }
failed=0

# stage NAME MARK COMMAND...: runs COMMAND until MARK seconds from the start
# (times SCALE in --tiny), its output appended to $OUT/stages.log.
stage() {
  local name=$1 mark=$(( $2 * SCALE )); shift 2
  local s=$(( mark - (SECONDS - start) ))
  if [ "$s" -lt "$MIN_SECONDS" ]; then
    log "$name: skipped, ${s}s left before its mark at ${mark}s"
    failed=1
    return
  fi
  echo "=== $name ===" >> "$OUT/stages.log"
  timeout "$s" "$@" >> "$OUT/stages.log" 2>&1
  local rc=$?
  if [ $rc = 124 ]; then
    log "$name: cut at its mark (${s}s)"
  else
    log "$name: exit $rc"
  fi
  [ $rc = 0 ] || failed=1
}

echo "=== env ===" > "$OUT/stages.log"
machine_report >> "$OUT/stages.log" 2>&1
if [ $tiny = 0 ] && ! $PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  log "no CUDA device (torch.cuda.is_available() is False): nothing to measure"
  exit 1
fi

build=
if [ $tiny = 0 ]; then  # --tiny: the CPU kernels are built where CI runs it
  # Niced, on 12 of the 16 cores: the layer and the training step are
  # host-bound, and a build on every core shares the host with them.
  MAX_JOBS=12 timeout 300 nice -n 19 $PY setup.py build_ext --inplace > runs/build.log 2>&1 &
  build=$!
fi

# The sizes of the targets (--tiny: the benchmarks' --quick sizes).
sizes_a=(--layer-sizes 16384 --training-sizes 4096 --sampler-sizes 65536
         --sampler-densities 0.01)
sizes_dense=(--dense-sizes 16384) crossover=(--crossover-sizes 8192 16384)
sharp=(--sharp-cases 4096:0.05 16384:0.05 --sharp-dtype bfloat16)
sizes_degree=(--degree-sizes 16384 65536 --degree 64)
[ $tiny = 1 ] && sizes_a=() sizes_dense=() crossover=() sizes_degree=() \
  sharp=(--sharp-dtype bfloat16)
stage profile 150 $PY -m benchmarks.gpu.cuda_profile "${QUICK[@]}" \
  --sections layer training parts --out "$OUT/profile.json"
[ $tiny = 0 ] && stage syncs 180 $PY -m benchmarks.gpu.syncs --n 16384
stage bench-a 270 $PY -m benchmarks.cuda "${QUICK[@]}" --out "$OUT/cuda-a.json" \
  --sections layer training sampler "${sizes_a[@]}"
stage bench-dense 330 $PY -m benchmarks.cuda "${QUICK[@]}" \
  --out "$OUT/cuda-dense.json" --sections dense "${sizes_dense[@]}"
stage degree 380 $PY -m benchmarks.cuda "${QUICK[@]}" \
  --out "$OUT/cuda-degree.json" --sections degree "${sizes_degree[@]}"
stage bench-b 440 $PY -m benchmarks --device $DEV "${QUICK[@]}" \
  --sections crossover sharp "${crossover[@]}" "${sharp[@]}" --out "$OUT/bench-b.json"
if [ -n "$build" ]; then
  wait $build
  rc=$?
  log "build: exit $rc ($(tail -n 1 runs/build.log | cut -c1-120))"
  { echo "=== build (its last 40 lines) ==="; tail -n 40 runs/build.log; } >> "$OUT/stages.log"
  [ $rc = 0 ] || failed=1
fi
suite=(tests/nn/test_sbm_attention.py tests/ops/test_triton_attention.py
       tests/ops/test_triton_dense.py tests/sampling/test_fastrg_op.py)
workers=(-n 8)
[ $tiny = 1 ] && suite=(-k triton tests/ops/test_triton_dense.py) workers=()
stage suite 480 env SBM_PYG_TEST_DEVICE=$DEV $PY -m pytest -q -m "not host" \
  -p no:cacheprovider -rfE "${workers[@]}" "${suite[@]}"
# The targets' rows from the files above (no device work).
any=()
[ $tiny = 1 ] && any=(--any-size)
$PY -m benchmarks.gpu.targets --dir "$OUT" --out "$OUT/targets.json" "${any[@]}" \
  2>&1 | tee -a "$OUT/stages.log" || failed=1
files=$(find "$OUT" -type f | wc -l)
if [ "$files" -gt 8 ]; then
  log "$files files under $OUT: the device returns eight"
  failed=1
fi
log "done"
exit $failed
