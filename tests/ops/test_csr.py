import os

import pytest
import torch

from sbm_pyg.ops.csr import row_index, sddmm, segment_softmax, segment_sum, spmm
from tests.helpers import seeded

# Rows 0 and 2 have edges, row 1 and row 3 are empty.
ROWPTR = torch.tensor([0, 2, 2, 5, 5])
COL = torch.tensor([1, 2, 0, 1, 3])
ROW = torch.tensor([0, 0, 2, 2, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sddmm_and_spmm_match_dense(dtype):
    g = seeded(0)
    a = torch.randn(4, 3, generator=g, dtype=dtype)
    b = torch.randn(4, 3, generator=g, dtype=dtype)
    values = sddmm(ROWPTR, COL, a, b)
    assert torch.allclose(values, (a[ROW] * b[COL]).sum(-1), atol=1e-6)
    assert torch.allclose(sddmm(ROWPTR, COL, a, b, scale=0.5), 0.5 * values)
    dense = torch.zeros(4, 4, dtype=dtype)
    dense[ROW, COL] = values
    assert torch.allclose(spmm(ROWPTR, COL, values, b), dense @ b, atol=1e-6)


def test_bfloat16_is_computed_in_float32():
    a = torch.randn(4, 3).bfloat16()
    values = sddmm(ROWPTR, COL, a, a)
    assert values.dtype == torch.float32
    assert torch.allclose(values, (a[ROW].float() * a[COL].float()).sum(-1))


def test_segment_softmax_and_sum():
    scores = torch.tensor([1.0, 2.0, 1000.0, 999.0, -5.0])
    assert torch.equal(row_index(ROWPTR, 5), ROW.int())
    alpha = segment_softmax(scores, ROWPTR, ROW.int())
    expected = torch.cat([torch.softmax(scores[:2], 0), torch.softmax(scores[2:], 0)])
    assert torch.allclose(alpha, expected)  # max-subtracted: no overflow
    assert torch.equal(segment_sum(alpha, ROWPTR) > 0.5,
                       torch.tensor([True, False, True, False]))
    assert torch.allclose(segment_sum(alpha, ROWPTR), torch.tensor([1.0, 0, 1, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_segment_softmax_same_with_and_without_torch_scatter(monkeypatch, dtype):
    # The max comes from torch-scatter where it is installed (faster on the
    # CPU) and from torch.segment_reduce otherwise: the same softmax.
    import sbm_pyg.ops.csr as csr
    pytest.importorskip("torch_scatter", reason="torch_scatter not installed")
    g = seeded(0)
    rowptr = torch.tensor([0, 3, 3, 10, 11, 40])
    scores = torch.randn(40, generator=g, dtype=dtype) * 30
    row = row_index(rowptr, 40)
    with_ext = segment_softmax(scores, rowptr, row)
    monkeypatch.setattr(csr, "WITH_TORCH_SCATTER", False)
    without = segment_softmax(scores, rowptr, row)
    assert torch.equal(with_ext, without)


def test_empty():
    rowptr = torch.zeros(3, dtype=torch.long)
    col = torch.zeros(0, dtype=torch.long)
    assert segment_softmax(torch.zeros(0), rowptr, row_index(rowptr, 0)).numel() == 0
    out = spmm(rowptr, col, torch.zeros(0), torch.randn(4, 3))
    assert torch.equal(out, torch.zeros(2, 3))


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only")
def test_ci_has_the_optional_pyg_stack():
    # .ci/run installs torch-scatter and torch-sparse, so that none of their
    # tests skip there without notice.
    import torch_geometric.typing as pyg_typing
    assert pyg_typing.WITH_TORCH_SCATTER and pyg_typing.WITH_TORCH_SPARSE
