r"""The host syncs of ``SBMConv`` on a GPU, counted by CUDA itself:
``torch.cuda.set_sync_debug_mode("warn")`` warns at every synchronizing
call (a device-to-host copy, ``.item()``, ``nonzero``), and each warning
is kept with the innermost ``sbm_pyg`` frame that made it. Counted for the
forward and, apart, the backward of a calibrated layer (two sequences of
n / 2 tokens, given by a batch vector and its size), after a warm-up call.

    python -m benchmarks.gpu.syncs [--n 4096] [--density 0.01] [--out F]

On the CPU (no CUDA device) it says so and exits 1: the CPU's count of
reads is :func:`benchmarks.launches.count_reads`.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import torch


def _where() -> str:
    # The innermost sbm_pyg frame of the warning's stack; else the stack's
    # innermost frames outside the warnings machinery and this file, so
    # that a sync made outside sbm_pyg names the torch code that made it.
    stack = traceback.extract_stack()[:-2]
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "/sbm_pyg/" in path:
            return f"{path.split('/sbm_pyg/')[-1]}:{frame.name}:{frame.lineno}"
    frames = [f"{f.filename.split('/')[-1]}:{f.name}:{f.lineno}" for f in stack
              if not any(s in f.filename for s in ("warnings", "syncs.py"))]
    return " < ".join(reversed(frames[-4:])) or "other"


def count_syncs(fn: Callable[[], object]) -> Dict[str, int]:
    """The synchronizing CUDA calls of one call of ``fn``, by where in
    ``sbm_pyg`` they come from."""
    seen: Counter = Counter()
    show = warnings.showwarning

    def record(message, category, *args, **kwargs):
        if "synchroniz" in str(message):
            seen[_where()] += 1
        else:
            show(message, category, *args, **kwargs)

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
    return dict(seen)


def layer_syncs(n: int, density: float, device: torch.device) -> dict:
    """Syncs of a calibrated ``SBMConv``'s forward and backward."""
    from benchmarks.cases import calibrated_conv
    conv = calibrated_conv(64, density, device)
    x = torch.randn(n, 64, device=device, requires_grad=True)
    batch = torch.arange(2, device=device).repeat_interleave(n // 2)
    g = torch.Generator(device).manual_seed(0)
    held = {}

    def forward() -> None:
        held["out"] = conv(x, batch, generator=g, batch_size=2)

    def backward() -> None:
        held.pop("out").square().sum().backward()

    forward()
    backward()
    return dict(n=n, density=density, forward=count_syncs(forward),
                backward=count_syncs(backward))


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the CPU's reads are benchmarks.launches'")
        sys.exit(1)
    result = layer_syncs(args.n, args.density, torch.device("cuda"))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return result


if __name__ == "__main__":
    main()
