r"""The GPU targets of the layer, collected into one list from the files the
short GPU plan (``benchmarks/gpu/gpu_short.sh``) writes: each row names a
target, its time and its baseline's, both from one call, and the command
that measured them.

    python -m benchmarks.gpu.targets --dir $OUT --out $OUT/targets.json

Rows (times in ms):

* ``sbmconv-16384-1pct``: ``SBMConv`` fwd+bwd, n = 16384, 1%, float32,
  against ``nn.MultiheadAttention`` (``cuda-a.json``, section ``layer``);
* ``sbmconv-65536-deg64-bf16``: the same at a constant expected degree of
  64, n = 65536, under bfloat16 autocast, against ``MultiheadAttention``
  under the same autocast, which runs SDPA (``cuda-degree.json``);
* ``lra-step-4096-1pct``: one training step of the LRA model at n = 4096,
  its SBMs at 1%, against the same model with full attention
  (``cuda-a.json``, section ``training``);
* ``gpu-busy-sbmconv-16384-1pct``: the first row's kernel time (``ms``,
  the profiler's sum over its kernels) against its wall time
  (``baseline_ms``);
* ``sampler-65536-1pct-poisson`` / ``-exact``: the sampler alone at
  n = 65536, 1%, with its distinct edges (``edges``) and no baseline.

A target whose file or row is missing (a stage cut at its mark) is a row
with ``ms`` :obj:`None` and ``missing``, saying which. With ``--any-size``
(the plan's ``--tiny`` run, whose sizes are the benchmarks' ``--quick``
ones) each row takes the first case of its kind instead of the named
size: the collector is exercised, nothing is measured.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["collect", "TARGETS"]

# name: (file, section, the case's size, what selects the row beside it)
Selector = Callable[[dict], bool]
TARGETS: Dict[str, Tuple[str, str, int, Selector]] = {
    "sbmconv-16384-1pct": ("cuda-a.json", "layer", 16384,
                           lambda r: r.get("autocast") is None),
    "sbmconv-65536-deg64-bf16": ("cuda-degree.json", "degree", 65536,
                                 lambda r: r.get("autocast") == "bfloat16"),
    "lra-step-4096-1pct": ("cuda-a.json", "training", 4096,
                           lambda r: "sbm@0.01_time" in r),
    "gpu-busy-sbmconv-16384-1pct": ("cuda-a.json", "layer", 16384,
                                    lambda r: r.get("autocast") is None
                                    and "cuda_kernels" in r),
    "sampler-65536-1pct-poisson": ("cuda-a.json", "sampler", 65536,
                                   lambda r: r.get("mode") == "poisson"),
    "sampler-65536-1pct-exact": ("cuda-a.json", "sampler", 65536,
                                 lambda r: r.get("mode") == "exact"),
}


def _row(name: str, found: dict) -> dict:
    # The target's figures from its benchmark row.
    if name.startswith("sampler-"):
        return dict(edges=found["edges"], ms=found["time"] * 1e3)
    if name.startswith("lra-step"):
        return dict(ms=found["sbm@0.01_time"] * 1e3,
                    baseline_ms=found["full_time"] * 1e3)
    if name.startswith("gpu-busy"):
        return dict(ms=found["cuda_kernels"]["all_kernels"] * 1e3,
                    baseline_ms=found["sbmconv_time"] * 1e3)
    return dict(ms=found["sbmconv_time"] * 1e3,
                baseline_ms=found["mha_time"] * 1e3)


def collect(directory: Path, any_size: bool = False) -> List[dict]:
    """The rows of :data:`TARGETS` from the plan's files in
    :obj:`directory`, in that order (see the module's text)."""
    files: Dict[str, Optional[dict]] = {}
    rows = []
    for name, (file, section, n, select) in TARGETS.items():
        if file not in files:
            path = directory / file
            files[file] = json.loads(path.read_text()) if path.exists() else None
        data = files[file]
        if data is None:
            rows.append(dict(name=name, ms=None, missing=f"no {file}"))
            continue
        found = next((r for r in data.get(section, [])
                      if (any_size or r.get("n") == n) and select(r)), None)
        if found is None:
            rows.append(dict(name=name, ms=None,
                             missing=f"no {section} row at n = {n} in {file}"))
            continue
        rows.append(dict(name=name, **_row(name, found), command=data.get("command")))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, required=True,
                        help="the short plan's $OUT")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--any-size", action="store_true",
                        help="the first case of each kind (the --tiny run)")
    args = parser.parse_args(argv)
    rows = collect(args.dir, args.any_size)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        if row["ms"] is None:
            print(f"{row['name']}: missing ({row['missing']})")
        elif "baseline_ms" in row:
            print(f"{row['name']}: {row['ms']:.2f} ms against "
                  f"{row['baseline_ms']:.2f} ms ({row['ms'] / row['baseline_ms']:.2f}x)")
        else:
            print(f"{row['name']}: {row['ms']:.2f} ms, {row['edges']} edges "
                  f"({row['edges'] / row['ms'] / 1e6:.2f} G edges/s)")
    return rows


if __name__ == "__main__":
    main()
