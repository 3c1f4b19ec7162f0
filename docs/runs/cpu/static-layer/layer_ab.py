"""The default route's cost before and after the static route was added:
the layer benchmark's rows at n = 4096 (5% and 1%) run by the code of two
commits in alternating processes, so that the machine's drift reads as
neither's cost.

    python layer_ab.py OLD_TREE NEW_TREE [ROUNDS]

Each tree is a checkout with the compiled extension in place (the C++
sources are the same in both); each process prints one JSON line.
"""
import json
import subprocess
import sys

CODE = """
import json, torch
torch.set_num_threads(2)
from benchmarks.layer import bench_layer
rows = [bench_layer(4096, d, torch.device('cpu'), 5, lambda *a: None) for d in (0.05, 0.01)]
print(json.dumps([dict(density=d, sbmconv_ms=r['sbmconv_time'] * 1e3, mha_ms=r['mha_time'] * 1e3,
                       ratio=r['ratio']) for d, r in zip((0.05, 0.01), rows)]))
"""


def main() -> None:
    old, new = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    for r in range(rounds):
        for name, tree in (("before", old), ("after", new)):
            out = subprocess.run([sys.executable, "-c", CODE], cwd=tree, check=True,
                                 capture_output=True, text=True,
                                 env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"})
            rows = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(dict(round=r, code=name, rows=rows)), flush=True)


if __name__ == "__main__":
    main()
