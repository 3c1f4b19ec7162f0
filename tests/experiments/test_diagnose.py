import pytest
import torch

from sbm_pyg.experiments.diagnose import _pair_classes, repeat_diagnostics
from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer


def test_pair_classes():
    tokens = torch.tensor([[3, 1, 3]])
    assert _pair_classes(tokens).tolist() == [[[0, 2, 1], [2, 0, 2], [1, 2, 0]]]


def test_repeat_diagnostics_counts_agree():
    torch.manual_seed(0)
    model = SBMTransformer(17, 16, channels=8, heads=2, num_clusters=4, mode="exact")
    stats = repeat_diagnostics(model, batch=4, seed=3)
    tokens, _ = repeat_batch(4, 16, torch.Generator().manual_seed(3))
    classes = _pair_classes(tokens)
    for ste in ("paper", "published"):
        for c, name in enumerate(("self", "same_token", "other")):
            pairs = 2 * int((classes == c).sum())  # two heads
            edges = stats[ste][name]["sampled_edges"]
            # Both passes and the probability pass sample the same graphs.
            assert edges == round(stats["probability"][name]["sampled_fraction"]
                                  * pairs)
            assert 0 <= stats[ste][name]["descent_raises_p"] <= 1
    assert stats["paper"]["other"]["mean_grad"] != \
        stats["published"]["other"]["mean_grad"]
    assert model.blocks[0].attention.conv.ste == "paper"  # restored


def test_repeat_diagnostics_needs_sbm():
    with pytest.raises(ValueError, match="SBM model"):
        repeat_diagnostics(SBMTransformer(5, 4, attention="full"))
