"""The index work of a batch split between regimes per (sequence, head)."""
import torch

from sbm_pyg.nn._pair_split import (
    SplitSizes,
    graph_keys,
    split_included,
    split_pairs,
    split_sizes,
)
from sbm_pyg.sampling import SampledGraph


def test_split_pairs_gathers_heads_first_rows():
    ptr = torch.tensor([0, 2, 5])
    dense = torch.tensor([[True, False], [False, True]])  # [G, H]
    split = split_pairs(ptr, ptr, dense, 5, 5)
    # (head 0, sequence 0): rows 0, 1; (head 1, sequence 1): rows 5 + 2..4
    assert split.rows_q.tolist() == [0, 1, 7, 8, 9]
    assert split.rows_k.tolist() == [0, 1, 7, 8, 9]
    assert split.ptr_q.tolist() == [0, 2, 5]
    assert split.pair.tolist() == [[0, -1], [-1, 1]]
    # (query 0, key 1) in sequence 0, dense in head 0; (3, 4) in sequence 1,
    # dense in head 1: renumbered in the dense batch, (key, query) rows.
    inc = split_included(split, ptr, ptr, torch.tensor([0, 3]),
                         torch.tensor([1, 4]))
    assert inc.tolist() == [[1, 4], [0, 3]]


def test_split_pairs_sized_by_the_callers_read_reads_nothing():
    from benchmarks.launches import count_reads
    ptr = torch.tensor([0, 2, 2, 5])  # sequence 1 empty
    dense = torch.tensor([[True, False], [True, True], [False, True]])
    sizes = SplitSizes(*(int(x) for x in split_sizes(ptr, ptr, dense)))
    assert sizes == (4, 5, 5)  # four pairs, 2 + 0 + 3 rows a side
    got = []
    assert count_reads(lambda: got.append(split_pairs(ptr, ptr, dense, 5, 5, sizes))) == {}
    read = split_pairs(ptr, ptr, dense, 5, 5)
    for a, b in zip(got[0], read):
        assert torch.equal(a, b)
    assert got[0].rows_q.tolist() == [0, 1, 7, 8, 9]
    assert got[0].ptr_q.tolist() == [0, 2, 2, 2, 5]


def test_graph_keys_are_the_graphs_keys():
    key = torch.tensor([1, 7, 30, 44])  # H = 2, N_q = 3, N_k = 8
    graph = SampledGraph.from_keys(key, 2, 3, 8)
    assert torch.equal(graph_keys(graph), key)
