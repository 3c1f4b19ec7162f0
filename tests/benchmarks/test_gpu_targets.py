import json
from pathlib import Path

import pytest

from benchmarks.gpu.targets import TARGETS, collect, main

# A short plan's files from an H200 (docs/runs/gpu/gpu-h200-key-masses):
# their figures as docs/performance.md quotes them.
H200 = Path(__file__).parents[2] / "docs/runs/gpu/gpu-h200-key-masses"


def test_targets_from_an_h200_run():
    rows = {r["name"]: r for r in collect(H200)}
    assert list(rows) == list(TARGETS)
    ratio = {name: r["ms"] / r["baseline_ms"] for name, r in rows.items()
             if "baseline_ms" in r}
    assert ratio["sbmconv-16384-1pct"] == pytest.approx(1.91, abs=0.005)
    assert ratio["sbmconv-65536-deg64-bf16"] == pytest.approx(2.00, abs=0.005)
    assert ratio["lra-step-4096-1pct"] == pytest.approx(5.63, abs=0.005)
    # The GPU busy a third of the layer's call (9.0 of 25.7 ms).
    assert ratio["gpu-busy-sbmconv-16384-1pct"] == pytest.approx(0.35, abs=0.005)
    assert rows["gpu-busy-sbmconv-16384-1pct"]["baseline_ms"] == \
        rows["sbmconv-16384-1pct"]["ms"]
    for mode, rate in (("poisson", 1.77), ("exact", 1.45)):
        row = rows[f"sampler-65536-1pct-{mode}"]
        assert row["edges"] / row["ms"] / 1e6 == pytest.approx(rate, abs=0.005)
    assert all(r["command"].startswith("python -m benchmarks.cuda") for r in rows.values())


def test_missing_files_and_rows_are_named(tmp_path):
    rows = collect(tmp_path)
    assert all(r["ms"] is None for r in rows)
    assert rows[0]["missing"] == "no cuda-a.json"
    # A run of other sizes (--quick's) matches no named size, unless asked
    # to take any.
    (tmp_path / "cuda-a.json").write_text(json.dumps(dict(
        command="python -m benchmarks.cuda --quick",
        layer=[dict(n=256, autocast=None, sbmconv_time=0.002, mha_time=0.001,
                    cuda_kernels=dict(all_kernels=0.0005))],
        training=[], sampler=[dict(n=512, mode="poisson", edges=1000, time=0.001)])))
    rows = {r["name"]: r for r in collect(tmp_path)}
    assert rows["sbmconv-16384-1pct"]["missing"] == \
        "no layer row at n = 16384 in cuda-a.json"
    rows = {r["name"]: r for r in collect(tmp_path, any_size=True)}
    assert rows["sbmconv-16384-1pct"]["ms"] == pytest.approx(2.0)
    assert rows["gpu-busy-sbmconv-16384-1pct"]["ms"] == pytest.approx(0.5)
    assert rows["sampler-65536-1pct-poisson"]["edges"] == 1000
    assert rows["sampler-65536-1pct-exact"]["ms"] is None
    assert rows["lra-step-4096-1pct"]["missing"] == \
        "no training row at n = 4096 in cuda-a.json"
    out = tmp_path / "targets.json"
    main(["--dir", str(tmp_path), "--out", str(out), "--any-size"])
    assert json.loads(out.read_text())[0]["name"] == "sbmconv-16384-1pct"
