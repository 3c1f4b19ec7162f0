"""The CUDA sampler's key masses and maxima per sequence (Triton kernels,
run on CPU tensors under TRITON_INTERPRET=1)."""
import pytest
import torch

from sbm_pyg.ops import triton_runs
from sbm_pyg.sampling import key_masses as masses
from tests.markers import needs_triton

pytestmark = [needs_triton, pytest.mark.skipif(
    not triton_runs(torch.device("cpu")),
    reason="the kernels run on CPU tensors under TRITON_INTERPRET=1")]


@pytest.mark.parametrize("lengths", [(3, 0, 2), (600, 0, 1, 256, 257)])
def test_key_masses_sum_and_max_each_sequence(monkeypatch, lengths):
    # Sequences within one piece, empty, of exactly one piece and spilling
    # into a second (pieces of 256 keys): the float64 sums and the maxima
    # (at least 0) of each (sequence, head, cluster), three heads of five
    # clusters: columns past a tile of 64 are masked, as a wider H k is.
    g = torch.Generator().manual_seed(0)
    Z = torch.rand(sum(lengths), 3, 5, generator=g) - 0.1
    ptr = torch.tensor([0, *lengths]).cumsum(0)
    mass = masses.key_masses(Z, ptr)
    assert mass.shape == (2, len(lengths), 3, 5) and mass.dtype == torch.float64
    for s, (a, b) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist())):
        zs = Z[a:b].double()
        torch.testing.assert_close(mass[0, s], zs.sum(0), rtol=1e-14, atol=1e-14)
        top = zs.amax(0).clamp(min=0) if b > a else torch.zeros(3, 5)
        assert torch.equal(mass[1, s], top.double())
    monkeypatch.setattr(masses, "MASS_COLUMNS", 8)  # two tiles
    assert torch.equal(masses.key_masses(Z, ptr), mass)


def test_key_masses_without_keys_or_sequences():
    assert masses.key_masses(torch.zeros(0, 2, 3), torch.tensor([0, 0])
                                    ).tolist() == [[[[0.0] * 3] * 2]] * 2
    assert masses.key_masses(torch.zeros(0, 2, 3), torch.tensor([0])
                                    ).shape == (2, 0, 2, 3)
