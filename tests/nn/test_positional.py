import math

import pytest
import torch
from torch_geometric.data import Data

from sbm_pyg.nn import AddLaplacianPE, LapPEEncoder
from tests.helpers import seeded


def _path(n):
    i = torch.arange(n - 1)
    return torch.stack([torch.cat([i, i + 1]), torch.cat([i + 1, i])])


def test_laplacian_pe_of_a_path():
    # The path on n nodes: eigenvalues 2 - 2 cos(pi m / n) of L = D - A.
    n, k = 5, 3
    data = AddLaplacianPE(k)(Data(edge_index=_path(n), num_nodes=n))
    want = torch.tensor([2 - 2 * math.cos(math.pi * m / n) for m in range(k)])
    assert data.eigvals.shape == data.eigvecs.shape == (n, k)
    torch.testing.assert_close(data.eigvals, want.expand(n, k).float(), atol=1e-6, rtol=0)
    L = torch.diag(torch.tensor([1.0, 2, 2, 2, 1])) - torch.zeros(n, n).index_put_(
        tuple(_path(n)), torch.ones(2 * (n - 1)))
    u = data.eigvecs
    torch.testing.assert_close(L @ u, u * want.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(u.norm(dim=0), torch.ones(k))
    # The first eigenvector is the constant one (PyG's transform drops it).
    torch.testing.assert_close(u[:, 0].abs(), torch.full((n,), 1 / math.sqrt(n)))


def test_small_graphs_are_padded_with_nan():
    data = AddLaplacianPE(4)(Data(edge_index=_path(2), num_nodes=2))
    assert torch.isnan(data.eigvecs[:, 2:]).all() and torch.isnan(data.eigvals[:, 2:]).all()
    assert not torch.isnan(data.eigvecs[:, :2]).any()
    with pytest.raises(ValueError, match="k"):
        AddLaplacianPE(0)


def test_encoder_masks_padding_and_flips_signs_from_the_generator():
    enc = LapPEEncoder(8)
    data = AddLaplacianPE(6)(Data(edge_index=_path(4), num_nodes=4))  # 2 padded
    enc.eval()
    full = enc(data.eigvecs, data.eigvals)
    cut = enc(data.eigvecs[:, :4], data.eigvals[:, :4])
    torch.testing.assert_close(full, cut)  # padding adds nothing
    assert full.shape == (4, 8) and not torch.isnan(full).any()
    enc.train()
    a = enc(data.eigvecs, data.eigvals, generator=seeded(3))
    b = enc(data.eigvecs, data.eigvals, generator=seeded(3))
    torch.testing.assert_close(a, b)
    # Over seeds, some eigenvector's sign is flipped: the output moves, and
    # it is always the eval output of some sign pattern of the eigenvectors
    # (the padded columns' signs change nothing).
    with torch.no_grad():
        outs = [enc(data.eigvecs, data.eigvals, generator=seeded(s))
                for s in range(8)]
        enc.eval()
        patterns = [enc(data.eigvecs * torch.tensor(
            [1.0 - 2 * ((p >> c) & 1) for c in range(6)]), data.eigvals)
            for p in range(16)]
    assert len({tuple(o.flatten().round(decimals=5).tolist()) for o in outs}) > 1
    for out in outs:
        assert min(float((out - p).abs().max()) for p in patterns) < 1e-5
    with pytest.raises(ValueError, match="eigvecs"):
        enc(data.eigvecs, data.eigvals[:, :2])
