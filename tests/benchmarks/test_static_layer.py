import json

import torch

from benchmarks import static_layer


def test_the_routes_are_timed_and_counted(tmp_path, monkeypatch):
    # aot_eager: the same one graph without inductor's code generation,
    # which takes a minute on two cores.
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kw: compile_(
        module, **dict(kw, backend="aot_eager")))
    out = tmp_path / "static.json"
    rows = static_layer.main(["--sizes", "256", "--densities", "0.1",
                              "--repeats", "1", "--out", str(out)])
    (row,) = rows
    assert not row["overflow"] and row["capacity"] >= row["expected_draws"]
    assert row["static_ops"]["host_reads"] == 0 < row["default_ops"]["host_reads"]
    for name in ("default", "static", "compiled", "mha"):
        assert row[f"{name}_time"] > 0
    saved = json.loads(out.read_text())
    assert saved["rows"] == rows
    assert saved["command"].startswith("python -m benchmarks.static_layer --sizes 256")
