"""BigBird's fixed pattern as an attention graph, and its attention against
a dense softmax over the same mask."""
import math

import pytest
import torch

from sbm_pyg.nn import BigBirdAttention, bigbird_graph, bigbird_sizes
from tests.helpers import seeded


def dense_mask(graph, N):
    mask = torch.zeros(graph.num_heads, N, N, dtype=torch.bool)
    key, query = graph.edge_index
    mask[graph.head, query, key] = True
    return mask


def test_pattern_on_a_small_sequence():
    # n = 6, w = 1, g = 1, no random keys: the band, column 0 and row 0.
    graph = bigbird_graph(torch.tensor([0, 6]), 1, window=1, num_global=1,
                          num_random=0)
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for i in range(6):
        for j in range(6):
            expected[i, j] = abs(i - j) <= 1 or j == 0 or i == 0
    assert torch.equal(dense_mask(graph, 6)[0], expected)


def test_random_keys_stay_in_their_sequence_and_heads_share_the_pattern():
    ptr = torch.tensor([0, 5, 5, 17, 40])
    graph = bigbird_graph(ptr, 3, window=2, num_global=2, num_random=4,
                          generator=seeded(0))
    N = int(ptr[-1])
    mask = dense_mask(graph, N)
    seq = torch.repeat_interleave(torch.arange(4), ptr.diff())
    same = seq[:, None] == seq[None, :]
    assert not bool((mask & ~same).any())  # no edge across sequences
    assert torch.equal(mask[0], mask[1]) and torch.equal(mask[0], mask[2])
    # Window and global edges are all there; each query has at most
    # 2w + 1 + g + r keys unless it is a global query.
    pos = torch.arange(N) - ptr[:-1][seq]
    band = same & ((pos[:, None] - pos[None, :]).abs() <= 2)
    glob = same & ((pos[None, :] < 2) | (pos[:, None] < 2))
    assert bool(mask[0][band | glob].all())
    rows = mask[0].sum(1)
    assert bool((rows[pos >= 2] <= 5 + 2 + 4).all())
    assert graph.edge_counts().shape == (4, 3)


def test_sizes_meet_the_density():
    for n, rho in ((1024, 0.01), (1024, 0.02), (1024, 0.05), (256, 0.05),
                   (4096, 0.01)):
        w, g, r = bigbird_sizes(n, rho)
        graph = bigbird_graph(torch.tensor([0, n]), 1, w, g, r,
                              generator=seeded(1))
        density = float(graph.density())
        # Within a fifth of the target: duplicates of random keys merge,
        # and the shares round to whole keys.
        assert abs(density - rho) < 0.2 * rho, (n, rho, density)
    with pytest.raises(ValueError, match="density"):
        bigbird_sizes(10, 0.0)
    with pytest.raises(ValueError, match="window"):
        bigbird_graph(torch.tensor([0, 4]), 1, -1, 1, 1)


def test_attention_is_the_softmax_over_the_pattern():
    torch.manual_seed(0)
    attn = BigBirdAttention(8, heads=2, head_channels=4, density=0.4)
    x = torch.randn(2, 7, 8, generator=seeded(3))
    mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    out = attn(x, mask, generator=seeded(4))
    # The same graph, drawn again from the same seed.
    ptr = torch.tensor([0, 7, 12])
    graph = bigbird_graph(ptr, 2, *bigbird_sizes(7, 0.4), generator=seeded(4))
    q, k, v = attn.qkv(x[mask]).view(-1, 3, 2, 4).unbind(1)
    allowed = dense_mask(graph, 12)  # [H, N, N]
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(4)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    ref = attn.out(torch.einsum("hij,jhd->ihd", weights, v).reshape(-1, 8))
    torch.testing.assert_close(out[mask], ref)
    assert bool((out[1, 5:] == 0).all())
    torch.testing.assert_close(attn.sampled_density,
                               graph.density().mean(0).float())
