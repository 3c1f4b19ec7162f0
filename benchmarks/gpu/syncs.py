r"""The host syncs of ``SBMConv`` on a GPU, counted by CUDA itself:
``torch.cuda.set_sync_debug_mode("warn")`` warns at every synchronizing
call (a device-to-host copy, ``.item()``, ``nonzero``), and each warning
is kept with the innermost ``sbm_pyg`` frame that made it. Counted for the
forward and, apart, the backward of a calibrated layer (two sequences of
n / 2 tokens, given by a batch vector and its size), after a warm-up call,
and of ``sbm_attention`` over a batch of both regimes (``mixed``);
and, in CUDA's "error" mode with the explicit reads let through, where
the first other sync of each comes from (``hidden``: a warning CUDA
reports late names a later call, an error names the one that synced).

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
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence

import torch

from benchmarks.launches import READS


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


@contextmanager
def _explicit_reads_let_through() -> Iterator[None]:
    # The reads the CPU's count names (item, tolist, int(...)) sync as they
    # must, wherever they are (inside a custom operator's kernel too: a
    # torch function mode would not see those), by patching the methods.
    def let_through(read: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("default")
            try:
                return read(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error")
        return wrapped

    names = [read.__name__ for read in READS]
    for read, name in zip(READS, names):
        setattr(torch.Tensor, name, let_through(read))
    try:
        yield
    finally:
        for name in names:  # inherited from the C base class
            delattr(torch.Tensor, name)


def hidden_sync(fn: Callable[[], object]) -> Optional[str]:
    """Where the first sync of one call of ``fn`` that no explicit read
    makes comes from (the innermost frames of its Python stack), or
    :obj:`None`: CUDA's "error" mode raises at the synchronizing call, so
    a sync whose warning CUDA reports late is found where it is made."""
    torch.cuda.synchronize()
    try:
        with _explicit_reads_let_through():
            torch.cuda.set_sync_debug_mode("error")
            fn()
    except RuntimeError as err:
        if "synchroniz" not in str(err):
            raise
        frames = traceback.extract_tb(err.__traceback__)
        return " < ".join(f"{f.filename.split('/')[-1]}:{f.name}:{f.lineno}"
                          for f in reversed(frames[-6:]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


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
    counts = dict(forward=count_syncs(forward), backward=count_syncs(backward))
    forward()
    return dict(n=n, density=density, **counts,
                hidden=dict(backward=hidden_sync(backward),
                            forward=hidden_sync(forward)))


def mixed_syncs(n: int, device: torch.device) -> dict:
    """Syncs of ``sbm_attention``'s forward and backward over a batch of both
    regimes (:func:`benchmarks.launches.mixed_batch`)."""
    from benchmarks.launches import mixed_batch
    forward, backward = mixed_batch(n, device)
    backward(forward())
    held = {}
    counts = dict(forward=count_syncs(lambda: held.update(out=forward())),
                  backward=count_syncs(lambda: backward(held.pop("out"))))
    return dict(n=n, **counts)


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
    result["mixed"] = mixed_syncs(args.n, torch.device("cuda"))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return result


if __name__ == "__main__":
    main()
