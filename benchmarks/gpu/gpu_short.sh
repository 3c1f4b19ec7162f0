#!/usr/bin/env bash
# One call of at most ten minutes on a freshly started GPU machine that has
# its own Python, torch, triton, torch_geometric and pytest-xdist (for a
# machine held about a quarter of an hour; benchmarks/gpu/gpu_run.sh has the
# long stages):
# first the extension's build, the CUDA suite and the repeat task's three
# seeds side by side (correctness and training: nothing there is timed),
# then the benchmarks alone on the GPU. Run from the repository root:
#
#   OUT=/tmp/gpu-out bash benchmarks/gpu/gpu_short.sh
#
# Seconds from the start (each stage is cut at its limit, and what it wrote
# stays in $OUT, at most 8 files):
#   0    env.log: GPU, driver, package versions
#   0    build (background, ~90 s), repeat runs N = 256, seeds 0 1 2 (to 250 s)
#   ~90  suite.log: SBM_PYG_TEST_DEVICE=cuda pytest -m "not host" -n 8 (to 250 s)
#   250  bench.log, cuda-a.json: sampler (1% and 5%, both modes), the
#        dense-regime kernel vs SDPA, SBMConv vs MultiheadAttention, a
#        training step (150 s)
#   400  cuda-b.json: sparse attention vs SDPA, FlexAttention, PyG (90 s)
#   490  crossover.json: SBMConv on the sparse and the dense kernels (60 s)
#   550  runs.tgz: the repeat runs, their logs and the build log
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" runs
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
start=$SECONDS
left() { local s=$(( $1 - (SECONDS - start) )); echo $(( s > 1 ? s : 1 )); }  # seconds until mark $1 (at least 1)
log() { echo "[gpu_short $((SECONDS - start))s] $*" | tee -a "$OUT/bench.log"; }

{ nvidia-smi; $PY -c 'import torch, triton, torch_geometric, sys
print(sys.version); print("torch", torch.__version__, "triton", triton.__version__,
"pyg", torch_geometric.__version__, "cuda", torch.version.cuda)
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'; } \
  > "$OUT/env.log" 2>&1

MAX_JOBS=16 $PY setup.py build_ext --inplace > runs/build.log 2>&1 &
build=$!
repeats=()
for s in 0 1 2; do
  OMP_NUM_THREADS=1 timeout -s INT "$(left 250)" $PY -m sbm_pyg train \
    --preset repeat-paper --device cuda --seed $s --out runs/repeat256-cuda-s$s \
    --no-progress > runs/repeat-s$s.log 2>&1 &
  repeats+=($!)
done
wait $build; log "build exit $?"
SBM_PYG_TEST_DEVICE=cuda timeout "$(left 250)" $PY -m pytest -q -m "not host" \
  -n 8 -p no:cacheprovider --timeout 120 -rfE > "$OUT/suite.log" 2>&1
log "suite exit $? ($(tail -1 "$OUT/suite.log"))"
for p in "${repeats[@]}"; do wait "$p"; log "repeat run exit $?"; done

timeout "$(left 400)" $PY -m benchmarks.cuda --out "$OUT/cuda-a.json" \
  --sections sampler dense layer training --sampler-sizes 4096 16384 65536 \
  --sampler-densities 0.01 0.05 --dense-sizes 4096 16384 --layer-sizes 16384 \
  --training-sizes 4096 >> "$OUT/bench.log" 2>&1
log "bench a exit $?"
timeout "$(left 490)" $PY -m benchmarks.cuda --out "$OUT/cuda-b.json" \
  --sections attention --cases 16384:2:32:bfloat16 16384:2:32:float32 \
  65536:2:32:bfloat16 --densities 0.01 0.05 0.2 0.5 1.0 --flex-max-n 16384 \
  >> "$OUT/bench.log" 2>&1
log "bench b exit $?"
timeout "$(left 550)" $PY -m benchmarks --device cuda --sections crossover \
  --out "$OUT/crossover.json" >> "$OUT/bench.log" 2>&1
log "crossover exit $?"
tar czf "$OUT/runs.tgz" runs
log "done"
