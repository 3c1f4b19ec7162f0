r"""A fixed sparse pattern as a baseline of the same kernels: BigBird's
window + global + random attention (Zaheer et al., 2020) built as an
attention graph, so that a comparison with SBM attention at the same edge
count isolates which edges are attended, not how."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Linear, Module

from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.ops.csr import row_index
from sbm_pyg.sampling import SampledGraph
from sbm_pyg.sampling.checks import check_pointers
from sbm_pyg.validation import check_generator, require_tensor, sync

__all__ = ["bigbird_graph", "bigbird_sizes", "BigBirdAttention"]


def bigbird_sizes(length: int, density: float) -> Tuple[int, int, int]:
    r"""The window radius :math:`w`, global tokens :math:`g` and random keys
    :math:`r` per query that give about :obj:`density` of the
    :math:`n^2` pairs of a sequence of :obj:`length` :math:`n`: a third of a
    query's :math:`m = \rho n` keys each to the window (:math:`2w + 1`),
    the global tokens (:math:`2g`: the first :math:`g` tokens attend to and
    are attended by all) and random keys; at least one of each.

    Example:
        >>> bigbird_sizes(1024, 0.02)
        (3, 3, 7)
    """
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density!r}")
    m = density * length / 3
    return (max(round((m - 1) / 2), 0), max(round(m / 2), 1),
            max(round(m), 1))


def bigbird_graph(ptr: Tensor, heads: int, window: int, num_global: int,
                  num_random: int,
                  generator: Optional[torch.Generator] = None) -> SampledGraph:
    r"""BigBird's attention graph over a ragged batch, the same for every
    head: query :math:`i` of a sequence attends to the keys within
    :obj:`window` positions of it, to the sequence's first
    :obj:`num_global` tokens and to :obj:`num_random` keys drawn uniformly
    from the sequence (with replacement: duplicates merge); the first
    :obj:`num_global` queries attend to every key. Cost :math:`O(N (w + g
    + r) \log)` plus the global rows, :math:`O(g N)`.

    Args:
        ptr (LongTensor): :obj:`[G + 1]` sequences of the tokens.
        heads (int): :math:`H`.
        window (int): :math:`w \ge 0`.
        num_global (int): :math:`g \ge 0`.
        num_random (int): :math:`r \ge 0`.
        generator (torch.Generator, optional): the random keys' source.

    Returns:
        :class:`~sbm_pyg.sampling.SampledGraph` with :math:`N_q = N_k = N`.

    Example:
        >>> g = bigbird_graph(torch.tensor([0, 4]), 1, window=0,
        ...                   num_global=1, num_random=0)
        >>> g.edge_index  # (key, query): self-loops, key 0, query 0's row
        tensor([[0, 1, 2, 3, 0, 1, 0, 2, 0, 3],
                [0, 0, 0, 0, 1, 1, 2, 2, 3, 3]])
    """
    require_tensor("ptr", ptr, 1)
    for name, value in (("window", window), ("num_global", num_global),
                        ("num_random", num_random)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive int, got {heads!r}")
    check_generator(generator, ptr.device)
    device = ptr.device
    N = int(ptr[-1]) if ptr.numel() > 0 else 0
    ptr, _, checks = check_pointers(ptr, ptr, N, N, device)
    sync(checks)
    lengths = ptr.diff()
    seq = row_index(ptr, N)  # the sequence of each token
    start, n = ptr[:-1][seq], lengths[seq]  # [N] each
    pos = torch.arange(N, device=device) - start
    # Per query: the window, the global keys and the random keys, local.
    offsets = torch.arange(-window, window + 1, device=device)
    cols = [pos[:, None] + offsets,
            torch.arange(num_global, device=device).expand(N, num_global),
            (torch.rand(N, num_random, generator=generator, device=device)
             * n[:, None]).long()]
    local = torch.cat(cols, 1)
    valid = (local >= 0) & (local < n[:, None])
    query = torch.arange(N, device=device)[:, None].expand_as(local)[valid]
    key = (start[:, None] + local)[valid]
    # The global queries' rows: key j joins query start + t for t < g.
    t = torch.arange(num_global, device=device)
    g_valid = t[None, :] < n[:, None]
    g_query = (start[:, None] + t)[g_valid]
    g_key = torch.arange(N, device=device)[:, None].expand(N, num_global)[g_valid]
    query, key = torch.cat([query, g_query]), torch.cat([key, g_key])
    base = torch.unique(query * max(N, 1) + key)  # sorted, no duplicates
    per_head = N * N
    keys = (torch.arange(heads, device=device)[:, None] * per_head
            + base[None]).reshape(-1)
    return SampledGraph.from_keys(keys, heads, N, N, ptr_q=ptr, ptr_k=ptr)


class BigBirdAttention(Module):
    r"""Multi-head softmax attention over :func:`bigbird_graph` on a padded
    batch, computed by the same kernels as SBM attention
    (:func:`~sbm_pyg.nn.functional.sparse_attention`), with the pattern's
    sizes from :func:`bigbird_sizes` for a target :obj:`density` of each
    sequence's pairs; the random keys are drawn afresh each forward.

    Args:
        channels (int): embedding size :math:`C`.
        heads (int): number of heads.
        head_channels (int): size of each head.
        density (float): the fraction of pairs to attend, in :math:`(0, 1]`.
        dropout (float): dropout on the attention weights. (default: :obj:`0.`)

    Shapes:
        - **input:** x :math:`(B, N, C)`, mask :math:`(B, N)` (bool, True =
          real token; :obj:`None`: all real)
        - **output:** :math:`(B, N, C)`; :obj:`sampled_density`
          :math:`(H)`, the pairs attended, averaged over the sequences

    Example:
        >>> attn = BigBirdAttention(16, heads=2, head_channels=8, density=0.5)
        >>> attn(torch.randn(2, 6, 16)).shape
        torch.Size([2, 6, 16])
    """

    def __init__(self, channels: int, heads: int, head_channels: int,
                 density: float, dropout: float = 0.0):
        super().__init__()
        if not 0 < density <= 1:
            raise ValueError(f"density must lie in (0, 1], got {density!r}")
        self.channels, self.heads, self.head_channels = channels, heads, head_channels
        self.density, self.dropout = density, dropout
        self.qkv = Linear(channels, 3 * heads * head_channels, bias=False)
        self.out = Linear(heads * head_channels, channels)
        self.sampled_density: Optional[Tensor] = None

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module."""
        self.qkv.reset_parameters()
        self.out.reset_parameters()

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, *,
                generator: Optional[torch.Generator] = None) -> Tensor:
        require_tensor("x", x, 3, floating=True)
        B, N, C = x.shape
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
        lengths = mask.sum(1)
        ptr = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        H, d = self.heads, self.head_channels
        q, k, v = self.qkv(x[mask]).view(-1, 3, H, d).unbind(1)
        graph = bigbird_graph(ptr, H, *bigbird_sizes(max(N, 1), self.density),
                              generator=generator)
        self.sampled_density = graph.density().mean(0).to(x.dtype)
        out = sparse_attention(q, k, v, graph, dropout=self.dropout,
                               training=self.training, generator=generator)
        out = self.out(out.reshape(-1, H * d))
        return out.new_zeros(B, N, C).masked_scatter(mask[..., None], out)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.channels}, heads={self.heads}, "
                f"head_channels={self.head_channels}, density={self.density})")
