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


def test_attribute_names_as_pygs_transforms_take_them():
    n, k = 5, 3
    x = torch.randn(n, 2)
    ref = AddLaplacianPE(k)(Data(edge_index=_path(n), num_nodes=n))
    named = AddLaplacianPE(k, attr_name="pe", eigvals_attr_name="pe_values")(
        Data(edge_index=_path(n), num_nodes=n))
    assert "eigvecs" not in named and "eigvals" not in named
    torch.testing.assert_close(named.pe, ref.eigvecs)
    torch.testing.assert_close(named.pe_values, ref.eigvals)
    # attr_name=None: concatenated to x, as PyG's transforms do; no
    # eigenvalues stored with eigvals_attr_name=None.
    cat = AddLaplacianPE(k, attr_name=None, eigvals_attr_name=None)(
        Data(x=x.clone(), edge_index=_path(n), num_nodes=n))
    assert set(cat.keys()) == {"x", "edge_index", "num_nodes"}
    torch.testing.assert_close(cat.x, torch.cat([x, ref.eigvecs], 1))
    # ... where the padding of a small graph is zero: x stays finite.
    small = AddLaplacianPE(4, attr_name=None)(
        Data(x=torch.ones(2, 1), edge_index=_path(2), num_nodes=2))
    assert small.x.shape == (2, 5) and bool((small.x[:, 3:] == 0).all())
    assert torch.isnan(small.eigvals[:, 2:]).all()
    assert repr(AddLaplacianPE(k, attr_name="pe")) == "AddLaplacianPE(k=3, attr_name='pe')"
    assert repr(AddLaplacianPE(k)) == "AddLaplacianPE(k=3)"  # as cached datasets have it
    for bad in (dict(attr_name=""), dict(eigvals_attr_name=3),
                dict(attr_name="pe", eigvals_attr_name="pe")):
        with pytest.raises(ValueError, match="attr_name"):
            AddLaplacianPE(k, **bad)


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
