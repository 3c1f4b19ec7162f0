"""The calibrated layer (n = 4096, 5%) by default and with capacity="auto":
self CPU ms by operator, the mean of five profiled calls of each taken in
turns after two warm-up calls; the fifteen operators that differ most.

    PYTHONPATH=. python docs/runs/cpu/static-layer-inplace/profile_static.py
"""
import copy
from collections import defaultdict

import torch

from benchmarks.cases import calibrated_conv


def profiled(layer, x, into):
    with torch.profiler.profile() as prof:
        layer.zero_grad()
        layer(x).sum().backward()
    for e in prof.key_averages():
        into[e.key] += e.self_cpu_time_total / 1e3


def main(calls=5):
    torch.set_num_threads(2)
    conv = calibrated_conv(64, 0.05, torch.device("cpu"))
    static = copy.deepcopy(conv)
    static.capacity = "auto"
    x = torch.randn(4096, 64)
    for layer in (conv, static):
        for _ in range(2):
            layer.zero_grad()
            layer(x).sum().backward()
    a, b = defaultdict(float), defaultdict(float)
    for _ in range(calls):
        profiled(conv, x, a)
        profiled(static, x, b)
    a = {k: v / calls for k, v in a.items()}
    b = {k: v / calls for k, v in b.items()}
    print("default total", round(sum(a.values()), 1), "static total",
          round(sum(b.values()), 1), f"(ms a call, mean of {calls})")
    for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:15]:
        print(f"{a.get(k, 0):8.1f} {b.get(k, 0):8.1f} {k}")


if __name__ == "__main__":
    main()
