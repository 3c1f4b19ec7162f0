"""benchmarks.layer: the kernel breakdown beside the layer's timings."""
from types import SimpleNamespace

import pytest
import torch

from benchmarks import layer
from benchmarks.cases import calibrated_conv
from benchmarks.layer import bench_choice


def _event(key, seconds, annotation=False, device="CUDA", count=1):
    return SimpleNamespace(key=key, self_device_time_total=seconds * 1e6,
                           device_type=SimpleNamespace(name=device),
                           is_user_annotation=annotation, count=count)


def test_busy_time_counts_kernels_not_annotations(monkeypatch):
    # Two kernels and the optimizer's range around them on the device
    # timeline (and a CPU op): busy is the kernels' time only.
    events = [_event("_draw_kernel", 0.003, count=4), _event("gemm", 0.002, count=6),
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
    # Launches a call: (4 + 6) kernels over 2 calls; the range not one.
    assert out == {"_draw_kernel": 0.0015, "gemm": 0.001, "all_kernels": 0.0025,
                   "launches": 5.0}
    assert layer.format_breakdown(out) == \
        " draw kernel 1.5, gemm 1.0, all kernels 2.5 ms, 5 kernel launches"


@pytest.mark.slow
def test_the_choice_row_times_one_layer_both_ways():
    # "auto" and the sparse kernel named run the same calibrated layer (the
    # same weights), its regime named in the row; the overhead is the ratio.
    lines = []
    (row,) = bench_choice(128, [0.05], torch.device("cpu"), 1, lines.append)
    assert row["kernel"] in ("cpp", "torch", "triton")
    assert row["auto_backends"]["attention"] == row["kernel"]  # no dense, no tiles
    assert row["overhead"] == pytest.approx(row["auto_time"] / row["named_time"] - 1)
    assert len(lines) == 2
    a = calibrated_conv(64, 0.05, torch.device("cpu"), steps=3)
    b = calibrated_conv(64, 0.05, torch.device("cpu"), steps=3,
                        attention_backend=row["kernel"])
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
