"""train_step: one optimizer step and its record."""
import math

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
