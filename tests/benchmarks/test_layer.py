"""benchmarks.layer: the kernel breakdown beside the layer's timings."""
from types import SimpleNamespace

import torch

from benchmarks import layer


def _event(key, seconds, annotation=False, device="CUDA"):
    return SimpleNamespace(key=key, self_device_time_total=seconds * 1e6,
                           device_type=SimpleNamespace(name=device),
                           is_user_annotation=annotation)


def test_busy_time_counts_kernels_not_annotations(monkeypatch):
    # Two kernels and the optimizer's range around them on the device
    # timeline (and a CPU op): busy is the kernels' time only.
    events = [_event("_draw_kernel", 0.003), _event("gemm", 0.002),
              _event("Optimizer.step#Adam.step", 0.004, annotation=True),
              _event("aten::mm", 0.010, device="CPU")]

    class Profile:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *args):
            return False

        def key_averages(self):
            return events

    monkeypatch.setattr(layer, "profile", Profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    out = layer.cuda_kernels(lambda: None, calls=2)
    assert out == {"_draw_kernel": 0.0015, "gemm": 0.001, "all_kernels": 0.0025}
