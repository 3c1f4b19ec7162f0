import pytest
import torch

from sbm_pyg.sampling import fastrg_torch
from sbm_pyg.sampling.fastrg_torch import sequence_max, sequence_reduce


@pytest.mark.parametrize("piece_rows", [3, 256])
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_sequence_reduce_is_the_per_sequence_reduction(monkeypatch, piece_rows,
                                                       reduce):
    # Ragged sequences with empty ones first, between and last, lengths
    # below, at and across a piece's rows.
    monkeypatch.setattr(fastrg_torch, "PIECE_ROWS", piece_rows)
    lengths = [0, 7, 0, 1, 3, 4, 600, 0, 256, 257, 0]
    ptr = torch.tensor([0] + lengths).cumsum(0)
    x = torch.randn(int(ptr[-1]), 2, 3, dtype=torch.float64, device="cpu",
                    generator=torch.Generator().manual_seed(0)).to(ptr.device)
    out = sequence_reduce(x, ptr, reduce)
    assert out.shape == (len(lengths), 2, 3)
    for g, (lo, hi) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist())):
        if hi == lo:  # torch.segment_reduce's empty values
            assert bool((out[g] == (0.0 if reduce == "sum" else -torch.inf)).all())
        elif reduce == "sum":
            torch.testing.assert_close(out[g], x[lo:hi].sum(0), rtol=1e-13,
                                       atol=1e-13)
        else:
            assert torch.equal(out[g], x[lo:hi].amax(0))


def test_sequence_max_of_empty_sequences_is_zero():
    ptr = torch.tensor([0, 0, 2, 2])
    memb = torch.tensor([[0.5], [0.25]])[:, None]
    assert sequence_max(memb, ptr).flatten().tolist() == [0.0, 0.5, 0.0]


def test_sequence_reduce_without_rows_or_sequences():
    for ptr in (torch.tensor([0]), torch.tensor([0, 0, 0])):
        out = sequence_reduce(torch.zeros(0, 2), ptr, "sum")
        assert out.shape == (ptr.numel() - 1, 2)
