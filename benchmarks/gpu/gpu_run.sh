#!/usr/bin/env bash
# One command for a GPU machine that has its own Python, torch, triton,
# torch_geometric and pytest-xdist: the stages named on the command line, in
# order (by default env build suite bench profile), each logged to $OUT
# (default /tmp/gpu-out). Run from the repository root:
#
#   bash benchmarks/gpu/gpu_run.sh
#
# Stages:
#   env      the GPU, driver and package versions
#   build    the compiled CPU kernels, in place (the tests compare with them)
#   suite    the CUDA test suite (SBM_PYG_TEST_DEVICE=cuda, -m "not host")
#   repeat   the paper's repeated-token task at N=256, seeds 0 1 2, side by
#            side on the one GPU, into runs/ (resumed from runs/ if there)
#   bench    python -m benchmarks.cuda -> $OUT/results-cuda.json (each
#            section written as it ends)
#   bench-suite  the benchmark suite, python -m benchmarks --device cuda
#            -> $OUT/results-suite-cuda.json
#   checks   python -m benchmarks.checks.gpu_checks (the sampler and the dense
#            mask against the CPU kernels at the model's sizes, the dense
#            kernel's precisions against SDPA) -> $OUT/gpu-checks.json, and
#            the sparse/dense crossover at n = 2048 and 8192 ->
#            $OUT/crossover.json (about 4 and 2 minutes)
#   profile  each Triton kernel under Nsight Compute (ncu) ->
#            $OUT/ncu-attention.log
#   listops  ListOps at the LRA length, SBM then full attention (or
#            LISTOPS_ATTENTION), each for
#            LISTOPS_SECONDS (default 120), into runs/
#   pack     runs/ -> $OUT/runs.tgz
#   short    benchmarks/gpu/gpu_short.sh (the eight-minute plan) -> $OUT/short/
#   static   the layer with static shapes (capacity), eager and compiled,
#            replayed as CUDA graphs (torch.compile's reduce-overhead) at
#            n = 16384, 1%, against MultiheadAttention: python -m
#            benchmarks.static_layer -> $OUT/static-layer.json (minutes of
#            compiling)
#
# SUITE_ARGS adds pytest arguments (e.g. a test selection); BENCH_ARGS adds
# benchmark arguments. Every stage runs under a time limit, so that the
# command ends with its logs written; a stage that fails does not stop the
# next, and the command exits 1 if any failed. Without a CUDA device the
# stages that need one are skipped, each with a line saying so, and the
# others run.
#
#   bash benchmarks/gpu/gpu_run.sh --tiny [stages]
#
# runs every stage on CPU tensors instead, the Triton kernels under their
# interpreter (TRITON_INTERPRET=1), at toy sizes: a Triton test subset, the
# benchmarks' --quick modes, the profile entry points without ncu, the
# repeat and ListOps runs at a few steps. Nothing is measured; what it
# proves is that no stage calls a kernel with a missing argument or names
# a backend the device does not have (CI runs it).
#
# The plan for a freshly started GPU machine with 40 minutes to give, one
# call at a time (each at most 9 minutes; the machine stays warm between
# back-to-back calls, so the build is done once; a released machine needs
# `build` first again, 1.5 minutes):
#
#   call 1  env build suite            ~8 min: build.log, suite.log
#   call 2  repeat wait-repeat checks  ~9 min: the repeat runs in runs/ (4
#                                      min), then alone gpu-checks.json and
#                                      crossover.json
#   call 3  bench                      ~7 min: results-cuda.json
#   call 4  bench-suite                ~7 min: results-suite-cuda.json
#   call 5  profile listops pack       ~7 min: profile-cuda.json,
#                                             ncu-attention.log, runs.tgz
#
# about 37 minutes with the machine's start. With about 15 minutes (a start
# costs minutes of them): benchmarks/gpu/gpu_short.sh, one call of at most
# eight minutes with the most valuable results first, then, if time is
# left, call 1 or call 2 of this plan.
set -u
. "$(dirname "$0")/common.sh" "$@"
[ $tiny = 1 ] && shift
log() { echo "[gpu_run $(date +%T)] $*" | tee -a "$OUT/gpu_run.log"; }

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env build suite bench bench-suite checks profile)
if [ $tiny = 1 ]; then
  export TRITON_INTERPRET=1
  DEV=cpu QUICK="--quick --repeats 1" gpu=1
  # The toy sizes of the training stages.
  REPEAT_TINY=(--seq-len 16 --steps 3 --batch-size 8 --checkpoint-every 2)
  LISTOPS_TINY=(--seq-len 64 --steps 2 --batch-size 4 --listops-sizes 16 8 8
                --listops-min-length 16 --eval-every 2 --eval-batches 1)
else
  DEV=cuda QUICK= REPEAT_TINY=() LISTOPS_TINY=()
  gpu=$($PY -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
fi
failed=0
check() {  # check NAME STATUS: log a stage's exit status, remember a failure
  log "$1 exit $2"; [ "$2" = 0 ] || failed=1
}
repeat_pids=()
for stage in "${stages[@]}"; do
  case $stage in
    suite|repeat|wait-repeat|bench|bench-suite|checks|profile|listops|short|static)
      if [ "$gpu" != 1 ]; then
        log "stage $stage: skipped, no CUDA device (torch.cuda.is_available() is False)"
        continue
      fi ;;
  esac
  log "stage $stage"
  case $stage in
    env)
      { machine_report; command -v ncu; } 2>&1 | tee -a "$OUT/gpu_run.log" ;;
    build)
      MAX_JOBS=16 timeout 300 $PY setup.py build_ext --inplace > runs/build.log 2>&1
      check build $?; tail -3 runs/build.log | tee -a "$OUT/gpu_run.log" ;;
    suite)
      if [ $tiny = 1 ]; then  # a Triton subset, interpreted, on one process
        suite=(-k triton tests/ops/test_triton_dense.py tests/ops/test_library.py)
      else
        suite=(-n 8 --timeout 240)
      fi
      SBM_PYG_TEST_DEVICE=$DEV timeout "${SUITE_SECONDS:-420}" $PY -m pytest -q \
        -m "not host" -p no:cacheprovider -rfE "${suite[@]}" \
        ${SUITE_ARGS:-} > "$OUT/suite.log" 2>&1
      check suite $?; { grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | cut -c1-200
      tail -2 "$OUT/suite.log"; } | tee -a "$OUT/gpu_run.log" ;;
    repeat)
      for s in 0 1 2; do
        d=runs/repeat256-$DEV-s$s
        [ $tiny = 1 ] && d=runs/tiny-repeat-s$s
        r=(); [ -f "$d/checkpoint.pt" ] && r=(--resume)
        timeout "${REPEAT_SECONDS:-540}" $PY -m sbm_pyg train --preset repeat-paper \
          --device $DEV --seed $s --out "$d" --no-progress "${r[@]}" \
          "${REPEAT_TINY[@]}" > "runs/repeat-s$s.log" 2>&1 &
        repeat_pids+=($!)
      done ;;
    wait-repeat)
      for p in "${repeat_pids[@]}"; do wait "$p"; check "repeat run" $?; done
      tail -n 3 runs/repeat-s*.log | tee -a "$OUT/gpu_run.log" ;;
    bench)
      timeout "${BENCH_SECONDS:-420}" $PY -m benchmarks.cuda $QUICK \
        --out "$OUT/results-cuda.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
      check bench ${PIPESTATUS[0]} ;;
    bench-suite)
      sections=()  # --tiny: the sections a GPU run times, not the CPU-only ones
      [ $tiny = 1 ] && sections=(--sections attention sampler layer crossover training)
      timeout "${BENCH_SECONDS:-420}" $PY -m benchmarks --device $DEV $QUICK \
        "${sections[@]}" --out "$OUT/results-suite-cuda.json" 2>&1 \
        | tee "$OUT/bench-suite.log"
      check "bench suite" ${PIPESTATUS[0]} ;;
    checks)
      # The CUDA kernels against the CPU kernels at the model's sizes, the
      # dense kernel's precisions against SDPA, and the crossover.
      sizes=(); [ $tiny = 1 ] || sizes=(--dense-sizes 4096 16384)
      timeout "${CHECKS_SECONDS:-240}" $PY -m benchmarks.checks.gpu_checks $QUICK \
        "${sizes[@]}" --out "$OUT/gpu-checks.json" 2>&1 | tee "$OUT/gpu-checks.log"
      check checks ${PIPESTATUS[0]}
      sizes=(); [ $tiny = 1 ] || sizes=(--crossover-sizes 2048 8192)
      timeout "${CROSSOVER_SECONDS:-150}" $PY -m benchmarks --device $DEV $QUICK \
        --sections crossover "${sizes[@]}" --out "$OUT/crossover.json" 2>&1 \
        | tee "$OUT/crossover.log"
      check crossover ${PIPESTATUS[0]} ;;
    profile)
      timeout 300 $PY -m benchmarks.gpu.cuda_profile $QUICK --out "$OUT/profile-cuda.json" \
        > "$OUT/profile-cuda.log" 2>&1
      check "kernel profile" $?
      if [ $tiny = 1 ]; then  # the entry point ncu runs, without ncu
        $PY -m benchmarks.gpu.ncu_attention 64 2 32 0.05 float32 > "$OUT/ncu-attention.log" 2>&1
        check "profile entry point" $?
      elif command -v ncu > /dev/null; then
        timeout 300 ncu -k regex:_kernel --section SpeedOfLight --section MemoryWorkloadAnalysis \
          $PY -m benchmarks.gpu.ncu_attention > "$OUT/ncu-attention.log" 2>&1
        check profile $?
      else
        log "stage profile: skipped, ncu (Nsight Compute) not on PATH"
      fi ;;
    listops)
      for att in ${LISTOPS_ATTENTION:-sbm full}; do
        timeout -s INT "${LISTOPS_SECONDS:-120}" $PY -m sbm_pyg train \
          --preset listops-paper --attention $att --device $DEV \
          --eval-every 100 --log-every 10 --out runs/listops2000-$DEV-$att$([ $tiny = 1 ] && echo -tiny) \
          --data-dir runs/data --no-progress "${LISTOPS_TINY[@]}" \
          > "runs/listops-$att.log" 2>&1
        status=$?
        # A run cut at its time limit (timeout: 124) is the plan, not a failure.
        [ $status = 124 ] && status=0
        check "listops $att" $status
        tail -n 2 "runs/listops-$att.log" | tee -a "$OUT/gpu_run.log"
      done ;;
    short)
      t=(); [ $tiny = 1 ] && t=(--tiny)
      OUT="$OUT/short" PY=$PY bash benchmarks/gpu/gpu_short.sh "${t[@]}"
      check short $? ;;
    static)
      args=(--sizes 16384 --densities 0.01 --compile-mode reduce-overhead)
      [ $tiny = 1 ] && args=(--sizes 256 --densities 0.1 --repeats 1)
      timeout "${STATIC_SECONDS:-420}" $PY -m benchmarks.static_layer --device $DEV \
        "${args[@]}" --out "$OUT/static-layer.json" 2>&1 | tee "$OUT/static-layer.log"
      check "static layer" ${PIPESTATUS[0]} ;;
    pack)
      tar czf "$OUT/runs.tgz" runs; ls -la "$OUT" ;;
    *) log "unknown stage $stage"; exit 2 ;;
  esac
done
exit $failed
