r"""The clusters an SBM's memberships use.

Where the memberships are sparse by construction (a token in its top
:math:`r` clusters, :class:`~sbm_pyg.nn.StochasticBlockModel`'s
:obj:`"sharp"` form), every product over the :math:`k` clusters (the
draws' :math:`\hat{\mathbf{Q}}\hat{\mathbf{S}}`, fastRG's tables, each
pair's probability and the straight-through gradients) needs only the
clusters some token of the head uses: with :math:`U_h` those of head
:math:`h`,

.. math::
    p_{ij} = \sum_{u, v \in U_h} \hat{Q}_{iu} \hat{S}_{uv} \hat{K}_{jv},

and the block's gradient is zero outside :math:`U_h \times U_h`.
:func:`compact_clusters` keeps those clusters: the same probabilities, so
the same law and outputs, at a width :math:`k' = \max_h |U_h|` in place of
:math:`k`. The memberships' gradients then reach only the kept clusters: a
zero membership's gradient, which a top-:math:`r` parametrization discards
(its zeros are not functions of the logits), is zero.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn.functional import check_sbm_shapes
from sbm_pyg.validation import sync

__all__ = ["used_clusters", "compact_clusters"]


def used_clusters(q_memb: Tensor, k_memb: Tensor) -> Tensor:
    r"""The clusters of each head that some query or key has a nonzero
    membership of: :obj:`[H, k]` bool, from memberships :obj:`[N_q, H, k]`
    and :obj:`[N_k, H, k]`."""
    return (q_memb != 0).any(0) | (k_memb != 0).any(0)


@torch.compiler.disable  # the width is read from the device
def compact_clusters(sbm: Tuple[Tensor, Tensor, Tensor],
                     width: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The SBM :obj:`sbm` over the clusters its memberships use
    (:func:`used_clusters`): memberships :obj:`[N_q, H, k']` and
    :obj:`[N_k, H, k']`, block :obj:`[H, k', k']`, each head's used
    clusters first in their order, a head that uses fewer padded with
    unused ones (their memberships zero); the SBM itself where all
    :math:`k` are kept. :obj:`width` is :math:`k'`
    (:obj:`None`: the most any head uses, read from the device, at least
    1); differentiable, as the module's text says.

    Example:
        >>> memb = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
        >>> block = torch.arange(9.0).view(1, 3, 3)
        >>> q, b, k = compact_clusters((memb, block, memb))
        >>> q[:, 0].tolist(), b[0].tolist()
        ([[1.0, 0.0], [0.0, 1.0]], [[4.0, 5.0], [7.0, 8.0]])
    """
    q_memb, block, k_memb = check_sbm_shapes(sbm)
    used = used_clusters(q_memb.detach(), k_memb.detach())
    H, k = used.shape
    if width is None:
        width = max(int(sync([], used.sum(-1).amax())[0]) if used.numel() else 0, 1)
    if not isinstance(width, int) or not 1 <= width <= k:
        raise ValueError(f"width must be an int in [1, {k}], got {width!r}")
    if width == k:  # every cluster kept, in its place
        return q_memb, block, k_memb
    # A stable sort of the unused flags: each head's used clusters first.
    order = torch.sort((~used).to(torch.uint8), dim=-1, stable=True).indices[:, :width]

    def columns(memb: Tensor) -> Tensor:
        return memb.gather(2, order[None].expand(memb.size(0), H, width))

    rows = block.gather(1, order[:, :, None].expand(H, width, k))
    return (columns(q_memb), rows.gather(2, order[:, None, :].expand(H, width, width)),
            columns(k_memb))
