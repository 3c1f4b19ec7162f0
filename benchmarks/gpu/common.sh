# Sourced by the GPU plans (gpu_run.sh, gpu_short.sh) with their command
# line: whether it asks for --tiny (the caller shifts it off), where they
# write ($OUT, runs/), how they run Python, and the machine's report.
tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" runs
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}

# The GPU, the driver and the package versions, on standard output.
machine_report() {
  command -v nvidia-smi > /dev/null && nvidia-smi
  $PY -c 'import torch, triton, torch_geometric, sys
print(sys.version); print("torch", torch.__version__, "triton", triton.__version__,
"pyg", torch_geometric.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'
}
