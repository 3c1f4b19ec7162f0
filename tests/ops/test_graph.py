"""The lean int32 CSR graph: its views, its size per edge, its limits."""
import pytest
import torch

from sbm_pyg.ops import backends
from sbm_pyg.ops.graph import CSRGraph, check_index_range
from sbm_pyg.sampling import SampledGraph, fastrg
from tests.helpers import seeded


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def small():
    # Rows 0..2, columns 0..2; edges (0,1), (1,0), (1,2), (2,1).
    return CSRGraph(i32([0, 1, 3, 4]), i32([1, 0, 2, 1]), i32([0, 1, 3, 4]),
                    i32([1, 0, 3, 2]))


def test_views_and_sizes():
    g = small()
    assert (g.num_rows, g.num_cols, g.num_edges) == (3, 3, 4)
    assert g.nbytes() == 4 * 4 * 2  # col and perm, int32
    assert g.row().tolist() == [0, 1, 1, 2]
    assert g.row_t().tolist() == [1, 0, 2, 1]  # rows of columns 0, 1, 1, 2
    assert g.row().dtype == g.row_t().dtype == torch.int32
    assert g.row() is g.row()  # cached
    assert g.nbytes() == 4 * 4 * 4  # and counted
    moved = g.to("meta")
    assert moved.col.device.type == "meta" and moved.nbytes() == 32


def test_rejects_int64_and_mismatched_lengths():
    with pytest.raises(TypeError, match="CSRGraph.col must be a 1-D int32"):
        CSRGraph(i32([0, 1]), torch.tensor([0]), i32([0, 1]), i32([0]))
    with pytest.raises(ValueError, match="col and perm differ in length"):
        CSRGraph(i32([0, 1]), i32([0]), i32([0, 1]), i32([0, 0]))


def test_index_range():
    check_index_range(2**31 - 1, 2**31 - 1, 2**31 - 1)
    with pytest.raises(ValueError, match="2147483648 edges, more than the 2"):
        check_index_range(2**31, 4, 4)
    with pytest.raises(ValueError, match="columns"):
        check_index_range(0, 4, 2**31)


def test_sampled_graph_is_16_bytes_per_edge_with_every_view():
    memb = torch.rand(40, 2, 3, generator=seeded(0), dtype=torch.float64)
    block = torch.full((2, 3, 3), 0.3, dtype=torch.float64)
    graph = fastrg(memb, block, memb, ptr_q=[0, 15, 40], ptr_k=[0, 15, 40],
                   generator=seeded(1), backend="torch")
    for t in (graph.rowptr, graph.csr.col, graph.colptr, graph.perm):
        assert t.dtype == torch.int32
    assert graph.csr.nbytes() == 8 * graph.num_edges
    graph.csr.row_t()  # builds row as well: every view a kernel reads
    assert graph.csr.nbytes() == 16 * graph.num_edges
    if backends(memb.device)["sampler"] == "cpp":
        # The compiled sampler writes row_t in its column sort: 12 bytes per
        # edge for the fused kernels, which never read row.
        cpp = fastrg(memb, block, memb, ptr_q=[0, 15, 40],
                     ptr_k=[0, 15, 40], generator=seeded(1), backend="cpp")
        assert cpp.csr.nbytes() == 12 * cpp.num_edges
        cpp.csr.row()
        assert cpp.csr.nbytes() == 16 * cpp.num_edges
    # The derived PyG views are int64 and agree with the CSR.
    j, i = graph.edge_index
    assert graph.edge_index.dtype == graph.head.dtype == torch.int64
    assert torch.equal(graph.head * 40 + i, graph.csr.row().long())
    assert torch.equal(graph.head * 40 + j, graph.csr.col.long())


def test_from_keys_derives_head_and_pairs():
    # H=2, N_q=2, N_k=3; key (h N_q + i) N_k + j.
    g = SampledGraph.from_keys(torch.tensor([1, 3, 5, 6, 10]), 2, 2, 3)
    assert g.head.tolist() == [0, 0, 0, 1, 1]
    assert g.edge_index.tolist() == [[1, 0, 2, 0, 1], [0, 1, 1, 0, 1]]
    assert g.csr.col.tolist() == [1, 0, 2, 3, 4]  # h N_k + j
    assert g.rowptr.tolist() == [0, 1, 3, 4, 5]
    assert g.colptr.tolist() == [0, 1, 2, 3, 4, 5, 5]
    assert g.perm.tolist() == [1, 0, 2, 3, 4]  # column 0 first: edge 1
    assert g.csr.row_t().tolist() == [1, 0, 1, 2, 3]


def test_set_row_t_checks_its_argument():
    g = CSRGraph(torch.tensor([0, 1, 3], dtype=torch.int32),
                 torch.tensor([1, 0, 1], dtype=torch.int32),
                 torch.tensor([0, 1, 3], dtype=torch.int32),
                 torch.tensor([1, 0, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="row_t must be an int32 tensor"):
        g.set_row_t(torch.tensor([1, 0, 1]))  # int64
    with pytest.raises(ValueError, match="row_t must be an int32 tensor"):
        g.set_row_t(torch.tensor([1, 0], dtype=torch.int32))
    g.set_row_t(torch.tensor([1, 0, 1], dtype=torch.int32))
    assert g.row_t().tolist() == [1, 0, 1] and "row" not in g._cache
