r"""The losses over a whole model's SBM layers: the paper's sparsity
regularizer, a controller that holds the attention's density to a budget
with it, and the attention distillation's sum. They sit above the layers
(they walk a model for its :class:`~sbm_pyg.nn.SBMConv` layers); the
per-layer distillation is :mod:`sbm_pyg.nn.distillation`, below them."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Union

import torch
from torch import Tensor

from sbm_pyg.nn.conv import SBMConv

__all__ = ["density_loss", "DensityBudget", "distillation_loss"]


def _sbm_convs(model: torch.nn.Module) -> List[SBMConv]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    convs = [m for m in model.modules() if isinstance(m, SBMConv)]
    if not convs:
        raise ValueError("model has no SBM attention layer (SBMConv, "
                         "SBMMultiheadAttention or SBMGPSConv)")
    return convs


def _head_densities(convs: List[SBMConv], caller: str) -> List[Tensor]:
    # The expected density of each layer's heads [H] of the last forward
    # (differentiable), in module order.
    densities = [conv.expected_density for conv in convs]
    if any(d is None for d in densities):
        raise ValueError(f"{caller} reads the expected density of the last "
                         f"forward pass: run the model first")
    return [d.reshape(-1) for d in densities if d is not None]


def density_loss(model: torch.nn.Module) -> Tensor:
    r"""The density penalty :math:`L_s` of the paper: the mean expected
    density, over every SBM attention layer and head in :obj:`model`, of
    their last forward pass,

    .. math::
        L_s = \frac{1}{L H} \sum_{l, h} \frac{1}{n_q n_k}
        \sum_{i, j} p^{(l, h)}_{ij},

    differentiable in the SBMs' parameters. Train with
    :obj:`task_loss + lam * density_loss(model)` after the forward pass.

    Args:
        model (torch.nn.Module): any module holding :class:`SBMConv` layers
            (directly, or in :class:`SBMMultiheadAttention` or
            :class:`SBMGPSConv`).

    Returns:
        A scalar tensor.

    Example:
        >>> from sbm_pyg.nn import SBMMultiheadAttention
        >>> model = torch.nn.Sequential(SBMMultiheadAttention(16, heads=2, head_channels=8))
        >>> out = model(torch.randn(2, 5, 16))
        >>> density_loss(model).shape
        torch.Size([])
    """
    return torch.cat(_head_densities(_sbm_convs(model), "density_loss")).mean()


class DensityBudget:
    r"""Holds the mean expected attention density of a model's SBM heads at
    a budget :math:`\rho` by adjusting the density penalty :math:`\lambda`
    of the paper's loss as training goes.

    :math:`\lambda` is the multiplier of the constraint
    :math:`L_s \le \rho_t`, set by a proportional-integral controller on the
    log of the density's ratio to the budget, in log space because the
    :math:`\lambda` that a budget needs spans decades from one task to
    another:

    .. math::
        e_t = \mathrm{clip}\Big(\log \frac{\bar{d}_t}{\rho_t}, -1, 1\Big),
        \qquad s_t = s_{t-1} + e_t, \qquad
        \lambda_t = \lambda_0 \exp(k_i s_t + k_p e_t)

    where :math:`\bar{d}_t` is the mean expected density (the
    differentiable :math:`L_s`, detached) of the step's forward pass.
    :math:`s` is clipped so that :math:`\lambda \in [\lambda_{\min},
    \lambda_{\max}]`, bounded; :math:`\lambda_{\min}` is :math:`\lambda_0`
    unless given. The penalty acts only beyond the budget (below), so a
    multiplier that is not needed costs nothing where it stays, and one
    kept at :math:`\lambda_0` acts at once when it is needed, where one
    wound down while idle would take hundreds of steps to come back.

    Two things keep the density from falling through the budget, which a
    head cannot always climb back from (at a low density the sampled edges
    carry little gradient): the penalty acts only above the budget,
    :math:`\lambda (L_s - \rho_t)_+`, so that it stops the step the
    density reaches it, and the budget comes down over :obj:`warmup`
    steps, geometrically from the density of the first step to
    :math:`\rho`, rather than at once (Adam moves the SBM at its learning
    rate whatever :math:`\lambda` is, so a step change overshoots). With
    :obj:`delay`, the budget does not act for that many steps (no penalty,
    :math:`\lambda` kept), and the warm-up starts from the density it then
    finds: for a dense warm-up, in which the attention learns the task on
    every pair (and, with attention distillation, the SBM learns where it
    goes) before the budget takes edges away. A penalty in that time would
    pull at the queries and keys the attention is learning, through the
    memberships.

    With :obj:`floor` (the default) a second multiplier
    :math:`\lambda^-_t`, from the same law on :math:`\log(\rho_t /
    \bar{d}_t)`, holds the constraint :math:`L_s \ge \rho_t` with the
    penalty :math:`\lambda^- (\rho_t - L_s)_+`, so that the density
    settles at the budget rather than anywhere below it: a task whose own
    gradient lowers the density (the repeated-token task before it is
    learned, docs/experiments.md) would otherwise take a head down to no
    edges, where it learns nothing. Both multipliers are :math:`\ge 0`;
    without :obj:`floor` the budget is a ceiling only.

    With per-head budgets (a :obj:`target` of shape :obj:`[L, H]`, or a
    number with :obj:`per_head`) each head has its own multipliers, density
    and penalty, and the penalty is the mean over heads: a mean budget lets
    the heads trade edges, so that one head may take most of them while
    another, whose few needed keys matter, is left none.

    :meth:`penalty` is to be added to the loss after the forward pass;
    :meth:`step`, after the optimizer's step, updates :math:`\lambda` from
    that forward pass. Both run on the densities' device without reading
    them back; under :mod:`torch.distributed` the densities are averaged over
    the ranks so that every rank keeps the same :math:`\lambda`.

    Args:
        model (torch.nn.Module): any module holding :class:`SBMConv` layers.
        target (float or Tensor): the budget :math:`\rho \in (0, 1]`, or
            one per layer and head :obj:`[L, H]` (layers in module order).
        warmup (int): steps over which the budget comes down to
            :math:`\rho`. (default: :obj:`0`)
        floor (bool): also keep the density from falling below the budget.
            (default: :obj:`True`)
        lam (float): the starting :math:`\lambda_0 > 0`.
            (default: :obj:`1e-3`)
        kp (float): proportional gain :math:`k_p \ge 0`. (default: :obj:`1.0`)
        ki (float): integral gain :math:`k_i > 0`, per step.
            (default: :obj:`0.02`)
        lam_min (float, optional): smallest :math:`\lambda` (default:
            :obj:`lam`: see above).
        lam_max (float): largest :math:`\lambda`. (default: :obj:`100.0`)
        delay (int): steps before the budget acts; the warm-up then starts
            from that step's density. (default: :obj:`0`)
        per_head (bool): hold every head to a number :obj:`target`, not
            their mean. (default: :obj:`False`)

    Example:
        >>> from sbm_pyg.nn import SBMMultiheadAttention
        >>> model = torch.nn.Sequential(SBMMultiheadAttention(16, heads=2, head_channels=8))
        >>> budget = DensityBudget(model, target=0.1, warmup=100)
        >>> optimizer = torch.optim.Adam(model.parameters())
        >>> loss = model(torch.randn(2, 5, 16)).square().mean()
        >>> (loss + budget.penalty()).backward()
        >>> optimizer.step()
        >>> budget.step()
        >>> budget.lam.shape
        torch.Size([])
    """

    def __init__(self, model: torch.nn.Module, target: Union[float, Tensor],
                 warmup: int = 0, floor: bool = True, lam: float = 1e-3,
                 kp: float = 1.0,
                 ki: float = 0.02, lam_min: Optional[float] = None,
                 lam_max: float = 100.0, delay: int = 0, per_head: bool = False):
        self.convs = _sbm_convs(model)
        heads = [conv.heads for conv in self.convs]
        if not isinstance(per_head, bool):
            raise TypeError(f"per_head must be a bool, got {type(per_head).__name__}")
        if per_head and not isinstance(target, Tensor):
            if not isinstance(target, (int, float)) or isinstance(target, bool):
                raise TypeError(f"target must be a float or a tensor, got "
                                f"{type(target).__name__}")
            if len(set(heads)) > 1:
                raise ValueError(f"per_head needs every SBM layer to have the "
                                 f"same number of heads, got {heads}")
            target = torch.full((len(heads), heads[0]), float(target))
        if isinstance(target, Tensor):
            if target.dtype.is_complex or not target.dtype.is_floating_point:
                raise TypeError(f"target must be a float tensor, got {target.dtype}")
            if len(set(heads)) > 1 or target.shape != (len(heads), heads[0]):
                raise ValueError(
                    f"target must be a number or a [layers, heads] tensor "
                    f"({len(heads)} SBM layers with {heads} heads), got "
                    f"shape {tuple(target.shape)}")
            values = target.detach().double().flatten().tolist()
        elif isinstance(target, (int, float)) and not isinstance(target, bool):
            values = [float(target)]
        else:
            raise TypeError(f"target must be a float or a tensor, got "
                            f"{type(target).__name__}")
        if not all(0.0 < v <= 1.0 for v in values):  # NaN fails too
            raise ValueError(f"target must lie in (0, 1], got {target!r}")
        for name, count in (("warmup", warmup), ("delay", delay)):
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"{name} must be an int >= 0, got {count!r}")
        lam_min = lam if lam_min is None else lam_min
        for name, value, low in (("lam", lam, 0.0), ("ki", ki, 0.0),
                                 ("lam_min", lam_min, 0.0)):
            if not isinstance(value, (int, float)) or not value > low \
                    or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number > {low}, got {value!r}")
        if not isinstance(kp, (int, float)) or not 0.0 <= kp < math.inf:
            raise ValueError(f"kp must be a finite number >= 0, got {kp!r}")
        if not isinstance(lam_max, (int, float)) or not lam_min <= lam <= lam_max \
                or not math.isfinite(lam_max):
            raise ValueError(f"need lam_min <= lam <= lam_max (finite), got "
                             f"{lam_min!r}, {lam!r}, {lam_max!r}")
        if not isinstance(floor, bool):
            raise TypeError(f"floor must be a bool, got {type(floor).__name__}")
        self.warmup, self.floor, self.kp, self.ki = warmup, floor, float(kp), float(ki)
        self.delay = delay
        self.lam0, self.lam_min, self.lam_max = float(lam), float(lam_min), float(lam_max)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.per_head = isinstance(target, Tensor)
        shape = (len(heads), heads[0]) if self.per_head else ()
        self.target = torch.tensor(values, dtype=torch.float64,
                                   device=device).view(shape)
        # Row 0 the ceiling's, row 1 the floor's (with floor).
        self.integral = torch.zeros((1 + floor, *shape), dtype=torch.float64,
                                    device=device)
        self.lams = torch.full_like(self.integral, self.lam0)
        # The budget's start (the first step's density, or rho if below),
        # and the steps taken: the warm-up's position.
        self.start: Optional[Tensor] = None
        self.steps = 0
        self._density: Optional[Tensor] = None

    def density(self) -> Tensor:
        r"""The densities the budget holds, of the last forward:
        :obj:`[]` (their mean over layers and heads) or :obj:`[L, H]`
        with per-head budgets; differentiable."""
        densities = _head_densities(self.convs, "DensityBudget")
        return torch.stack(densities) if self.per_head else torch.cat(densities).mean()

    @property
    def lam(self) -> Tensor:
        r"""The ceiling's :math:`\lambda`: :obj:`[]`, or :obj:`[L, H]` with
        per-head budgets."""
        return self.lams[0]

    @property
    def lam_floor(self) -> Optional[Tensor]:
        r"""The floor's :math:`\lambda^-` (:obj:`None` without
        :obj:`floor`)."""
        return self.lams[1] if self.floor else None

    def current_target(self) -> Tensor:
        r"""The budget :math:`\rho_t` of this step: on the way down from
        the density of the first step after the delay during the warm-up,
        then :math:`\rho` (before that, :math:`\rho`, which no penalty
        enforces)."""
        if self.start is None or self.steps >= self.delay + self.warmup:
            return self.target
        left = 1.0 - (self.steps - self.delay) / self.warmup
        return self.target * (self.start / self.target) ** left

    def penalty(self) -> Tensor:
        r""":math:`\lambda (L_s - \rho_t)_+ + \lambda^- (\rho_t - L_s)_+` of
        the last forward pass (the mean over heads with per-head budgets): a
        scalar, differentiable in the SBMs; the multipliers are constants of
        it."""
        density = self.density()
        self._density = density.detach()
        if self.steps < self.delay:
            return density.sum() * 0.0
        self._begin(self._density)
        over = density - self.current_target().to(density)
        sides = torch.stack([over, -over][:1 + self.floor]).clamp(min=0)
        return (self.lams.to(density) * sides).sum(0).mean()

    def _begin(self, density: Tensor) -> None:
        # The warm-up starts from the first density seen (rho if below it).
        if self.start is None:
            self.start = torch.maximum(density.to(self.target), self.target)

    @torch.no_grad()
    def step(self) -> None:
        r"""Updates :math:`\lambda` from the densities :meth:`penalty` saw
        (or, without a :meth:`penalty` call since the last step, those of the
        last forward pass)."""
        density = self._density if self._density is not None else \
            self.density().detach()
        self._density = None
        density = density.to(self.target.device, torch.float64)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            density = density.clone()
            torch.distributed.all_reduce(density)
            density /= torch.distributed.get_world_size()
        if self.steps < self.delay:
            self.steps += 1
            return
        self._begin(density)
        # Clipped: a head far from its budget (or whose density underflowed)
        # moves lambda no faster than one near it.
        error = torch.log(density.clamp(min=1e-12) / self.current_target())
        error = torch.stack([error, -error][:1 + self.floor]).clamp(-1.0, 1.0)
        low = math.log(self.lam_min / self.lam0) / self.ki
        high = math.log(self.lam_max / self.lam0) / self.ki
        self.integral = (self.integral + error).clamp(low, high)
        log_lam = math.log(self.lam0) + self.ki * self.integral + self.kp * error
        self.lams = log_lam.exp().clamp(self.lam_min, self.lam_max)
        self.steps += 1

    def state_dict(self) -> Dict[str, Any]:
        r"""The controller's state (for a checkpoint): tensors and numbers."""
        return dict(target=self.target.cpu(), integral=self.integral.cpu(),
                    lams=self.lams.cpu(), steps=self.steps,
                    start=None if self.start is None else self.start.cpu(),
                    warmup=self.warmup, delay=self.delay, floor=self.floor,
                    lam0=self.lam0,
                    kp=self.kp, ki=self.ki,
                    lam_min=self.lam_min, lam_max=self.lam_max)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Restores :meth:`state_dict`; the budget and gains must match."""
        state = dict(state, delay=state.get("delay", 0))  # saved before delay
        for key in ("warmup", "delay", "floor", "lam0", "kp", "ki", "lam_min",
                    "lam_max"):
            if state[key] != getattr(self, key):
                raise ValueError(f"the saved budget has {key}={state[key]!r}, "
                                 f"this one {getattr(self, key)!r}")
        if not torch.equal(state["target"].to(self.target), self.target):
            raise ValueError(f"the saved budget has target "
                             f"{state['target'].tolist()}, this one "
                             f"{self.target.tolist()}")
        self.integral = state["integral"].to(self.integral)
        self.lams = state["lams"].to(self.lams)
        self.steps = state["steps"]
        self.start = None if state["start"] is None else state["start"].to(self.target)

    def __repr__(self) -> str:
        target = self.target.tolist()
        return (f"{self.__class__.__name__}(target={target}, "
                f"warmup={self.warmup}, delay={self.delay}, "
                f"floor={self.floor}, lam={self.lam0}, "
                f"kp={self.kp}, "
                f"ki={self.ki})")


def distillation_loss(model: torch.nn.Module) -> Tensor:
    r"""The attention distillation of every SBM attention layer in
    :obj:`model` with :obj:`distill > 0`, from their last forward pass in
    training: :math:`\sum_l \beta_l \frac{1}{H} \sum_h \mathcal{L}_{l,h}`
    (:func:`attention_distillation`), :math:`\beta_l` the layer's
    :obj:`distill`. Train with :obj:`task_loss + distillation_loss(model)`
    after the forward pass; 0 where no layer distils.

    Args:
        model (torch.nn.Module): any module holding
            :class:`~sbm_pyg.nn.SBMConv` layers.

    Returns:
        A scalar tensor.

    Example:
        >>> from sbm_pyg.nn import SBMMultiheadAttention
        >>> model = SBMMultiheadAttention(16, heads=2, head_channels=8,
        ...                               num_clusters=4, distill=0.1)
        >>> out = model(torch.randn(2, 5, 16))
        >>> distillation_loss(model).shape
        torch.Size([])
    """
    terms: List[Tensor] = []
    for conv in _sbm_convs(model):
        if conv.distill > 0 and conv.distillation is not None:
            terms.append(conv.distill * conv.distillation.mean())
    if not terms:
        param = next(model.parameters(), None)
        return torch.zeros((), device=None if param is None else param.device)
    return torch.stack(terms).sum()
