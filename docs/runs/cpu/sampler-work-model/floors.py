"""The machine's floors for the sampler's work model: compiles `floors.c`
(gcc -O2 -fopenmp) and runs it on the OpenMP threads asked for, writing its
figures with the machine's CPU model.

    OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-work-model/floors.py \
        --out docs/runs/cpu/sampler-work-model/floors.json

Run with nothing else on the machine.
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "floors"
        subprocess.run(["gcc", "-O2", "-fopenmp", "-o", str(exe), str(HERE / "floors.c")],
                       check=True)
        figures = json.loads(subprocess.run([str(exe)], check=True, capture_output=True,
                                            text=True).stdout)
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    result = dict(command="OMP_NUM_THREADS=2 python docs/runs/cpu/sampler-work-model/"
                  "floors.py --out " + str(args.out), cpu=model, cores=os.cpu_count(),
                  **figures)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
