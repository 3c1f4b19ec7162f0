"""train_step: one optimizer step and its record."""
import math

import pytest
import torch

from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.optim import build_optimizer, build_schedule
from sbm_pyg.experiments.runs import build_model
from sbm_pyg.experiments.tasks import make_task
from sbm_pyg.experiments.train import train_step
from tests.helpers import seeded


def test_train_step_updates_the_model_and_records_the_step(tmp_path):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", out=tmp_path, seq_len=8, batch_size=4)
    device = torch.get_default_device()
    task = make_task(args, seeded(0))
    model = build_model(args).to(device)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    before = [p.detach().clone() for p in model.parameters()]
    lr = optimizer.param_groups[0]["lr"]
    record = train_step(model, model, optimizer, schedule, task, args, device,
                        seeded(1))
    assert record["split"] == "train" and record["lr"] == lr
    assert math.isfinite(record["loss"]) and record["loss"] > 0
    assert 0.0 <= record["accuracy"] <= 1.0
    assert 0.0 < record["density"] <= 1.0
    # the step moved the parameters and the schedule
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert schedule.last_epoch == 1


def test_a_random_selector_never_moves(tmp_path):
    # --sbm-lr 0: the SBMs stay as initialized through sampled steps while
    # the rest learns, even with the straight-through gradient reaching them
    # (the control adds --ste none, so that nothing of them reaches the
    # model either).
    torch.manual_seed(0)
    args = train_arguments(task="mqar", out=tmp_path, seq_len=32, num_pairs=4,
                           vocab_size=40, batch_size=4, num_clusters=8, channels=16,
                           sbm_parametrization="mmsb", init_density=0.2, sbm_lr=0.0)
    device = torch.get_default_device()
    task = make_task(args, seeded(0))
    model = build_model(args).to(device)
    optimizer = build_optimizer(model, args)
    schedule = build_schedule(optimizer, args)
    sbm = {n: p.detach().clone() for n, p in model.named_parameters() if ".sbm." in n}
    rest = {n: p.detach().clone() for n, p in model.named_parameters()
            if ".sbm." not in n}
    assert sbm and rest
    for step in range(3):
        record = train_step(model, model, optimizer, schedule, task, args, device,
                            seeded(step + 1))
        assert 0 < record["density"] < 1 and record["grad_norm_sbm"] > 0
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in sbm.items())
    assert any(not torch.equal(params[n], p) for n, p in rest.items())


def test_the_easy_mqar_variant_needs_its_flag(tmp_path):
    with pytest.raises(ValueError, match="--small-vocab"):
        train_arguments(task="mqar", out=tmp_path, seq_len=64, num_pairs=4,
                        vocab_size=64)
    args = train_arguments("mqar-sparse-easy", out=tmp_path)
    assert (args.seq_len, args.num_pairs, args.vocab_size, args.small_vocab) == \
        (256, 16, 256, True)
