import json

import pytest
import torch

from sbm_pyg.__main__ import main
from sbm_pyg.datasets import sbm_benchmark
from sbm_pyg.experiments.gps import GPS_PRESETS

# Host-side tools (the GPS CLI and the CPU benchmark): on the CPU whatever
# SBM_PYG_TEST_DEVICE says.
pytestmark = [pytest.mark.host, pytest.mark.slow]


@pytest.fixture
def small_recipes(monkeypatch):
    # The recipes with few graphs, so that a run takes seconds.
    monkeypatch.setitem(sbm_benchmark.RECIPES, "CLUSTER", dict(
        sbm_benchmark.RECIPES["CLUSTER"], graphs=dict(train=24, val=12, test=12)))
    monkeypatch.setitem(sbm_benchmark.RECIPES, "PATTERN", dict(
        sbm_benchmark.RECIPES["PATTERN"], patterns=3, graphs=dict(train=8, val=4, test=4)))


def _run(tmp_path, out, *extra, progress=False):
    return main(["gps", "--dataset", "CLUSTER", "--channels", "16", "--num-layers", "2",
                 "--heads", "2", "--pe-channels", "4", "--num-clusters", "4",
                 "--batch-size", "8", "--root", str(tmp_path / "data"),
                 "--out", str(out), *([] if progress else ["--no-progress"]), *extra])


@pytest.mark.parametrize("attention", ["none", "multihead", "performer", "sbm"])
def test_cli_trains_and_reports_the_best_validation_epoch(tmp_path, small_recipes,
                                                          attention, capsys):
    out = tmp_path / "run"
    assert _run(tmp_path, out, "--attention", attention, "--epochs", "3") == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    for r in records:
        assert 0 <= r["val_metric"] <= 1 and r["seconds"] > 0
        assert r["peak_memory_bytes"] is None or r["peak_memory_bytes"] >= 0
        assert ("val_density_per_layer_head" in r) == (attention == "sbm")
    final = json.loads((out / "final.json").read_text())
    best = max(records, key=lambda r: r["val_metric"])
    assert final["best_epoch"] == best["epoch"] and final["val_metric"] == best["val_metric"]
    assert final["epochs"] == 3 and final["attention"] == attention
    assert 0 <= final["test_accuracy"] <= 1
    assert ("density" in final) == (attention == "sbm")
    if attention == "sbm":
        assert len(final["density_per_layer_head"]) == 2
    printed = json.loads(capsys.readouterr().out)
    assert printed["test_accuracy"] == final["test_accuracy"]


def test_small_runs_take_part_of_each_split(tmp_path, small_recipes, capsys):
    # --train-graphs, --val-graphs, --test-graphs: evenly spaced subsets of
    # the splits (24, 12, 12 graphs here), as final.json reports, made in
    # memory: nothing is generated into --root for them.
    from argparse import Namespace
    from pathlib import Path

    from sbm_pyg.datasets import SBMBenchmarkDataset
    from sbm_pyg.experiments.gps import _datasets
    out = tmp_path / "run"
    assert _run(tmp_path, out, "--epochs", "1", "--train-graphs", "8",
                "--val-graphs", "5", "--test-graphs", "3") == 0
    final = json.loads((out / "final.json").read_text())
    assert final["graphs"] == dict(train=8, val=5, test=3)
    assert not (tmp_path / "data").exists()
    # The whole splits are cached; progress counts training batches.
    capsys.readouterr()
    assert _run(tmp_path, tmp_path / "all", "--epochs", "2", progress=True) == 0
    assert "6/6" in capsys.readouterr().err  # 2 epochs of 24 graphs / 8
    final = json.loads((tmp_path / "all" / "final.json").read_text())
    assert final["graphs"] == dict(train=24, val=12, test=12)
    # The subset's graphs are the cached split's, positional encoding and all.
    args = Namespace(**{**final["args"], "root": Path(tmp_path / "data"),
                        "val_graphs": 5})
    from sbm_pyg.nn import AddLaplacianPE
    whole = SBMBenchmarkDataset(str(tmp_path / "data" / "pe10"), "CLUSTER", "val",
                                pre_transform=AddLaplacianPE(10))
    part = _datasets(args)[1]
    assert len(part) == 5
    for graph, i in zip(part, [0, 2, 4, 7, 9]):  # 12 / 5 apart, rounded down
        for key in ("x", "edge_index", "y", "eigvecs", "eigvals"):
            torch.testing.assert_close(graph[key], whole[i][key], equal_nan=True)


def test_resume_continues_the_run_exactly(tmp_path, small_recipes):
    whole, split = tmp_path / "whole", tmp_path / "split"
    _run(tmp_path, whole, "--epochs", "3", "--attn-dropout", "0.5")
    _run(tmp_path, split, "--epochs", "2", "--attn-dropout", "0.5")
    _run(tmp_path, split, "--epochs", "3", "--resume")
    a = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (split / "metrics.jsonl").read_text().splitlines()]
    # Every epoch once, the resumed one included (zip alone would pass a
    # resume that ran no epoch).
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for key in ("train_loss", "val_metric", "val_density"):
            assert x[key] == y[key], key
    fa = json.loads((whole / "final.json").read_text())
    fb = json.loads((split / "final.json").read_text())
    assert fa["test_accuracy"] == fb["test_accuracy"]


def test_evaluation_is_the_same_at_every_call(tmp_path, small_recipes):
    # The attention is sampled from a fixed seed in evaluation: the best
    # model gives the logged validation metric again.
    from argparse import Namespace

    from sbm_pyg.experiments.gps import _datasets, build_gps_model, evaluate_gps
    out = tmp_path / "run"
    _run(tmp_path, out, "--epochs", "2")
    final = json.loads((out / "final.json").read_text())
    args = Namespace(**{**final["args"], "root": tmp_path / "data"})
    args.root = tmp_path / "data"
    from pathlib import Path
    args.root = Path(args.root)
    _, val, _ = _datasets(args)
    model = build_gps_model(args, 7, 6)
    model.load_state_dict(torch.load(out / "best.pt", weights_only=True)["model"])
    from torch_geometric.loader import DataLoader
    loader = DataLoader(val, batch_size=8)
    first = evaluate_gps(model, loader, torch.device("cpu"), 6, args.eval_seed)
    second = evaluate_gps(model, loader, torch.device("cpu"), 6, args.eval_seed)
    assert first == second
    assert first["metric"] == final["val_metric"]


def test_presets_hold_the_published_configuration():
    pattern, cluster = GPS_PRESETS["graphgps-pattern"], GPS_PRESETS["graphgps-cluster"]
    assert (pattern["num_layers"], pattern["channels"], pattern["heads"],
            pattern["batch_size"], pattern["pe_k"]) == (6, 64, 4, 32, 16)
    assert (cluster["num_layers"], cluster["channels"], cluster["heads"],
            cluster["batch_size"], cluster["dropout"], cluster["pe_k"]) == (16, 48, 8, 16, 0.1, 10)
    for preset in (pattern, cluster):
        assert (preset["lr"], preset["weight_decay"], preset["clip_grad_norm"],
                preset["epochs"], preset["warmup_epochs"], preset["attn_dropout"]) == (
            5e-4, 1e-5, 1.0, 100, 5, 0.5)


@pytest.mark.parametrize("extra, message", [
    ([], "--dataset is required"),
    (["--dataset", "CLUSTER", "--heads", "3"], "--heads must divide"),
    (["--dataset", "CLUSTER", "--target-density", "0.1", "--attention", "none"],
     "--target-density needs --attention sbm"),
    (["--dataset", "CLUSTER", "--attn-dropout", "1"], "--attn-dropout"),
    (["--dataset", "CLUSTER", "--val-graphs", "0"], "--val-graphs must be >= 1"),
    (["--dataset", "CLUSTER", "--resume"], "no checkpoint"),
])
def test_bad_arguments_exit_with_a_message(tmp_path, extra, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["gps", "--out", str(tmp_path / "run"), *extra])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_refuses_other_settings(tmp_path, small_recipes, capsys):
    out = tmp_path / "run"
    _run(tmp_path, out, "--epochs", "1")
    with pytest.raises(SystemExit):
        _run(tmp_path, out, "--epochs", "2", "--resume", "--lr", "0.1")
    assert "--lr" in capsys.readouterr().err


def test_parameter_counts_in_the_docs_artifact_are_the_models():
    # docs/gps.md quotes docs/runs/gps/gps-benchmarks/stats.json; the counts
    # must be those of the models the presets build now.
    import importlib.util
    from pathlib import Path
    path = Path(__file__).parents[2] / "docs/runs/gps/gps-benchmarks/stats.py"
    spec = importlib.util.spec_from_file_location("gps_stats", path)
    stats_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stats_script)
    stored = json.loads(path.with_name("stats.json").read_text())["parameters"]
    for key, counts in stored.items():
        preset, dataset = key.split("/")
        for attention, count in counts.items():
            assert stats_script.parameters(preset, dataset, attention) == count, (
                key, attention)


def test_init_density_reaches_the_gps_models_attention():
    import argparse

    from sbm_pyg.experiments.gps import build_gps_model
    from sbm_pyg.experiments.gps_arguments import add_gps_arguments, validate_gps_arguments
    parser = argparse.ArgumentParser()
    add_gps_arguments(parser)
    args = parser.parse_args(["--dataset", "PATTERN", "--attention", "sbm",
                              "--init-density", "0.02", "--out", "unused"])
    validate_gps_arguments(args)
    assert args.exploration == pytest.approx(0.002)
    convs = [m for m in build_gps_model(args, 7, 2).modules()
             if type(m).__name__ == "SBMConv"]
    assert convs and all(c.sbm.density == 0.02 for c in convs)
