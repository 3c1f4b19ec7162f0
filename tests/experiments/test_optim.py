import math

import pytest
import torch

from sbm_pyg.experiments.optim import (
    build_optimizer,
    clip_and_measure,
    learning_rate_factor,
    parameters_before,
    update_statistics,
)


def test_learning_rate_factor_exact_values():
    # 10 steps, 2 of warm-up: (s + 1) / 2, then from 1 down to 0 at step 10.
    linear = [learning_rate_factor(s, 10, 2, "linear") for s in range(11)]
    assert linear == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5,
                                    0.375, 0.25, 0.125, 0.0])
    cosine = [learning_rate_factor(s, 10, 2, "cosine") for s in (2, 6, 10)]
    assert cosine == pytest.approx([1.0, 0.5, 0.0])
    assert learning_rate_factor(4, 10, 2, "cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 4)))
    assert [learning_rate_factor(s, 10, 0, "constant") for s in (0, 9)] == [1.0, 1.0]
    # A warm-up longer than the run never reaches the top.
    assert learning_rate_factor(2, 3, 10, "linear") == pytest.approx(0.3)
    with pytest.raises(ValueError, match="schedule must be one of"):
        learning_rate_factor(0, 10, 0, "step")


class _Args:
    lr, sbm_lr, adam_eps, weight_decay, optimizer = 1e-2, None, 1e-6, 0.0, "adamw"


def _model():
    model = torch.nn.Module()
    model.rest = torch.nn.Linear(2, 1, bias=False)
    model.attention = torch.nn.Module()
    model.attention.sbm = torch.nn.Linear(1, 1, bias=False)
    return model


def test_clip_and_measure_norms_per_group_and_clips_in_total():
    model = _model()
    optimizer = build_optimizer(model, _Args())
    assert [g["name"] for g in optimizer.param_groups] == ["rest", "sbm"]
    model.rest.weight.grad = torch.tensor([[3.0, 0.0]])
    model.attention.sbm.weight.grad = torch.tensor([[4.0]])
    stats = clip_and_measure(optimizer, max_norm=1.0)
    assert (float(stats["grad_norm_rest"]), float(stats["grad_norm_sbm"]),
            float(stats["grad_norm"])) == pytest.approx((3.0, 4.0, 5.0))
    assert model.rest.weight.grad.flatten().tolist() == pytest.approx([0.6, 0.0], rel=1e-5)
    assert model.attention.sbm.weight.grad.item() == pytest.approx(0.8, rel=1e-5)
    # max_norm 0: measured, not clipped.
    clip_and_measure(optimizer, max_norm=0.0)
    assert model.attention.sbm.weight.grad.item() == pytest.approx(0.8, rel=1e-5)


def test_clip_and_measure_without_sbm_gradients_stays_on_the_parameters_device():
    # A model without SBM parameters (full attention) has an empty group:
    # its zero norm is made on the parameters' device, so that it stacks with
    # the others ("meta" stands in for CUDA on a machine without one).
    model = _model().to("meta")
    model.attention.sbm.weight.requires_grad_(False)
    optimizer = build_optimizer(model, _Args())
    model.rest.weight.grad = torch.ones(1, 2, device="meta")
    stats = clip_and_measure(optimizer, max_norm=0.0)
    assert {t.device.type for t in stats.values()} == {"meta"}
    before = parameters_before(optimizer)
    stats = update_statistics(optimizer, before)
    assert {t.device.type for t in stats.values()} == {"meta"}
