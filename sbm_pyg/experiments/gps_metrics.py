r"""GraphGPS's loss and metric on PATTERN and CLUSTER."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["weighted_cross_entropy", "accuracy_sbm"]


def weighted_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    r"""GraphGPS's loss on PATTERN and CLUSTER: cross-entropy with each
    class weighted by :math:`(V - V_c) / V` in the batch (:math:`V` nodes,
    :math:`V_c` of class :math:`c`; absent classes weigh 0)."""
    counts = torch.bincount(target, minlength=logits.size(1)).float()
    weight = (target.numel() - counts) / target.numel() * (counts > 0)
    return F.cross_entropy(logits, target, weight=weight)


def accuracy_sbm(pred: Tensor, target: Tensor, num_classes: int) -> float:
    r"""GraphGPS's ``accuracy-SBM``: the mean over classes of each class's
    recall (correct predictions among its nodes), over a whole split;
    classes without nodes count as 0, as there."""
    correct = torch.bincount(target[pred == target], minlength=num_classes)
    total = torch.bincount(target, minlength=num_classes)
    recall = correct.double() / total.clamp_min(1)
    return float(recall.sum() / num_classes)
