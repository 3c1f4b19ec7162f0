import pytest
import torch

from sbm_pyg.experiments.diagnose import (
    pair_classes,
    repeat_diagnostics,
    sbm_probability,
)
from sbm_pyg.experiments.tasks import repeat_batch
from sbm_pyg.models import SBMTransformer
from tests.helpers import seeded


def test_pair_classes():
    tokens = torch.tensor([[3, 1, 3]])
    assert pair_classes(tokens).tolist() == [[[0, 2, 1], [2, 0, 2], [1, 2, 0]]]


def test_repeat_diagnostics_counts_agree():
    torch.manual_seed(0)
    model = SBMTransformer(17, 16, channels=8, heads=2, num_clusters=4, mode="exact")
    stats = repeat_diagnostics(model, batch=4, seed=3)
    tokens, _ = repeat_batch(4, 16, torch.Generator().manual_seed(3))
    classes = pair_classes(tokens)
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
    conv = model.blocks[0].attention.conv
    assert (conv.ste, conv.attention_backend) == ("paper", "auto")  # restored
    assert model.training


def test_sbm_probability_is_the_first_layers_sbm():
    # Formed by hand from the model's first steps: embeddings, norm, the
    # layer's projections and its SBM.
    torch.manual_seed(0)
    model = SBMTransformer(9, 8, channels=8, heads=2, num_clusters=4)
    tokens, _ = repeat_batch(3, 8, seeded(1))
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(8))
    flat = model.blocks[0].norm1(x).reshape(24, -1)
    conv = model.blocks[0].attention.conv
    q_memb, block, k_memb = conv.sbm(conv.lin_query(flat).view(-1, 2, 4),
                                     conv.lin_key(flat).view(-1, 2, 4))
    want = torch.einsum("bihu,huv,bjhv->bhij", q_memb.view(3, 8, 2, -1), block,
                        k_memb.view(3, 8, 2, -1))
    got = sbm_probability(model, tokens)
    assert got.shape == (3, 2, 8, 8)
    assert torch.allclose(got, want.detach(), atol=1e-6)


def test_repeat_diagnostics_needs_sbm():
    with pytest.raises(ValueError, match="SBM model"):
        repeat_diagnostics(SBMTransformer(5, 4, attention="full"))
