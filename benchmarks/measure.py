r"""Measuring code shared by the benchmark suites: wall time with turns,
peak memory (CUDA allocator, or a fresh process's resident set on Linux CPU,
or the torch profiler), log-log slopes."""
from __future__ import annotations

import ctypes
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from sbm_pyg.experiments.runs import PeakMemory

MEMORY_BUDGET = 8 * 2**30

MEMORY = {"method": "subprocess"}  # main() sets "profiler" for --quick


def sync(device: torch.device) -> None:
    """Waits for the device's queued work (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_times(fns: Dict[str, Callable[[], object]], device: torch.device,
                 repeats: int, *, clock: str = "wall") -> Dict[str, float]:
    """Median seconds of each function, after one warm-up call each. The
    functions take turns, repeat by repeat, so that a slow phase of a shared
    machine hits all of them alike.

    ``clock="wall"``: the host's clock around each call, the device
    synchronized before and after (what a caller waits). ``clock="events"``:
    CUDA events around each call, synchronized once at the end (the device
    time, without the host's launch gaps between turns); the host's clock
    off CUDA."""
    if clock not in ("wall", "events"):
        raise ValueError(f"clock must be 'wall' or 'events', got {clock!r}")
    for fn in fns.values():
        fn()
    if clock == "events" and device.type == "cuda":
        return _event_times(fns, repeats, device)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _event_times(fns: Dict[str, Callable[[], object]], repeats: int,
                 device: torch.device) -> Dict[str, float]:
    sync(device)
    spans: Dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            spans[name].append((start, end))
    sync(device)
    return {name: statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3
            for name, pairs in spans.items()}


def median_time(fn: Callable[[], object], device: torch.device,
                repeats: int) -> float:
    """Median wall time of ``fn`` in seconds, after one warm-up call."""
    return median_times({"fn": fn}, device, repeats)["fn"]


def _profiler_peak(fn: Callable[[], object]) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def pin_mmap_threshold() -> None:
    """Pins glibc's mmap threshold at 64 KiB, so that tensors are mapped and
    unmapped and the resident set follows the live tensors. Call it first
    in the process that :func:`peak_rss` measures."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 2**10)  # M_MMAP_THRESHOLD


def peak_rss(fn: Callable[[], object]) -> int:
    """Peak resident set of one call of ``fn`` beyond the resident set
    before it (``VmHWM`` reset through ``/proc/self/clear_refs``, as the
    training runs measure it: :class:`sbm_pyg.experiments.runs.PeakMemory`);
    Linux."""
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    fn()
    got = peak.read()
    if got is None:
        raise OSError("peak_rss reads /proc/self/status and clear_refs (Linux)")
    return got


def cuda_peak(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Peak bytes the CUDA caching allocator holds during one call of ``fn``
    beyond what was allocated before it (call ``fn`` once first to warm up);
    None off CUDA."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def subprocess_peak(spec: dict) -> str:
    """Runs ``python -m benchmarks --memory-case SPEC`` in a fresh process and
    returns its last output line: in one long-lived process, heap
    fragmentation left by earlier cases made the same case read 166 or 346
    MiB."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--memory-case", json.dumps(spec)],
        capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent)
    return result.stdout.strip().splitlines()[-1]


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    lx, ly = [math.log(a) for a in x], [math.log(b) for b in y]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return (sum((a - mx) * (b - my) for a, b in zip(lx, ly))
            / sum((a - mx) ** 2 for a in lx))
