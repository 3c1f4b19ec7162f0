import math

import pytest
import torch

from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import DensityBudget, SBMConv, SBMGPSConv, density_loss
from tests.helpers import seeded


def test_equals_the_models_own_regularizer():
    torch.manual_seed(0)
    model = SBMTransformer(5, 12, channels=16, num_layers=2, heads=2,
                           num_clusters=4)
    out = model(torch.randint(5, (3, 12)))
    loss = density_loss(model)
    assert torch.equal(loss, out.density_loss)
    grad = torch.autograd.grad(loss, model.blocks[0].attention.conv.sbm.clusters)[0]
    assert grad.abs().sum() > 0  # differentiable in the SBM


def test_averages_every_layer_and_head():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(dict(
        conv=SBMConv(8, 4, heads=2, num_clusters=3),
        gps=SBMGPSConv(8, None, heads=4, attn_kwargs=dict(num_clusters=3))))
    x = torch.randn(10, 8)
    model["conv"](x)
    model["gps"](x, torch.empty(2, 0, dtype=torch.long))
    expected = torch.cat([model["conv"].expected_density,
                          model["gps"].attn.expected_density]).mean()
    assert torch.allclose(density_loss(model), expected)


def test_errors():
    with pytest.raises(ValueError, match="no SBM attention layer"):
        density_loss(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="run the model first"):
        density_loss(SBMConv(8, 4))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        density_loss([SBMConv(8, 4)])


def _forward(model, seed=0):
    x = torch.randn(24, 8, generator=seeded(seed))
    model(x, generator=seeded(seed))


def test_budget_penalty_is_lambda_times_the_excess_over_the_budget():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3)
    _forward(conv)
    d = density_loss(conv).detach()
    assert 0.2 < float(d) < 0.3  # the paper's start
    over = DensityBudget(conv, target=0.1, lam=0.25).penalty()
    assert torch.allclose(over, 0.25 * (d - 0.1))
    grad = torch.autograd.grad(over, conv.sbm.clusters, retain_graph=True)[0]
    assert grad.abs().sum() > 0
    # Below the budget the floor pulls the other way...
    under = DensityBudget(conv, target=0.5, lam=0.25).penalty()
    assert torch.allclose(under, 0.25 * (0.5 - d))
    up = torch.autograd.grad(under, conv.sbm.clusters, retain_graph=True)[0]
    assert torch.allclose(up, -grad * (0.25 / 0.25), atol=1e-9)  # d(-d) = -d(d)
    # ...and a ceiling alone does nothing there.
    ceiling = DensityBudget(conv, target=0.5, lam=0.25, floor=False)
    assert ceiling.lam_floor is None
    under = ceiling.penalty()
    assert float(under.detach()) == 0.0
    grad = torch.autograd.grad(under, conv.sbm.clusters, allow_unused=True)[0]
    assert grad is None or not grad.any()


def test_budget_comes_down_geometrically_over_the_warmup():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, num_clusters=3)
    _forward(conv)
    d0 = float(density_loss(conv).detach())
    budget = DensityBudget(conv, target=0.01, warmup=4)
    assert float(budget.current_target()) == 0.01  # before the first step
    targets = []
    for _ in range(6):
        budget.penalty()
        targets.append(float(budget.current_target()))
        budget.step()
    expected = [0.01 * (d0 / 0.01) ** (1 - t / 4) for t in range(4)] + [0.01, 0.01]
    assert targets == pytest.approx(expected, rel=1e-9)
    # A budget above the start's density holds from the start.
    high = DensityBudget(conv, target=0.9, warmup=4)
    high.penalty()
    assert float(high.current_target()) == pytest.approx(0.9)


def test_budget_delay_waits_then_comes_down_from_that_density():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, num_clusters=3)
    _forward(conv)
    d0 = float(density_loss(conv).detach())
    budget = DensityBudget(conv, target=0.01, warmup=4, delay=3)
    penalties, targets = [], []
    for _ in range(9):
        penalties.append(float(budget.penalty()))
        targets.append(float(budget.current_target()))
        budget.step()
    # No penalty and lambda kept during the delay; then the warm-up from
    # the density of the first step after it.
    assert penalties[:4] == [0.0] * 4 and penalties[4] > 0  # 3: at its start
    expected = [0.01 * (d0 / 0.01) ** (1 - t / 4) for t in range(4)] + [0.01, 0.01]
    assert targets[3:] == pytest.approx(expected, rel=1e-9)
    fresh = DensityBudget(conv, target=0.01, warmup=4)
    delayed = DensityBudget(conv, target=0.01, warmup=4, delay=2)
    for _ in range(2):
        delayed.penalty()
        delayed.step()
    assert torch.equal(delayed.lams, fresh.lams) and delayed.start is None
    with pytest.raises(ValueError, match="delay"):
        DensityBudget(conv, target=0.01, delay=-1)
    # The delay is part of the saved state; a state saved before it loads as 0.
    state = budget.state_dict()
    assert state["delay"] == 3
    with pytest.raises(ValueError, match="delay"):
        DensityBudget(conv, target=0.01, warmup=4).load_state_dict(state)
    del state["delay"]
    DensityBudget(conv, target=0.01, warmup=4).load_state_dict(state)


def test_budget_step_is_the_pi_law_in_log_space():
    # lambda_1 = lam0 * exp((ki + kp) * log(d / rho)) after one step.
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3)
    budget = DensityBudget(conv, target=0.1, lam=1e-2, kp=0.5, ki=0.1)
    _forward(conv)
    d = float(density_loss(conv).detach())
    budget.penalty()
    budget.step()
    e = math.log(d / 0.1)
    assert float(budget.lam) == pytest.approx(1e-2 * math.exp(0.6 * e), rel=1e-9)
    # Second step, same density: the integral has two errors, kp one.
    _forward(conv)
    budget.step()  # without penalty(): the last forward's density
    assert float(budget.lam) == pytest.approx(1e-2 * math.exp(0.2 * e + 0.5 * e),
                                              rel=1e-6)


def test_budget_lambda_stays_within_its_bounds():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, num_clusters=3)
    _forward(conv)
    high = DensityBudget(conv, target=1e-4, lam_max=3.0)  # density far above
    low = DensityBudget(conv, target=1.0, lam_min=1e-5)   # density below
    idle = DensityBudget(conv, target=1.0)  # lam_min defaults to lam
    for _ in range(2000):
        high.step()
        low.step()
        idle.step()
    assert float(high.lam) == pytest.approx(3.0)
    assert float(low.lam) == pytest.approx(1e-5)
    assert float(idle.lam) == pytest.approx(1e-3)
    assert float(idle.lam_floor) == pytest.approx(100.0)  # lam_max
    # The integral is clipped too: one step back moves lambda off the bound.
    high.target.fill_(1.0)
    high.step()
    assert float(high.lam) < 3.0


def _two_layers_run():
    # Two layers of two heads after a forward, and their densities [2, 2].
    torch.manual_seed(0)
    model = torch.nn.ModuleList([SBMConv(8, 4, heads=2, num_clusters=3)
                                 for _ in range(2)])
    x = torch.randn(24, 8)
    for conv in model:
        conv(x, generator=seeded(0))
    return model, torch.stack([conv.expected_density for conv in model]).detach()


def test_per_head_budgets_move_each_head_its_own_way():
    model, d = _two_layers_run()
    target = torch.tensor([[1e-3, 1.0], [1.0, 1e-3]])
    budget = DensityBudget(model, target=target, lam=1e-2, lam_min=1e-4)
    assert budget.lam.shape == (2, 2)
    penalty = budget.penalty()
    assert torch.allclose(penalty, (1e-2 * (d - target).abs()).mean())
    budget.step()
    assert (budget.lam[target == 1e-3] > 1e-2).all()
    assert (budget.lam[target == 1.0] < 1e-2).all()
    assert (budget.lam_floor[target == 1e-3] < 1e-2).all()
    assert (budget.lam_floor[target == 1.0] > 1e-2).all()


def test_a_number_held_by_every_head():
    # per_head: the same multipliers and penalty as the [L, H] tensor of that
    # number, so that a head above the budget is pulled down even where the
    # mean over heads sits below it.
    model, d = _two_layers_run()
    rho = float(d.mean())
    each = DensityBudget(model, target=rho, lam=1e-2, per_head=True)
    table = DensityBudget(model, target=torch.full((2, 2), rho), lam=1e-2)
    assert each.per_head and each.target.shape == (2, 2)
    assert torch.equal(each.penalty(), table.penalty())
    assert torch.allclose(each.penalty(), (1e-2 * (d - rho).abs()).mean())
    each.step()
    table.step()
    assert torch.equal(each.lams, table.lams)
    assert ((each.lam > 1e-2) == (d > rho)).all()
    with pytest.raises(TypeError, match="per_head must be a bool"):
        DensityBudget(model, target=0.1, per_head=1)
    with pytest.raises(ValueError, match=r"target must lie in \(0, 1\]"):
        DensityBudget(model, target=1.5, per_head=True)
    mixed = torch.nn.ModuleList([SBMConv(8, 4, heads=2), SBMConv(8, 4, heads=1)])
    with pytest.raises(ValueError, match="per_head needs every SBM layer"):
        DensityBudget(mixed, target=0.1, per_head=True)


@pytest.mark.slow
def test_budget_holds_the_density_against_a_force_toward_full_attention():
    # The loss pulls the density up with strength 0.05; the budget must find
    # lambda ~ 0.05 and hold the density at 0.1 (the last 20% of steps within
    # 10%), from the start's ~0.25.
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=4)
    budget = DensityBudget(conv, target=0.1)
    optimizer = torch.optim.Adam(conv.sbm.parameters(), lr=1e-2)
    x = torch.randn(64, 8)
    densities, lams = [], []
    for step in range(400):
        conv(x, generator=seeded(step))
        loss = -0.05 * density_loss(conv)
        optimizer.zero_grad()
        (loss + budget.penalty()).backward()
        optimizer.step()
        budget.step()
        densities.append(float(density_loss(conv).detach()))
        lams.append(float(budget.lam))
    tail = densities[-80:]
    assert abs(sum(tail) / len(tail) - 0.1) < 0.01
    assert max(lams) < 1.0  # bounded, no runaway


@pytest.mark.parametrize("target,error,match", [
    (0.0, ValueError, r"target must lie in \(0, 1\]"),
    (-0.1, ValueError, r"target must lie in \(0, 1\]"),
    (1.5, ValueError, r"target must lie in \(0, 1\]"),
    (float("nan"), ValueError, r"target must lie in \(0, 1\]"),
    (torch.tensor([[0.1, float("nan")]]), ValueError, r"target must lie"),
    (torch.tensor([[0.1, 0.2, 0.3]]), ValueError, r"\[layers, heads\] tensor"),
    (torch.tensor([[1, 1]]), TypeError, "target must be a float tensor"),
    ("0.1", TypeError, "target must be a float or a tensor"),
    (True, TypeError, "target must be a float or a tensor"),
])
def test_bad_budgets_are_refused(target, error, match):
    with pytest.raises(error, match=match):
        DensityBudget(SBMConv(8, 4, heads=2), target=target)


@pytest.mark.parametrize("kwargs,match", [
    (dict(lam=0.0), "lam must be"), (dict(ki=float("inf")), "ki must be"),
    (dict(kp=-1.0), "kp must be"), (dict(lam=10.0, lam_max=1.0), "lam_min <= lam"),
    (dict(warmup=-1), "warmup must be"), (dict(warmup=2.5), "warmup must be"),
    (dict(floor=1), "floor must be a bool"),
])
def test_bad_gains_are_refused(kwargs, match):
    with pytest.raises(TypeError if "floor" in kwargs else ValueError, match=match):
        DensityBudget(SBMConv(8, 4), target=0.1, **kwargs)


def test_budget_needs_an_sbm_layer_and_a_forward():
    with pytest.raises(ValueError, match="no SBM attention layer"):
        DensityBudget(torch.nn.Linear(2, 2), target=0.1)
    with pytest.raises(ValueError, match="run the model first"):
        DensityBudget(SBMConv(8, 4), target=0.1).penalty()


def test_budget_state_round_trips():
    torch.manual_seed(0)
    conv = SBMConv(8, 4, num_clusters=3)
    budget = DensityBudget(conv, target=0.05)
    _forward(conv)
    for _ in range(3):
        budget.step()
    other = DensityBudget(conv, target=0.05)
    other.load_state_dict(budget.state_dict())
    assert torch.equal(other.lams, budget.lams)
    assert torch.equal(other.integral, budget.integral)
    assert other.steps == 3 and torch.equal(other.start, budget.start)
    with pytest.raises(ValueError, match="target"):
        DensityBudget(conv, target=0.2).load_state_dict(budget.state_dict())
