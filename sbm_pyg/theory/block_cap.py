r"""The block matrix's mass cap: how dense the paper's SBM can make many
disjoint blocks at once.

In the paper's parametrization :math:`\hat{\mathbf{S}} =
\mathrm{softmax}(\mathbf{C}\mathbf{C}^{\top})` sums to 1 over its
:math:`k^2` entries and every membership lies in :math:`[0, 1]`. Take any
:math:`V` queries :math:`i_1, \dots, i_V` and keys :math:`j_1, \dots, j_V`
(e.g. one query and one key of each of :math:`V` blocks), the within-block
mass :math:`T = \sum_t p_{i_t j_t}` and the cross mass :math:`X =
\sum_{s \ne t} p_{i_s j_t}`. Then

.. math::
    T \le \frac{1 + \sqrt{1 + 4X}}{2}, \qquad\text{equivalently}\qquad
    X \ge T (T - 1).

Proof: per cluster pair :math:`(u, v)` let :math:`x_t =
\hat{\mathbf{Q}}_{i_t u}`, :math:`y_t = \hat{\mathbf{K}}_{j_t v}` in
:math:`[0, 1]`, :math:`D_{uv} = \sum_t x_t y_t` and :math:`O_{uv} =
(\sum_s x_s)(\sum_t y_t) - D_{uv}`. As :math:`y_t \le 1`, :math:`D_{uv} \le
\sum_t x_t`, and likewise :math:`D_{uv} \le \sum_t y_t`, so :math:`O_{uv}
\ge D_{uv}^2 - D_{uv}`, i.e. :math:`D_{uv} \le g(O_{uv})` with :math:`g(o)
= (1 + \sqrt{1 + 4o}) / 2`, concave and increasing. :math:`T = \sum_{uv}
\hat{\mathbf{S}}_{uv} D_{uv}` and :math:`X = \sum_{uv}
\hat{\mathbf{S}}_{uv} O_{uv}` with weights :math:`\hat{\mathbf{S}}_{uv}
\ge 0` summing to 1, so by Jensen :math:`T \le \sum_{uv}
\hat{\mathbf{S}}_{uv} g(O_{uv}) \le g(X)`. :math:`\square`

Both ends are reached: disjoint one-hot supports give :math:`X = 0` and
:math:`T \le 1` (the :math:`V` blocks share one unit of mass); memberships
all 1 give :math:`p \equiv 1`, :math:`T = V`, :math:`X = V(V - 1)`.

So :math:`V` blocks each dense with probability :math:`p` need a mean cross
probability :math:`\varepsilon \ge p (V p - 1) / (V - 1)`: at :math:`p = 1`
every cross pair is sampled too. :func:`within_block_cap` gives the largest
mean within-block probability for a mean cross probability. The
mixed-membership parametrization (:obj:`parametrization="mmsb"` of
:class:`~sbm_pyg.nn.StochasticBlockModel`) has no such bound: one-hot
memberships on distinct clusters and a block matrix near the identity give
:math:`T \approx V` with :math:`X \approx 0`.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["within_block_cap", "block_masses"]


def within_block_cap(num_blocks: int, cross_probability: float = 0.0) -> float:
    r"""The largest mean within-block edge probability that the paper's
    parametrization allows for :obj:`num_blocks` (:math:`V`) blocks whose
    mean cross-block probability is :obj:`cross_probability`
    (:math:`\varepsilon`):
    :math:`\min\big(1, (1 + \sqrt{1 + 4 V (V - 1) \varepsilon}) / (2V)\big)`
    (the module's proposition with :math:`T = V p`, :math:`X = V (V - 1)
    \varepsilon`). :math:`1/V` for disjoint blocks.

    Example:
        >>> within_block_cap(41)  # the repeat task's blocks at N = 64
        0.024390243902439025
        >>> round(within_block_cap(41, 0.5), 3)  # half of the cross pairs
        0.711
    """
    if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) \
            or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
    if not isinstance(cross_probability, (int, float)) \
            or not 0 <= cross_probability <= 1:  # NaN fails too
        raise ValueError(f"cross_probability must lie in [0, 1], got "
                         f"{cross_probability!r}")
    V = num_blocks
    return min(1.0, (1 + math.sqrt(1 + 4 * V * (V - 1) * cross_probability))
               / (2 * V))


def block_masses(q_memb: Tensor, block: Tensor, k_memb: Tensor
                 ) -> tuple[Tensor, Tensor]:
    r"""The within-block mass :math:`T` and the cross mass :math:`X` of
    :math:`V` query–key pairs, per head: row :math:`t` of :obj:`q_memb` and
    of :obj:`k_memb` are the memberships of the pair's query and key, so
    :math:`T = \sum_t p_{tt}` and :math:`X = \sum_{s \ne t} p_{st}` with
    :math:`p_{st} = \hat{\mathbf{Q}}_s \hat{\mathbf{S}}_h
    \hat{\mathbf{K}}_t^{\top}`. Under the paper's parametrization
    :math:`T \le (1 + \sqrt{1 + 4X})/2` (the module's proposition).

    Args:
        q_memb (Tensor): :obj:`[V, H, k]`.
        block (Tensor): :obj:`[H, k, k]`.
        k_memb (Tensor): :obj:`[V, H, k]`.

    Returns:
        :obj:`(T, X)`, each :obj:`[H]`.

    Example:
        >>> eye = torch.eye(3)[:, None]  # 3 pairs on 3 distinct clusters
        >>> T, X = block_masses(eye, torch.eye(3)[None], eye)
        >>> T, X  # 3 dense blocks, nothing across: beyond the paper's cap
        (tensor([3.]), tensor([0.]))
    """
    for name, t in (("q_memb", q_memb), ("block", block), ("k_memb", k_memb)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor")
    if q_memb.shape != k_memb.shape or block.shape != (
            q_memb.size(1), q_memb.size(2), q_memb.size(2)):
        raise ValueError(f"q_memb and k_memb must be [V, H, k] and block "
                         f"[H, k, k], got {tuple(q_memb.shape)}, "
                         f"{tuple(block.shape)}, {tuple(k_memb.shape)}")
    p = torch.einsum("shu,huv,thv->hst", q_memb, block, k_memb)  # [H, V, V]
    within = p.diagonal(dim1=1, dim2=2).sum(-1)
    return within, p.sum((1, 2)) - within
