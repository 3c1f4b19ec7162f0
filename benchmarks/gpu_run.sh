#!/usr/bin/env bash
# One command for a GPU machine that has its own Python, torch, triton,
# torch_geometric and pytest-xdist: the stages named on the command line, in
# order (by default env build suite bench profile), each logged to $OUT
# (default /tmp/gpu-out). Run from the repository root:
#
#   bash benchmarks/gpu_run.sh
#
# Stages:
#   env      the GPU, driver and package versions
#   build    the compiled CPU kernels, in place (the tests compare with them)
#   suite    the CUDA test suite (SBM_PYG_TEST_DEVICE=cuda, -m "not host")
#   repeat   the paper's repeated-token task at N=256, seeds 0 1 2, side by
#            side on the one GPU, into runs/ (resumed from runs/ if there)
#   bench    python -m benchmarks.cuda -> $OUT/results-cuda.json, and the
#            benchmark suite, python -m benchmarks --device cuda ->
#            $OUT/results-suite-cuda.json
#   profile  each Triton kernel under Nsight Compute (ncu) ->
#            $OUT/ncu-attention.log
#   listops  ListOps at the LRA length, SBM then full attention (or
#            LISTOPS_ATTENTION), each for
#            LISTOPS_SECONDS (default 120), into runs/
#   pack     runs/ -> $OUT/runs.tgz
#
# SUITE_ARGS adds pytest arguments (e.g. a test selection); BENCH_ARGS adds
# benchmark arguments. Every stage runs under a time limit, so that the
# command ends with its logs written. Without a CUDA device the stages that
# need one are skipped, each with a line saying so, and the others run.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" runs
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
log() { echo "[gpu_run $(date +%T)] $*" | tee -a "$OUT/gpu_run.log"; }

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env build suite bench profile)
gpu=$($PY -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
repeat_pids=()
for stage in "${stages[@]}"; do
  case $stage in
    suite|repeat|wait-repeat|bench|profile|listops)
      if [ "$gpu" != 1 ]; then
        log "stage $stage: skipped, no CUDA device (torch.cuda.is_available() is False)"
        continue
      fi ;;
  esac
  log "stage $stage"
  case $stage in
    env)
      { command -v nvidia-smi > /dev/null && nvidia-smi
        $PY -c 'import torch, triton, torch_geometric, sys
print(sys.version); print("torch", torch.__version__, "triton", triton.__version__,
"pyg", torch_geometric.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'
        command -v ncu; } 2>&1 | tee -a "$OUT/gpu_run.log" ;;
    build)
      MAX_JOBS=16 timeout 300 $PY setup.py build_ext --inplace > runs/build.log 2>&1
      log "build exit $?"; tail -3 runs/build.log | tee -a "$OUT/gpu_run.log" ;;
    suite)
      SBM_PYG_TEST_DEVICE=cuda timeout "${SUITE_SECONDS:-420}" $PY -m pytest -q \
        -m "not host" -n 8 -p no:cacheprovider --timeout 240 -rfE \
        ${SUITE_ARGS:-} > "$OUT/suite.log" 2>&1
      log "suite exit $?"; { grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | cut -c1-200
      tail -2 "$OUT/suite.log"; } | tee -a "$OUT/gpu_run.log" ;;
    repeat)
      for s in 0 1 2; do
        d=runs/repeat256-cuda-s$s
        r=(); [ -f "$d/checkpoint.pt" ] && r=(--resume)
        timeout "${REPEAT_SECONDS:-540}" $PY -m sbm_pyg train --preset repeat-paper \
          --device cuda --seed $s --out "$d" --no-progress "${r[@]}" \
          > "runs/repeat-s$s.log" 2>&1 &
        repeat_pids+=($!)
      done ;;
    wait-repeat)
      for p in "${repeat_pids[@]}"; do wait "$p"; log "repeat run exit $?"; done
      tail -n 3 runs/repeat-s*.log | tee -a "$OUT/gpu_run.log" ;;
    bench)
      timeout "${BENCH_SECONDS:-420}" $PY -m benchmarks.cuda \
        --out "$OUT/results-cuda.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
      log "bench exit ${PIPESTATUS[0]}"
      timeout "${BENCH_SECONDS:-420}" $PY -m benchmarks --device cuda \
        --out "$OUT/results-suite-cuda.json" 2>&1 | tee "$OUT/bench-suite.log"
      log "bench suite exit ${PIPESTATUS[0]}" ;;
    profile)
      if command -v ncu > /dev/null; then
        timeout 300 ncu -k regex:_kernel --section SpeedOfLight --section MemoryWorkloadAnalysis \
          $PY -m benchmarks.ncu_attention > "$OUT/ncu-attention.log" 2>&1
        log "profile exit $?"
      else
        log "stage profile: skipped, ncu (Nsight Compute) not on PATH"
      fi ;;
    listops)
      for att in ${LISTOPS_ATTENTION:-sbm full}; do
        timeout -s INT "${LISTOPS_SECONDS:-120}" $PY -m sbm_pyg train \
          --preset listops-paper --attention $att --device cuda \
          --eval-every 100 --log-every 10 --out runs/listops2000-cuda-$att \
          --data-dir runs/data --no-progress > "runs/listops-$att.log" 2>&1
        log "listops $att exit $?"; tail -n 2 "runs/listops-$att.log" | tee -a "$OUT/gpu_run.log"
      done ;;
    pack)
      tar czf "$OUT/runs.tgz" runs; ls -la "$OUT" ;;
    *) log "unknown stage $stage"; exit 2 ;;
  esac
done
