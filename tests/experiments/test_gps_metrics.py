"""GraphGPS's loss and metric (sbm_pyg/experiments/gps_metrics.py), on small
fixed inputs."""
import pytest
import torch

from sbm_pyg.experiments.gps_metrics import accuracy_sbm, weighted_cross_entropy
from tests.helpers import seeded


def test_accuracy_sbm_is_the_mean_per_class_recall():
    target = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 0, 0])
    # recalls 3/4, 1/2, 0/2: their mean, not the 4/8 of plain accuracy.
    assert accuracy_sbm(pred, target, 3) == pytest.approx((0.75 + 0.5 + 0) / 3)
    # A class without nodes counts as 0 (GraphGPS divides by every class).
    assert accuracy_sbm(pred[:6], target[:6], 3) == pytest.approx((0.75 + 0.5) / 3)


def test_weighted_cross_entropy_weighs_classes_by_the_others_share():
    logits = torch.randn(5, 3, generator=seeded(0))
    target = torch.tensor([0, 0, 0, 1, 1])  # class 2 absent: weight 0
    w = torch.tensor([2 / 5, 3 / 5, 0.0])
    nll = -logits.log_softmax(1)[torch.arange(5), target]
    want = (w[target] * nll).sum() / w[target].sum()
    torch.testing.assert_close(weighted_cross_entropy(logits, target), want)
