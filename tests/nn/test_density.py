import pytest
import torch

from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import SBMConv, SBMGPSConv, density_loss


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
