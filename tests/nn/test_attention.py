import copy

import pytest
import torch

from sbm_pyg.nn import SBMMultiheadAttention
from tests import published_reference
from tests.helpers import seeded

MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).bool()


def make_attn():
    torch.manual_seed(0)
    return SBMMultiheadAttention(16, heads=2, head_channels=8, num_clusters=4)


def run(attn, x, mask=None, seed=0):
    return attn(x, mask=mask, generator=seeded(seed))


def x_input(seed=1):
    return torch.randn(3, 5, 16, generator=seeded(seed))


def test_shape_and_repr():
    attn = make_attn()
    assert run(attn, x_input(), MASK).shape == (3, 5, 16)
    assert repr(attn) == ("SBMMultiheadAttention(16, heads=2, head_channels=8, "
                          "num_clusters=4)")


def test_padding_neither_sends_nor_receives():
    attn = make_attn()
    x = x_input()
    out = run(attn, x, MASK)
    assert torch.all(out[~MASK] == 0)
    noisy = x.clone()
    noisy[~MASK] = 1e3 * torch.randn(int((~MASK).sum()), 16)
    assert torch.equal(run(attn, noisy, MASK), out)


def test_equals_sbmconv_on_the_ragged_batch():
    attn = make_attn()
    x = x_input()
    ptr = torch.tensor([0, 3, 8, 9])
    ragged = attn.conv(x[MASK], ptr=ptr, generator=seeded(0))
    assert torch.allclose(run(attn, x, MASK)[MASK], attn.out(ragged))
    assert attn.sampled_density.shape == (2,)
    assert attn.expected_density.requires_grad


def test_no_mask_equals_all_true_mask():
    attn = make_attn()
    x = x_input()
    full = torch.ones(3, 5, dtype=torch.bool)
    assert torch.allclose(run(attn, x), run(attn, x, full))


def test_training_step_changes_parameters():
    attn = make_attn()
    attn.train()
    opt = torch.optim.SGD(attn.parameters(), lr=0.1)
    before = attn.conv.sbm.clusters.clone()
    out = run(attn, x_input(), MASK)
    (out.pow(2).mean() + 0.1 * attn.expected_density.mean()).backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)
    opt.step()
    assert not torch.equal(before, attn.conv.sbm.clusters)


@pytest.mark.parametrize("mask,match", [
    (MASK.long(), "mask"), (MASK[:, :4], "mask"),
])
def test_bad_mask(mask, match):
    with pytest.raises(ValueError, match=match):
        run(make_attn(), x_input(), mask)


def test_key_padding_mask_takes_pytorchs_convention():
    # True = padding, as nn.MultiheadAttention takes it: the same output as
    # the mask of real tokens; both at once, or a sequence left without a
    # token (e.g. PyTorch's convention passed as mask), raise.
    attn = make_attn()
    x = x_input()
    want = run(attn, x, MASK)
    got = attn(x, key_padding_mask=~MASK, generator=seeded(0))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="not both"):
        attn(x, mask=MASK, key_padding_mask=~MASK)
    with pytest.raises(ValueError, match="key_padding_mask must be a bool"):
        attn(x, key_padding_mask=(~MASK).long())
    no_token = MASK.clone()
    no_token[2] = False
    with pytest.raises(ValueError, match="sequence 2 without a real token"):
        run(attn, x, no_token)
    assert "key_padding_mask" in SBMMultiheadAttention.forward.__doc__


def test_a_mask_by_position_is_refused():
    # PyTorch's padding mask passed where PyG's mask goes would invert
    # silently (real tokens attended as padding): by position, neither.
    attn = make_attn()
    with pytest.raises(TypeError, match="mask=.*key_padding_mask="):
        attn(x_input(), ~MASK)


def test_bad_x():
    with pytest.raises(ValueError, match="channels"):
        run(make_attn(), torch.randn(3, 5, 8))


@pytest.mark.parametrize("ste,scale", [("paper", 1.0), ("published", 1.0),
                                       ("published", 30.0)])
def test_matches_the_published_dense_head(ste, scale):
    # Same weights, same mask: outputs and every parameter's gradient equal
    # the dense reference of the published head (tests/published_reference).
    # scale=30 makes some mask gradients exceed 1, so the clip is exercised.
    torch.manual_seed(0)
    attn = SBMMultiheadAttention(16, heads=2, head_channels=8, num_clusters=4,
                                 qkv_bias=True, ste=ste).double()
    ref_attn = copy.deepcopy(attn)
    graphs = []
    attn.conv.register_graph_hook(lambda module, graph: graphs.append(graph))
    x = x_input().double().requires_grad_()
    weight = scale * torch.randn(3, 5, 16, generator=seeded(5), dtype=torch.float64)
    out = run(attn, x, MASK)
    (out * weight).sum().backward()
    mask = published_reference.dense_mask(graphs[0], MASK)
    # The sample must hold empty and multi-edge rows of real queries.
    degree = mask.sum(-1).transpose(1, 2)[MASK]  # [real queries, H]
    assert bool((degree == 0).any()) and bool((degree > 1).any())
    x_ref = x.detach().clone().requires_grad_()
    ref = published_reference.attention(ref_attn.conv, ref_attn.out, x_ref, MASK,
                                         mask, ste)
    assert torch.allclose(out, ref, atol=1e-12)
    (ref * weight).sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-12)
    for (name, p), q in zip(attn.named_parameters(), ref_attn.parameters()):
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
        assert torch.allclose(p.grad, q.grad, atol=1e-12), name
