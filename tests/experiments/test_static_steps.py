"""The train command's static steps: --capacity (no read in a step, the
overflow logged and the capacity grown) and --compile (one graph)."""
import importlib
import json

import pytest
import torch
import torch._dynamo.utils

from sbm_pyg.__main__ import main
from sbm_pyg.experiments.static_steps import unsized
from sbm_pyg.nn import SBMConv

# The module (the package's name "train" is the function).
train_module = importlib.import_module("sbm_pyg.experiments.train")

pytestmark = pytest.mark.host

MQAR = ["train", "--task", "mqar", "--seq-len", "32", "--num-kv-pairs", "4",
        "--vocab-size", "40", "--channels", "16", "--num-clusters", "8",
        "--batch-size", "4", "--no-progress", "--eval-batches", "2",
        "--log-every", "1"]


@pytest.fixture
def aot_eager(monkeypatch):
    # The train command compiles with aot_eager: the whole trace (dynamo,
    # autograd's) without inductor's code generation, which takes minutes
    # on two cores; dynamo's caches and counters fresh.
    monkeypatch.setattr(train_module, "compiled", lambda net: torch.compile(
        net, fullgraph=True, dynamic=False, backend="aot_eager"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_an_overflowing_capacity_is_logged_and_grown(tmp_path):
    out = tmp_path / "run"
    main([*MQAR, "--out", str(out), "--steps", "3", "--capacity", "64"])
    steps = [r for r in records(out) if r.get("split") == "train"]
    assert steps[0]["overflow"] >= 1 and steps[0]["expected_draws"] > 64
    grown = steps[0]["capacity"]
    assert grown >= steps[0]["expected_draws"]
    assert all(r["overflow"] == 0 and "capacity" not in r for r in steps[1:])
    final = json.loads((out / "final.json").read_text())
    assert final["args"]["capacity"] == 64 and 0 < final["density"] < 1


@pytest.mark.parametrize("extra", [[], ["--attn-dropout", "0.2"]])
def test_compile_trains_as_one_graph(tmp_path, aot_eager, extra):
    out = tmp_path / "run"
    main([*MQAR, "--out", str(out), "--steps", "4", "--capacity", "65536",
          "--compile", "--attention", "sbm", *extra])
    steps = [r for r in records(out) if r.get("split") == "train"]
    assert len(steps) == 4 and all(r["overflow"] == 0 for r in steps)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]


def test_an_automatic_capacity_fits_from_the_second_step_on(tmp_path):
    out = tmp_path / "run"
    main([*MQAR, "--out", str(out), "--steps", "4", "--capacity", "auto",
          "--attention", "sbm"])
    steps = [r for r in records(out) if r.get("split") == "train"]
    assert all(r["overflow"] == 0 for r in steps)
    # Each step's capacity covers the largest layer's need with room.
    assert all(r["capacity"] >= r["expected_draws"] + 64 for r in steps)
    assert json.loads((out / "final.json").read_text())["args"]["capacity"] == "auto"


def test_compile_with_an_automatic_capacity_sizes_the_layers_before_its_steps(
        tmp_path, aot_eager):
    # The first step's batch forward eagerly sizes every layer; the compiled
    # steps then read nothing but the layers' copies and never overflow.
    # --compile alone takes --capacity auto.
    out = tmp_path / "run"
    main([*MQAR, "--out", str(out), "--steps", "4", "--compile", "--attention", "sbm"])
    assert json.loads((out / "final.json").read_text())["args"]["capacity"] == "auto"
    steps = [r for r in records(out) if r.get("split") == "train"]
    assert len(steps) == 4 and all(r["overflow"] == 0 for r in steps)
    assert all(r["capacity"] >= r["expected_draws"] + 64 for r in steps)
    # A graph per capacity the layers took (the second call may shrink or
    # grow it once), never a break.
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= len({r["capacity"] for r in steps}) + 1


def test_unsized_asks_each_layers_training_capacity_and_changes_nothing():
    sized, auto = (SBMConv(16, 8, heads=2, num_clusters=4, capacity=c) for c in (64, "auto"))
    model = torch.nn.ModuleList([sized, auto]).eval()
    assert unsized(model) and not model.training
    with torch.no_grad():
        auto(torch.randn(20, 16))  # an evaluation call sizes evaluation only
    assert unsized(model) and not model.training
    auto.attend_all = True  # every pair: nothing sampled, nothing to size
    assert not unsized(model)
    auto.attend_all = False
    auto.train()(torch.randn(20, 16))
    assert not unsized(model)


@pytest.mark.parametrize("extra, message", [
    (["--capacity", "0"], "--capacity must be >= 1 or 'auto' and needs --attention sbm"),
    (["--capacity", "64", "--attention", "full"],
     "--capacity must be >= 1 or 'auto' and needs --attention sbm"),
    (["--compile", "--attention", "full"], "--compile needs --attention sbm"),
])
def test_bad_static_arguments_exit_2(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        main([*MQAR, "--out", "x", *extra])
    assert e.value.code == 2
    assert "error: " + message in capsys.readouterr().err


def test_compile_refuses_a_padded_task(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--task", "listops", "--out", "x", "--capacity", "64",
              "--compile"])
    assert "a task without padding" in capsys.readouterr().err


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("capacity", ["65536", "auto"])
def test_a_resumed_compiled_run_repeats_the_uninterrupted_one(tmp_path, aot_eager,
                                                              device, capacity):
    # A compiled step takes no generator: its graphs' seeds come from the
    # device's default generator, which the checkpoint must carry. With an
    # automatic capacity the resumed run sizes its layers again, by a
    # forward that leaves every random stream as it was.
    static = [*MQAR, "--capacity", capacity, "--compile", "--attention", "sbm",
              "--device", device, "--checkpoint-every", "2", "--keep-checkpoints", "2"]
    straight = tmp_path / "straight"
    main([*static, "--out", str(straight), "--steps", "4"])
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "checkpoint.pt").write_bytes((straight / "checkpoint-2.pt").read_bytes())
    main([*static, "--out", str(resumed), "--steps", "4", "--resume"])
    a, b = ([r for r in records(out) if r.get("split") == "train"]
            for out in (straight, resumed))
    assert [r["step"] for r in b] == [3, 4]
    # Steps 3 and 4 sample the same graphs: the same loss and density (an
    # automatic capacity may differ: it pads, and changes no edge).
    ignore = dict(seconds=0, capacity=0)
    for x, y in zip(a[2:], b):
        assert x | ignore == y | ignore
