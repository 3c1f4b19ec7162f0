"""One call of the calibrated layer (n = 4096, 5%) by default and with
capacity="auto", each under torch.profiler after two warm-up calls: self
CPU ms by operator, the fifteen that differ most.

    PYTHONPATH=. python docs/runs/cpu/static-layer-cpp/profile_static.py
"""
import copy

import torch

from benchmarks.cases import calibrated_conv


def self_ms(layer, x):
    for _ in range(2):
        layer.zero_grad()
        layer(x).sum().backward()
    with torch.profiler.profile() as prof:
        layer.zero_grad()
        layer(x).sum().backward()
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}


def main():
    torch.set_num_threads(2)
    conv = calibrated_conv(64, 0.05, torch.device("cpu"))
    static = copy.deepcopy(conv)
    static.capacity = "auto"
    x = torch.randn(4096, 64)
    a, b = self_ms(conv, x), self_ms(static, x)
    print("default total", round(sum(a.values())), "static total", round(sum(b.values())))
    for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:15]:
        print(f"{a.get(k, 0):8.1f} {b.get(k, 0):8.1f} {k}")


if __name__ == "__main__":
    main()
