"""The tile plan: the order, the tiles, the split of the law, and a graph
drawn through it."""
import pytest
import torch

from sbm_pyg.sampling import expected_adjacency
from sbm_pyg.sampling.tiles import (
    in_tiles,
    plan_tiles,
    tile_edges,
    tile_pairs,
    tile_rows,
    tile_sequences,
)
from tests.helpers import max_binomial_z, z_bound
from tests.sampling.cases import TRIALS, pair_counts


def sharp_sbm(clusters, H=2, k=3, share=0.8, dtype=torch.float64):
    """Memberships with ``share`` on each token's cluster (the list gives
    them, head h shifted by h) and the rest spread; a block with 0.8 on its
    diagonal and 0.05 off it: every rate in (0.05, 0.95)."""
    top = (torch.tensor(clusters)[:, None] + torch.arange(H)) % k
    memb = torch.full((len(clusters), H, k), (1 - share) / (k - 1), dtype=dtype)
    memb.scatter_(-1, top[..., None], share)
    block = torch.full((H, k, k), 0.05, dtype=dtype)
    block += 0.75 * torch.eye(k, dtype=dtype)
    return memb, block


def all_pairs(ptr_q, ptr_k, H):
    """Every (head, query, key) pair within a sequence."""
    pairs = [(h, i, j) for h in range(H) for g in range(len(ptr_q) - 1)
             for i in range(ptr_q[g], ptr_q[g + 1])
             for j in range(ptr_k[g], ptr_k[g + 1])]
    return [torch.tensor(x) for x in zip(*pairs)]


def in_selected_blocks(plan, memb, keys, head, query, key):
    """Whether each pair's (query cluster, key cluster) is selected: the
    tiles hold exactly these blocks."""
    top_q, top_k = memb.argmax(-1), keys.argmax(-1)
    return plan.selected[head, top_q[query, head], top_k[key, head]]


def assert_has_the_law(graph, memb, block, **kwargs):
    """Each pair's frequency over the TRIALS copies of a 7-token sequence
    against the mode's probability (z-test, Bonferroni); the other mode's
    marginals rejected."""
    counts = pair_counts(graph, 7, 7)
    prob = expected_adjacency(memb, block, memb, **kwargs)
    bound = z_bound(prob.numel())
    assert max_binomial_z(counts, TRIALS, prob) < bound
    other = "exact" if kwargs["mode"] == "poisson" else "poisson"
    wrong = expected_adjacency(memb, block, memb, **dict(kwargs, mode=other))
    assert max_binomial_z(counts, TRIALS, wrong) > bound


def test_two_blocks_in_shuffled_order():
    # Tokens of cluster 1 and 0 interleaved: the order sorts them, stably.
    memb = torch.eye(2)[torch.tensor([1, 0, 1, 0, 0, 1])][:, None]
    block = torch.tensor([[[0.9, 0.0], [0.0, 0.9]]])
    plan = plan_tiles(memb, block, memb, tile_q=3, tile_k=3)
    assert plan.q_order.tolist() == [[1, 3, 4, 0, 2, 5]]
    assert plan.q_tile.tolist() == [[1, 0, 1, 0, 0, 1]]
    assert (plan.q_start.tolist(), plan.q_len.tolist()) == ([0, 3], [3, 3])
    assert plan.selected.tolist() == [[[True, False], [False, True]]]
    assert (plan.tile_ptr.tolist(), plan.tile_col.tolist()) == ([0, 1, 2], [0, 1])
    # The rest: no mass between the blocks' own clusters, all of it across.
    q_rest, block_rest, k_rest = plan.rest
    assert torch.equal(block_rest[0], 0.9 * torch.tensor(
        [[0., 0, 1, 0], [0, 0, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]]))
    assert torch.equal(q_rest[:, 0, :2], memb[:, 0]) and (q_rest[..., 2:] == 0).all()


def test_tiles_of_two_sequences_and_heads():
    # Sequence 0: clusters [0, 0, 1, 2, 2]; sequence 1: [1, 1, 1, 0]; head 1
    # shifted by 1; tiles of 2 x 2. A cluster pair's fill counts its tiles'
    # padding: head 0's cluster 0 has 2 + 1 tokens, expected edges (1.6^2 +
    # 0.8^2) * 0.8 = 2.56 in 4 + 4 tile pairs: 0.32; cluster 1 (1 + 3
    # tokens): 5.12 / 20 = 0.256; cluster 2: 2.048 / 4 = 0.512; across
    # clusters at most 0.032 * 4 / 4. At 0.2 the diagonal is tiled.
    memb, block = sharp_sbm([0, 0, 1, 2, 2, 1, 1, 1, 0])
    ptr = [0, 5, 9]
    plan = plan_tiles(memb, block, memb, ptr_q=ptr, ptr_k=ptr, tile_q=2,
                      tile_k=2, min_fill=0.2)
    assert torch.equal(plan.selected, torch.eye(3, dtype=torch.bool).expand(2, 3, 3))
    # Query tiles by (sequence, head, cluster): head 0 of sequence 0 has
    # [0 0] [1] [2 2], head 1 (clusters [1, 1, 2, 0, 0]) [3 4] [0 1] [2];
    # sequence 1, head 0: [8] [5 6] [7]; head 1 ([2, 2, 2, 1]): [8] [5 6] [7].
    head, rows, cols = tile_rows(plan)
    assert plan.q_len.tolist() == [2, 1, 2, 2, 2, 1, 1, 2, 1, 1, 2, 1]
    assert rows.tolist() == [[0, 1], [2, -1], [3, 4], [3, 4], [0, 1], [2, -1],
                             [8, -1], [5, 6], [5, 6], [7, -1], [7, -1],
                             [8, -1], [5, 6], [5, 6], [7, -1], [7, -1]]
    assert head.tolist() == [0] * 3 + [1] * 3 + [0] * 5 + [1] * 5
    assert plan.num_tiles == 16  # 3 + 3 blocks of one tile, 2 of 2 x 2
    # The threshold between those fills: head 0's clusters fill 0.32,
    # 0.256, 0.512; head 1's (0, 1, 2) 0.512, 0.32, 0.256.
    for min_fill, diagonal in ((0.3, [[1, 0, 1], [1, 1, 0]]),
                               (0.33, [[0, 0, 1], [1, 0, 0]]),
                               (0.52, [[0, 0, 0], [0, 0, 0]])):
        plan = plan_tiles(memb, block, memb, ptr_q=ptr, ptr_k=ptr, tile_q=2,
                          tile_k=2, min_fill=min_fill)
        assert plan.selected.diagonal(dim1=1, dim2=2).long().tolist() == diagonal
        assert plan.selected.sum() == sum(map(sum, diagonal))


def test_tile_edges_of_two_sequences_and_heads():
    # The case above: at 0.3 head 0 tiles its clusters 0 and 2 ((1.6^2 +
    # 0.8^2) * 0.8 = 2.56 and 1.6^2 * 0.8 = 2.048 expected edges), head 1
    # its clusters 0 and 1 (2.048 and 2.56); at 0.33 each head only the
    # one that fills 0.512; at 0.52 none.
    memb, block = sharp_sbm([0, 0, 1, 2, 2, 1, 1, 1, 0])
    ptr = torch.tensor([0, 5, 9])
    for min_fill, want in ((0.3, 4.608), (0.33, 2.048), (0.52, 0.0)):
        got = tile_edges(memb, block, memb, ptr, ptr, tile_q=2, tile_k=2,
                         min_fill=min_fill)
        torch.testing.assert_close(got, torch.full((2,), want, dtype=memb.dtype))


@pytest.mark.parametrize("min_fill", [1e-3, 0.2, 10.0])
def test_tile_edges_are_the_cut_part_on_the_plans_tiles(min_fill):
    # Per head, the cut part (the top clusters' share of p) summed over the
    # pairs of the plan's tiles, on the case below (one sequence empty,
    # tiles of 2 x 3).
    memb, block = sharp_sbm([0, 2, 1, 1, 0, 2, 1, 0, 0, 2, 1])
    ptr = [0, 6, 6, 11]
    plan = plan_tiles(memb, block, memb, ptr_q=ptr, ptr_k=ptr, tile_q=2,
                      tile_k=3, min_fill=min_fill)
    head, query, key = all_pairs(ptr, ptr, 2)
    inside = in_tiles(plan, head, query, key)
    top, main = memb.argmax(-1), memb.max(-1).values
    cut = (main[query, head] * block[head, top[query, head], top[key, head]]
           * main[key, head])
    want = torch.zeros(2, dtype=memb.dtype).index_add_(0, head[inside], cut[inside])
    got = tile_edges(memb, block, memb, torch.tensor(ptr), torch.tensor(ptr),
                     tile_q=2, tile_k=3, min_fill=min_fill)
    torch.testing.assert_close(got, want)
    assert (want > 0).all() == (min_fill < 1)


@pytest.mark.parametrize("min_fill", [1e-3, 0.2, 10.0])
def test_split_is_exact_outside_the_tiles(min_fill):
    # The tiles hold exactly the selected blocks; the rest's rate equals p
    # outside them, never exceeds it, and the cut (p minus the rest) is the
    # top clusters' share on those blocks.
    memb, block = sharp_sbm([0, 2, 1, 1, 0, 2, 1, 0, 0, 2, 1])
    ptr = [0, 6, 6, 11]  # one sequence empty
    plan = plan_tiles(memb, block, memb, ptr_q=ptr, ptr_k=ptr, tile_q=2,
                      tile_k=3, min_fill=min_fill)
    full = expected_adjacency(memb, block, memb, ptr_q=ptr, ptr_k=ptr)
    rest = expected_adjacency(*plan.rest, ptr_q=ptr, ptr_k=ptr)
    head, query, key = all_pairs(ptr, ptr, 2)
    tiled = in_tiles(plan, head, query, key)
    assert torch.equal(tiled, in_selected_blocks(plan, memb, memb, head, query, key))
    rate = lambda m: -torch.log1p(-m[head, query, key])  # noqa: E731
    gap = rate(full) - rate(rest)
    assert (gap > -1e-12).all()
    assert (gap[~tiled].abs() < 1e-12).all()
    top = memb.argmax(-1)
    main = memb.max(-1).values
    cut = (plan.selected[head, top[query, head], top[key, head]]
           * main[query, head] * block[head, top[query, head], top[key, head]]
           * main[key, head])
    assert torch.allclose(gap, cut)
    if min_fill == 10.0:  # no cluster pair that full: no tile, all rest
        assert plan.num_tiles == 0 and not tiled.any()
    elif min_fill == 1e-3:  # every cluster pair: all tiles
        assert plan.selected.all() and tiled.all()
    else:
        assert tiled.any() and (~tiled).any() and (cut[tiled] > 0).all()


def test_tile_pairs_are_the_selected_blocks_once():
    memb, block = sharp_sbm([2, 0, 1, 1, 0, 2, 1, 0, 2, 2, 1, 0, 0])
    ptr_q, ptr_k = [0, 7, 13], [0, 5, 13]
    keys = torch.roll(memb, 3, 0)
    plan = plan_tiles(memb, block, keys, ptr_q=ptr_q, ptr_k=ptr_k,
                      tile_q=3, tile_k=2, min_fill=0.1)
    head, query, key = all_pairs(ptr_q, ptr_k, 2)
    want = in_selected_blocks(plan, memb, keys, head, query, key)
    assert torch.equal(in_tiles(plan, head, query, key), want)
    assert want.any() and not want.all()
    h, i, j = tile_pairs(plan)
    listed = sorted(zip(h.tolist(), i.tolist(), j.tolist()))
    assert listed == sorted(zip(head[want].tolist(), query[want].tolist(),
                                key[want].tolist()))
    # Each tile's rows are one cluster's, in the sorted order.
    heads, rows, cols = tile_rows(plan)
    for side, order, memb_side in ((rows, plan.q_order, memb), (cols, plan.k_order, keys)):
        for t in range(side.size(0)):
            real = side[t][side[t] >= 0]
            assert memb_side[real, heads[t]].argmax(-1).unique().numel() == 1


def test_bad_arguments_name_themselves():
    memb, block = sharp_sbm([0, 1, 2])
    for kwargs, message in [
        (dict(tile_q=0), "tile_q must be an int >= 1, got 0"),
        (dict(tile_k=True), "tile_k must be an int >= 1, got True"),
        (dict(tile_q=2.0), "tile_q must be an int >= 1, got 2.0"),
        (dict(min_fill=0.0), "min_fill must be a finite number > 0, got 0.0"),
        (dict(min_fill=float("nan")), "min_fill must be a finite number > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan_tiles(memb, block, memb, **kwargs)
    with pytest.raises(ValueError, match=r"block must have shape \[H, k, k\]"):
        plan_tiles(torch.cat([memb, memb[..., :1]], -1), block, memb)
    with pytest.raises(ValueError, match="q_memb must be finite and >= 0|q_memb"):
        plan_tiles(-memb, block, memb)


@pytest.mark.parametrize("min_fill", [0.3, 0.01])
def test_tile_sequences_hold_the_tile_pairs_once(min_fill):
    # Laid out as the dense kernel's sequences, the plan's tiles: every
    # (query, key) of a sequence, mapped back to its rows, is a pair of an
    # active tile, each once; every query row has one place; the loops are
    # the tiled self-pairs. At 0.01 the off-diagonal blocks are tiled too,
    # so a query tile pairs with key tiles of several clusters.
    clusters = [0, 2, 1, 1, 0, 2, 1, 0, 0, 2, 1, 2, 2, 1, 0]
    memb, block = sharp_sbm(clusters, k=3)
    ptr = [0, 9, 15]
    plan = plan_tiles(memb, block, memb, ptr_q=ptr, ptr_k=ptr, tile_q=2,
                      tile_k=3, min_fill=min_fill)
    seq = tile_sequences(plan)
    n, H = len(clusters), 2
    assert torch.equal(torch.sort(seq.q_rows).values, torch.arange(H * n))
    assert torch.equal(seq.q_rows[seq.q_place.flatten()],
                       torch.arange(H * n))
    pairs = []
    for b in range(seq.ptr_q.numel() - 1):
        for qp in range(seq.ptr_q[b], seq.ptr_q[b + 1]):
            for kp in range(seq.ptr_k[b], seq.ptr_k[b + 1]):
                row, col = int(seq.q_rows[qp]), int(seq.k_rows[kp])
                assert row // n == col // n  # one head
                pairs.append((row // n, row % n, col % n))
    head, query, key = tile_pairs(plan)
    assert sorted(pairs) == sorted(zip(head.tolist(), query.tolist(), key.tolist()))
    assert len(set(pairs)) == len(pairs)
    loops = sorted((int(seq.q_rows[a]), int(seq.k_rows[b])) for a, b in
                   zip(*seq.loops))
    assert all(r == c for r, c in loops)
    assert [r for r, _ in loops] == sorted(h * n + i for h, i, j in pairs if i == j)
    if min_fill < 0.1:  # a sequence reaches keys of more than one cluster
        top = memb.argmax(-1)
        spans = [{int(top[int(r) % n, int(r) // n]) for r in
                  seq.k_rows[seq.ptr_k[b]:seq.ptr_k[b + 1]]}
                 for b in range(seq.ptr_k.numel() - 1)]
        assert max(len(s) for s in spans) > 1
    else:  # one sequence per (sequence, head, cluster) with tiles: runs merged
        assert seq.ptr_q.numel() - 1 < plan.q_start.numel()
