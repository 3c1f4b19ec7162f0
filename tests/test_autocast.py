"""Every layer under torch.autocast: it runs, the sparse kernels and the
sampler compute in float32 (torch's CSR kernels have no half precision),
outputs take autocast's dtype, and gradients are finite and close to the
float32 ones."""
import pytest
import torch

from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import SBMConv, SBMGPSConv, SBMMultiheadAttention
from sbm_pyg.ops import backend_info
from tests.helpers import pin_crossover, seeded

BATCH = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
DRAWS = 9


def dtypes():
    device = torch.get_default_device().type
    return [torch.bfloat16] + ([torch.float16] if device == "cuda" else [])


def layers():
    torch.manual_seed(0)
    return {
        "SBMConv": (SBMConv(8, 4, heads=2, num_clusters=4),
                    lambda m, g: m(torch.randn(9, 8, generator=seeded(1)),
                                   BATCH, generator=g)),
        "SBMMultiheadAttention": (
            SBMMultiheadAttention(8, 2, 4, 4),
            lambda m, g: m(torch.randn(2, 5, 8, generator=seeded(1)), mask=MASK,
                           generator=g)),
        "SBMGPSConv": (
            SBMGPSConv(8, None, heads=2, norm=None,
                       attn_kwargs=dict(num_clusters=4)),
            lambda m, g: m(torch.randn(9, 8, generator=seeded(1)),
                           torch.tensor([[0, 1], [1, 0]]), BATCH,
                           generator=g)),
        "SBMTransformer": (
            SBMTransformer(10, 6, channels=8, heads=2, num_clusters=4, mode="exact"),
            lambda m, g: m(torch.randint(1, 10, (2, 5), generator=seeded(1)),
                           MASK, generator=g).token_logits),
    }


def _relative_error(got, want):
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("regime", ["sparse", "dense"])
@pytest.mark.parametrize("name", ["SBMConv", "SBMMultiheadAttention",
                                  "SBMGPSConv", "SBMTransformer"])
@pytest.mark.parametrize("dtype", dtypes())
def test_layers_under_autocast(name, dtype, regime, monkeypatch):
    # Each regime pinned: "auto" chooses it from the expected density, which
    # half precision rounds, so a head near the crossover would take the
    # other kernel (the same distribution, other draws for one seed).
    if regime == "dense" and not backend_info.dense_runs(
            torch.get_default_device()):
        pytest.skip("no dense-regime kernel on this device")
    pin_crossover(monkeypatch, 0.0 if regime == "dense" else float("inf"))
    module, forward = layers()[name]
    device = torch.get_default_device().type
    # The SBM attention's parameters: the rest of each model is torch's own
    # autocast behaviour (e.g. ReLUs that flip with bf16 rounding).
    conv = next(m for m in module.modules() if isinstance(m, SBMConv))
    params = list(conv.parameters())
    is_sbm = [any(p is q for q in conv.sbm.parameters()) for p in params]
    errors = []
    for draw in range(DRAWS):
        ref = forward(module, seeded(2 + draw))  # float32, same seed
        ref_grads = torch.autograd.grad(ref.sum(), params)
        with torch.autocast(device, dtype=dtype):
            out = forward(module, seeded(2 + draw))
        # The attention layers end in a Linear, which autocast casts; GPS
        # ends in a residual sum with its float32 input, which promotes.
        assert out.dtype == (torch.float32 if name == "SBMGPSConv" else dtype)
        grads = torch.autograd.grad(out.float().sum(), params)
        assert all(g.dtype == torch.float32 and torch.isfinite(g).all()
                   for g in grads)
        # Relative errors of the output, the projections' and the SBM's
        # gradients (the latter through the straight-through estimator).
        errors.append([_relative_error(out.float(), ref)] + [
            _relative_error(*(torch.cat([g.flatten() for g, s in zip(gs, is_sbm)
                                         if s == group]) for gs in (grads, ref_grads)))
            for group in (False, True)])
    # Half precision memberships move the sampled probabilities, so for the
    # same seed an edge near its threshold can flip and take one draw's
    # error to 40%: over 40 seeds, 0-3 draws per layer and measure were
    # above 10%. The median of DRAWS = 9 draws is robust to those: over 10
    # groups of 9 seeds (bfloat16 on the CPU, every layer and regime) the
    # largest median was 0.0096 for the output and the projections'
    # gradients and 0.0245 for the SBM's (whose straight-through gradient
    # sums over the flipped edges); the bounds leave 1.5x of that: a
    # planted 2% scale of the attention's output in bfloat16 failed 5 of the
    # 8 cases (the bound of 0.1 before: none), the rest diluted by residual
    # sums.
    medians = torch.tensor(errors).median(0).values
    bounds = (0.015, 0.015, 0.04)
    for what, median, bound in zip(
            ("output", "projection gradients", "SBM gradients"),
            medians.tolist(), bounds):
        assert median <= bound, f"{what}: median relative error {median:.4f}"
