import argparse
import json

import pytest
import torch

from sbm_pyg import SBMConv
from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.optim import build_optimizer, build_schedule
from sbm_pyg.experiments.recipe import Recipe
from sbm_pyg.experiments.runs import build_model
from sbm_pyg.experiments.tasks import make_task
from sbm_pyg.experiments.train import train, train_step
from tests.helpers import seeded


def _recipe(name="teacher", **kw):
    args = dict(recipe=name, dense_steps=4, selector_steps=6, selector_recall=0.9,
                selector_check=2)
    args.update(kw)
    return Recipe(argparse.Namespace(**args))


def test_phases():
    assert [_recipe("end-to-end").phase(s) for s in (0, 3, 4, 9)] == \
        ["dense", "dense", "sparse", "sparse"]
    recipe = _recipe()
    assert [recipe.phase(s) for s in (0, 3, 4, 100)] == \
        ["dense", "dense", "selector", "selector"]
    assert recipe.attend_all(100) and recipe.budget_delay(0) == 4
    assert _recipe("end-to-end").budget_delay(0) == 0
    with pytest.raises(ValueError, match="recipe"):
        _recipe("nope")


def test_switch_when_the_recall_is_ready():
    recipe, calls = _recipe(), []

    def measure(recall):
        def f():
            calls.append(recall)
            return dict(recall=recall, oracle_recall=0.8)
        return f

    # Steps done: the first selector step's end is 5; checks at 6 and 8.
    assert recipe.after_step(4, measure(1.0)) is None  # none trained yet
    assert recipe.after_step(5, measure(1.0)) is None  # not a check step
    assert recipe.after_step(6, measure(0.71)) is None  # 0.71 < 0.9 * 0.8
    record = recipe.after_step(8, measure(0.73))
    assert calls == [0.71, 0.73]
    assert record["reason"] == "recall" and record["step"] == 8
    assert recipe.sparse_start == 8 and recipe.phase(7) == "selector"
    assert recipe.phase(8) == "sparse" and not recipe.attend_all(8)
    assert recipe.after_step(10, measure(0.0)) is None  # switched once


def test_switch_at_the_cap():
    recipe = _recipe(selector_steps=5, selector_check=100)
    assert recipe.after_step(8, lambda: dict(recall=0.0, oracle_recall=1.0)) is None
    record = recipe.after_step(9, lambda: dict(recall=0.1, oracle_recall=1.0))
    assert record["reason"] == "cap" and record["selector_steps"] == 5


def _observe(recipe, step, accuracy, measure=None):
    # One training step's accuracy, then the recipe's decision after it.
    return recipe.after_step(step, measure or (lambda: pytest.fail("measured")),
                             accuracy)


def test_a_gated_dense_phase_ends_on_the_teachers_accuracy():
    # Dense until 4, then checks every 2 steps on the mean training
    # accuracy of the last 2: 0.5 at 4, 0.85 at 6, 0.95 at 8.
    recipe = _recipe(teacher_accuracy=0.9, dense_max_steps=20)
    accuracies = [0.0, 0.0, 0.4, 0.6, 0.8, 0.9, 0.9, 1.0]
    records = [_observe(recipe, step + 1, a) for step, a in enumerate(accuracies)]
    assert records[:7] == [None] * 7
    assert records[7] == dict(step=8, split="recipe", phase="selector",
                              teacher_accuracy=pytest.approx(0.95),
                              reason="accuracy")
    assert [recipe.phase(s) for s in (3, 4, 7)] == ["dense"] * 3
    assert [recipe.held(s) for s in (3, 4, 7)] == [False, True, True]
    assert recipe.selector_start == 8 and recipe.phase(8) == "selector"
    assert not recipe.held(8) and recipe.attend_all(8)
    # The selector phase's cap stays at step 4 + 6: the gate's 4 steps came
    # out of it; its checks go by the validation (recall), not accuracies.
    def measure():
        return dict(recall=0.0, oracle_recall=1.0)
    assert _observe(recipe, 9, 1.0, measure) is None
    record = _observe(recipe, 10, 1.0, measure)
    assert record["reason"] == "cap" and record["selector_steps"] == 2
    assert recipe.phase(10) == "sparse" and recipe.state["selector_start"] == 8


def test_the_switch_waits_for_the_selectors_accuracy():
    # Gate passed at 4 with a teacher at 0.95; with --switch-within 0.01 a
    # ready recall is not enough while the frozen model on the selector's
    # graphs sits at 0.90 (< 0.94); it switches once it reaches 0.94, and
    # at the cap whatever the accuracy.
    recipe = _recipe(teacher_accuracy=0.9, dense_max_steps=20, switch_within=0.01,
                     selector_steps=10)
    assert [_observe(recipe, s, 0.95) for s in range(1, 4)] == [None] * 3
    assert _observe(recipe, 4, 0.95)["teacher_accuracy"] == pytest.approx(0.95)

    def measure(accuracy):
        return lambda: dict(recall=1.0, oracle_recall=1.0, accuracy=accuracy)
    assert _observe(recipe, 6, 1.0, measure(0.90)) is None
    assert _observe(recipe, 8, 1.0, measure(0.9399)) is None
    record = _observe(recipe, 10, 1.0, measure(0.9401))
    assert record["reason"] == "recall" and record["selector_accuracy"] == 0.9401
    assert recipe.sparse_start == 10
    capped = _recipe(teacher_accuracy=0.9, dense_max_steps=20, switch_within=0.01,
                     selector_steps=6)
    assert _observe(capped, 4, 0.95) is None  # one accuracy seen: window not full
    capped.state = dict(selector_start=4, teacher_accuracy=0.95)
    assert _observe(capped, 6, 1.0, measure(0.5)) is None
    record = _observe(capped, 10, 1.0, measure(0.5))
    assert record["reason"] == "cap" and record["selector_accuracy"] == 0.5


def test_switch_within_needs_the_gate(tmp_path):
    teacher = dict(task="repeat", out=tmp_path, recipe="teacher", dense_steps=10,
                   distill=1.0)
    with pytest.raises(ValueError, match="--switch-within must lie in .* needs "
                                         "--teacher-accuracy"):
        train_arguments(**teacher, switch_within=0.01)
    with pytest.raises(ValueError, match="--switch-within must lie"):
        train_arguments(**teacher, teacher_accuracy=0.9, switch_within=2.0)
    with pytest.raises(ValueError, match="--switch-within needs --recipe teacher"):
        train_arguments(task="repeat", out=tmp_path, switch_within=0.01)
    assert train_arguments(**teacher, teacher_accuracy=0.9,
                           switch_within=0.01).switch_within == 0.01


def test_a_gated_dense_phase_at_its_cap_and_at_once():
    # Never learned: the selector phase starts at --dense-max-steps (7, not
    # a check step); learned by --dense-steps: it starts there, as ungated.
    recipe = _recipe(teacher_accuracy=0.9, dense_max_steps=7)
    assert [_observe(recipe, s, 0.1) for s in range(1, 7)] == [None] * 6
    record = _observe(recipe, 7, 0.1)
    assert record["reason"] == "cap" and recipe.selector_start == 7
    recipe = _recipe(teacher_accuracy=0.9)
    assert [_observe(recipe, s, 0.95) for s in range(1, 4)] == [None] * 3
    assert _observe(recipe, 4, 0.95)["reason"] == "accuracy"
    assert recipe.selector_start == 4 and not recipe.held(4)
    # After a resume the window fills again before the gate decides: the
    # check at 6 waits, the one at 8 (two accuracies seen) passes.
    resumed = _recipe(teacher_accuracy=0.9, dense_max_steps=20)
    assert _observe(resumed, 6, 1.0) is None
    assert _observe(resumed, 7, 1.0) is None
    assert _observe(resumed, 8, 1.0)["reason"] == "accuracy"
    # Ungated, the selector phase starts at --dense-steps without a check.
    assert _recipe().selector_start == 4 and not _recipe().gated
    assert not _recipe("end-to-end", teacher_accuracy=0.9).gated


def test_a_gradual_switch_anneals_the_exploration():
    # End-to-end: sampled from step 4; over 4 steps 1, 0.1^(1/4), ... then 0.1.
    recipe = _recipe("end-to-end", switch_steps=4)
    rates = [recipe.exploration(s, 0.1) for s in range(10)]
    assert rates[:4] == [0.1] * 4  # dense: the layer attends every pair anyway
    assert rates[4:9] == pytest.approx([1.0, 0.1 ** 0.25, 0.1 ** 0.5, 0.1 ** 0.75, 0.1])
    assert rates[9] == 0.1
    # An exploration of 0 anneals to the floor, then is 0.
    assert recipe.exploration(7, 0.0) == pytest.approx(1e-3 ** 0.75)
    assert recipe.exploration(8, 0.0) == 0.0
    # Teacher: from the switch the recall decided, none before it.
    recipe = _recipe(switch_steps=2)
    assert recipe.exploration(50, 0.01) == 0.01  # still the selector phase
    recipe.after_step(10, lambda: dict(recall=0.0, oracle_recall=1.0))  # the cap
    assert [recipe.exploration(s, 0.01) for s in (10, 11, 12)] == \
        pytest.approx([1.0, 0.1, 0.01])
    assert _recipe(switch_steps=0).exploration(100, 0.01) == 0.01


def test_the_selector_phase_trains_the_sbms_alone(tmp_path):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", out=tmp_path, seq_len=8, batch_size=4,
                           distill=1.0, dense_steps=1, recipe="teacher",
                           num_clusters=4)
    model = build_model(args)
    recipe = Recipe(args)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    conv = next(m for m in model.modules() if isinstance(m, SBMConv))
    conv.distill, conv.attend_all = 1.0, True
    sbm = {id(p) for p in conv.sbm.parameters()}
    assert recipe.trainable(model, 0) is None and recipe.trainable(model, 1) == sbm
    before = {id(p): p.detach().clone() for p in model.parameters()}
    train_step(model, model, optimizer, schedule, make_task(args, seeded(0)), args,
               torch.device("cpu"), seeded(1), trainable=recipe.trainable(model, 1))
    moved = {id(p) for p in model.parameters() if not torch.equal(p, before[id(p)])}
    assert moved and moved <= sbm


def test_a_frozen_selector_leaves_the_sbms_after_the_switch(tmp_path):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", out=tmp_path, seq_len=8, batch_size=4,
                           distill=1.0, dense_steps=1, recipe="teacher",
                           num_clusters=4, freeze_selector=True)
    model = build_model(args)
    recipe = Recipe(args)
    recipe.state = dict(sparse_start=2)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    conv = next(m for m in model.modules() if isinstance(m, SBMConv))
    conv.distill = 1.0
    sbm = {id(p) for p in conv.sbm.parameters()}
    rest = {id(p) for p in model.parameters()} - sbm
    assert recipe.trainable(model, 1) == sbm and recipe.trainable(model, 2) == rest
    before = {id(p): p.detach().clone() for p in model.parameters()}
    train_step(model, model, optimizer, schedule, make_task(args, seeded(0)), args,
               torch.device("cpu"), seeded(1), trainable=recipe.trainable(model, 2))
    moved = {id(p) for p in model.parameters() if not torch.equal(p, before[id(p)])}
    assert moved and moved <= rest and conv.distillation is not None
    with pytest.raises(ValueError, match="--freeze-selector needs --recipe teacher"):
        train_arguments(task="repeat", out=tmp_path / "x", freeze_selector=True)


def test_a_teacher_run_switches_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = dict(task="repeat", out=out, seq_len=8, batch_size=4, num_clusters=4,
                distill=1.0, dense_steps=2, recipe="teacher", selector_steps=2,
                selector_check=100, target_density=0.2, log_every=1, no_progress=True,
                checkpoint_every=1)
    final = train(train_arguments(steps=3, **args))
    # One selector step (no check: only the cap of 2 switches, at step 4).
    assert "recipe" not in final or final["recipe"] == {}
    final = train(train_arguments(steps=6, resume=True, **args))
    assert final["recipe"]["sparse_start"] == 4
    assert json.loads((out / "recipe.json").read_text()) == final["recipe"]
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    switch = [r for r in records if r["split"] == "recipe"]
    assert len(switch) == 1 and switch[0]["step"] == 4
    # Sampled graphs from the switch: densities below 1 after it.
    train_density = {r["step"]: r["density"] for r in records if r["split"] == "train"}
    assert train_density[4] == 1.0 and train_density[5] < 1.0


def test_a_gradual_switch_in_a_run(tmp_path):
    # Sampled from step 2; the exploration falls 1 -> 0.22 -> 0.046 -> 0.01
    # -> 0.01, and with it the sampled graphs' density.
    final = train(train_arguments(
        task="repeat", out=tmp_path, seq_len=16, batch_size=4, num_clusters=4,
        dense_steps=2, switch_steps=3, exploration=0.01, steps=7, log_every=1,
        no_progress=True, sbm_init="paper"))
    assert final["args"]["switch_steps"] == 3
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    density = [r["density"] for r in records if r["split"] == "train"]
    # Step 3 (the first sampled) samples every pair: exploration 1 in exact mode.
    assert density[:3] == [1.0, 1.0, 1.0]
    assert density[3] > density[5] and density[4] > density[6]


def test_a_gated_run_holds_the_budget_and_the_distillation(tmp_path):
    # Asked for a training accuracy of 1.0 over 100 steps, which a run of
    # 10 steps cannot show, the dense phase runs to its cap at step 5
    # (dense_steps 2), and in steps 2-4 neither the budget nor the
    # distillation acts; the budget's delay and warm-up then count from
    # step 5 as they would from step 2 ungated. The selector phase keeps its
    # cap at step 2 + 4: one selector step.
    out = tmp_path / "run"
    args = dict(task="repeat", out=out, seq_len=8, batch_size=4, num_clusters=4,
                distill=1.0, dense_steps=2, recipe="teacher", selector_steps=4,
                selector_check=100, target_density=0.2, budget_warmup=1, log_every=1,
                no_progress=True, checkpoint_every=1, teacher_accuracy=1.0,
                dense_max_steps=5)
    train(train_arguments(steps=4, **args))
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    train_records = [r for r in records if r["split"] == "train"]
    held = ["distillation_per_layer_head" in r for r in train_records]
    assert held == [True, True, False, False]
    assert ["lam" in r for r in train_records] == [True, True, False, False]
    final = train(train_arguments(steps=10, resume=True, **args))
    assert final["recipe"]["selector_start"] == 5
    assert final["recipe"]["dense_reason"] == "cap"
    assert final["recipe"]["sparse_start"] == 6
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    train_records = [r for r in records if r["split"] == "train"]
    assert ["distillation_per_layer_head" in r for r in train_records] == \
        [True, True, False, False, False] + [True] * 5
    assert [r["density"] == 1.0 for r in train_records][:6] == [True] * 6
    assert train_records[6]["density"] < 1.0
    switches = [(r["step"], r["phase"]) for r in records if r["split"] == "recipe"]
    assert switches == [(5, "selector"), (6, "sparse")]
    state = torch.load(out / "checkpoint.pt", weights_only=False)["budget"]
    assert state["steps"] == 10 - 3  # the three added steps left it alone


def test_recipe_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="--switch-steps"):
        train_arguments(task="repeat", out=tmp_path, switch_steps=-1)
    with pytest.raises(ValueError, match="--recipe teacher needs"):
        train_arguments(task="repeat", out=tmp_path, recipe="teacher", dense_steps=10)
    with pytest.raises(ValueError, match="--selector-recall"):
        train_arguments(task="repeat", out=tmp_path, recipe="teacher", dense_steps=10,
                        distill=1.0, selector_recall=1.5)
    with pytest.raises(ValueError, match="--selector-steps"):
        train_arguments(task="repeat", out=tmp_path, recipe="teacher", dense_steps=10,
                        distill=1.0, selector_steps=0)
    teacher = dict(task="repeat", out=tmp_path, recipe="teacher", dense_steps=10,
                   distill=1.0)
    with pytest.raises(ValueError, match="--teacher-accuracy must lie"):
        train_arguments(**teacher, teacher_accuracy=1.5)
    with pytest.raises(ValueError, match="--dense-max-steps needs --teacher-accuracy"):
        train_arguments(**teacher, dense_max_steps=20)
    with pytest.raises(ValueError, match=r"must be >= --dense-steps \(10\), got 5"):
        train_arguments(**teacher, teacher_accuracy=0.9, dense_max_steps=5)
    with pytest.raises(ValueError, match="--teacher-accuracy needs --recipe teacher"):
        train_arguments(task="repeat", out=tmp_path, teacher_accuracy=0.9)


@pytest.mark.parametrize("preset,task,seq_len", [("repeat-sparse", "repeat", 64),
                                                 ("mqar-sparse", "mqar", 256),
                                                 ("mqar-sparse-easy", "mqar", 256)])
def test_sparse_presets(tmp_path, preset, task, seq_len):
    args = train_arguments(preset, out=tmp_path)
    assert (args.task, args.seq_len, args.recipe, args.sbm_parametrization) == \
        (task, seq_len, "teacher", "mmsb")
    assert args.target_density == 0.05 and args.exploration == pytest.approx(0.005)
    # The gradual switch where the runs favoured it (repeat); MQAR's keeps
    # the step switch (its sampled phase can be as short as 100 steps).
    assert args.switch_steps == (400 if task == "repeat" else 0)
    over = train_arguments(preset, out=tmp_path, target_density=0.02, seed=2)
    assert (over.target_density, over.seed) == (0.02, 2)
    # MQAR's: the recall fit, a budget per head from lambda 1, the SBMs
    # learning from the selector phase on; each can be switched back off
    # (the runs made before it). Both tasks: a sink, and a dense phase that
    # waits for its teacher (99%).
    mqar = task == "mqar"
    assert (args.distill_recall, args.budget_per_head, args.budget_lam, args.sink) == \
        ((1.0, True, 1.0, True) if mqar else (0.0, False, 1.0, True))
    assert (args.distill_start, args.selector_steps, args.steps) == {
        "repeat-sparse": (0, 1200, 6000), "mqar-sparse": (500, 2500, 4500),
        "mqar-sparse-easy": (500, 1500, 2100)}[preset]
    assert args.teacher_accuracy == 0.99
    # Repeat's switch waits for the selector's graphs to serve the model;
    # its teacher may take until step 4000, with the gradient clipped (a
    # plateau near 90% on some seeds).
    assert args.switch_within == (None if mqar else 0.01)
    assert args.dense_max_steps == (None if mqar else 4000)
    assert args.clip_grad_norm == (0.0 if mqar else 1.0)
    # MQAR at Zoology's setting unless the easy variant is asked for.
    if mqar:
        assert (args.num_pairs, args.vocab_size, args.small_vocab) == (
            (16, 256, True) if preset.endswith("easy") else (64, 8192, False))
    off = train_arguments(preset, out=tmp_path, budget_per_head=False, sink=False)
    assert not off.budget_per_head and not off.sink


def test_the_mqar_baselines_share_the_setting(tmp_path):
    # Full attention, BigBird and the random selector: the same task, model
    # and schedule as the learned selector's preset, each a different head.
    sparse = vars(train_arguments("mqar-sparse", out=tmp_path))
    shared = ("task", "seq_len", "num_pairs", "vocab_size", "short_conv", "num_layers",
              "heads", "channels", "batch_size", "lr", "warmup_steps", "schedule")
    for preset, attention in (("mqar-full", "full"), ("mqar-bigbird", "bigbird"),
                              ("mqar-random", "sbm")):
        args = vars(train_arguments(preset, out=tmp_path))
        assert args["attention"] == attention
        assert {k: args[k] for k in shared} == {k: sparse[k] for k in shared}
    random = train_arguments("mqar-random", out=tmp_path)
    assert (random.sbm_lr, random.ste, random.init_density, random.lam,
            random.target_density) == (0.0, "none", 0.05, 0.0, None)
    assert train_arguments("mqar-bigbird", out=tmp_path).bigbird_density == 0.05


def test_a_per_head_budget_from_its_starting_multiplier(tmp_path):
    # --budget-per-head and --budget-lam reach the run's DensityBudget: each
    # of the two heads held to the budget (the checkpoint's [L, H] target),
    # lambda never below its start once the budget acts.
    out = tmp_path / "run"
    final = train(train_arguments(
        task="repeat", out=out, seq_len=8, batch_size=4, num_clusters=4, heads=2,
        channels=8, distill=1.0, distill_recall=1.0, dense_steps=1, recipe="teacher",
        selector_steps=1, selector_check=100, target_density=0.2, budget_per_head=True,
        budget_lam=0.5, steps=4, log_every=1, no_progress=True, checkpoint_every=1))
    state = torch.load(out / "checkpoint.pt", weights_only=False)["budget"]
    assert state["target"].shape == (1, 2) and state["lam0"] == 0.5
    assert bool((state["lams"] >= 0.5).all())
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    lams = [r["lam"] for r in records if r["split"] == "train"]
    assert len(lams) == 4 and min(lams) >= 0.5
    assert final["args"]["budget_per_head"] and final["args"]["distill_recall"] == 1.0
