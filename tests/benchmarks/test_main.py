"""Smoke test: the benchmark suite runs end to end at tiny sizes. Timings are
never asserted; only that every section produced well-formed results."""
import json

import pytest

from benchmarks.__main__ import main

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host


@pytest.mark.slow
def test_quick_benchmark_runs(tmp_path, capsys):
    out = tmp_path / "results.json"
    results = main(["--quick", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text())["quick"] is True
    for row in results["attention"]:
        assert row["edges"] > 0
        for method in ("sbm", "sdpa", "math", "pyg"):
            assert row[method]["time"] > 0 and row[method]["memory"] >= 0
    assert all("fastrg_poisson" in row for row in results["sampler"])
    assert len(results["scaling"]["points"]) >= 2
    assert all(row["sbmconv_time"] > 0 for row in results["layer"])
    for row in results["layer"]:
        # Each part is an operator's share: the sampler and the attention
        # ran, and the parts add up to the total.
        parts = row["breakdown"]
        assert parts["sampler"] > 0 and parts["attention_backward"] > 0
        assert parts["total"] == pytest.approx(
            sum(t for name, t in parts.items() if name != "total"))
    assert all(row["dense_time"] > 0 and row["sparse_time"] > 0
               for row in results["crossover"])
    assert [row["density"] for row in results["choice"]] == [0.05, 0.01]
    for row in results["training"]:
        assert {"sbm-sparse@0.2", "sbm@0.2"} <= set(row)
        assert row["sbm-sparse@0.2"]["attention"] in ("cpp", "triton", "torch")
    assert results["published"]["edges"] > 0
    assert results["published"]["published_edges"] > 0
    assert results["exact"]["exact"]["edges"] > 0
    assert all(row["bytes_per_edge"] > 0 for row in results["memory"])
    import torch_geometric.typing as pyg_typing
    if pyg_typing.WITH_TORCH_SCATTER and pyg_typing.WITH_TORCH_SPARSE:
        assert all(row[op]["ratio"] > 0 for row in results["ext"]["rows"]
                   for op in ("segment_max", "segment_sum", "spmm"))
    else:
        assert "skipped" in results["ext"]
    assert [(row["n"], row["sbm_init"]) for row in results["budget"]] == [
        (16, "paper"), (16, "dense")]
    assert all(row["lam_ms"] > 0 and row["budget_ms"] > 0 for row in results["budget"])
    assert [(row["n"], row["variant"], row["status"]) for row in results["gps"]] == [
        (256, "performer", "ok"), (256, "sbm", "ok")]
    assert all(row["step_s"] > 0 for row in results["gps"])
    assert [(row["n"], row["clusters"]) for row in results["sharp"]] == [(256, 16), (256, 4)]
    assert all(row["ratio"] > 0 for row in results["sharp"])
    assert results["sharp_conv"]["auto_ratio"] > 0
    assert results["widths"]["n"] == 256 and results["widths"]["times"][0] > 0
    assert "[layer]" in capsys.readouterr().out


def test_gps_section_is_cpu_only():
    with pytest.raises(SystemExit):
        main(["--device", "meta", "--sections", "gps"])


def test_cuda_suite_is_a_section_on_a_gpu_only(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["--sections", "cuda", "--out", str(tmp_path / "r.json")])
    assert "the CUDA suite runs on a GPU" in capsys.readouterr().err
    # On a GPU the section is the suite's own main, its results embedded.
    from benchmarks import __main__ as bench
    from benchmarks import cuda
    calls = []
    monkeypatch.setattr(cuda, "main", lambda argv: calls.append(argv) or {"ok": 1})
    out = tmp_path / "r.json"
    assert bench.run_cuda_suite(out, 3, True, print) == {"ok": 1}
    assert calls == [["--out", str(tmp_path / "r-suite.json"), "--repeats", "3",
                      "--quick"]]


def test_sharp_cases_and_dtype(tmp_path, capsys):
    # The GPU plan's sharp stage: its cases and dtype from the command line.
    out = tmp_path / "r.json"
    results = main(["--quick", "--repeats", "1", "--sections", "sharp",
                    "--sharp-cases", "128:0.2", "--sharp-dtype", "bfloat16",
                    "--out", str(out)])
    (row,) = results["sharp"]
    assert (row["n"], row["density"], row["dtype"]) == (128, 0.2, "bfloat16")
    with pytest.raises(SystemExit):
        main(["--sections", "sharp", "--sharp-cases", "128-0.2"])
    assert "--sharp-cases: N:RHO pairs" in capsys.readouterr().err
