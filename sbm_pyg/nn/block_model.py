r"""The per-head mixed-membership SBM of SBM-Transformer (Sec. 4.1)."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Module, Parameter

from sbm_pyg.ops.csr import full_precision, row_index
from sbm_pyg.validation import require_tensor

__all__ = ["StochasticBlockModel", "INITS", "PARAMETRIZATIONS",
           "cluster_masses", "expected_densities", "mean_densities",
           "check_exact_densities"]

#: Initializations of :class:`StochasticBlockModel`.
INITS = ("paper", "dense")
#: Parametrizations of :class:`StochasticBlockModel`: the paper's, whose
#: block matrix shares one unit of mass between all blocks, the classic
#: mixed-membership SBM's, which does not (docs/theory.md, "The block
#: matrix's mass cap"), and its sharp form (memberships in a token's top
#: clusters, a learned temperature, separate key clusters).
PARAMETRIZATIONS = ("paper", "mmsb", "sharp")

# The block logit's offset b that each initialization starts from under
# "mmsb": about the paper's 25% of the pairs (logit(0.25)), and every pair at
# sigma(6) = 0.998, as the paper's "dense" start has its memberships.
_MMSB_BIAS = {"paper": math.log(0.25 / 0.75), "dense": 6.0}
# The sharp form: clusters a token's membership keeps, and the clusters'
# start N(0, 0.3^2). Fitted alone to a frozen MQAR teacher, the forms whose
# clusters started at the kaiming std (about 0.02) often stayed at one
# constant p; from 0.3 they separated (docs/runs/teacher, capacity).
SHARP_TOP = 2
SHARP_INIT_STD = 0.3


class StochasticBlockModel(Module):
    r"""Maps each head's queries and keys to an SBM (the paper's Eq. 5-7).

    Per head :math:`h`, with cluster embeddings
    :math:`\mathbf{C}_h \in \mathbb{R}^{k \times d}` and a 2-layer
    :math:`\mathrm{MLP}_h: \mathbb{R}^d \to \mathbb{R}^d` (ReLU) shared by
    queries and keys:

    .. math::
        \hat{\mathbf{S}}_h &= \mathrm{softmax}(\mathbf{C}_h
        \mathbf{C}_h^{\top}) \quad \text{(over all } k^2 \text{ entries)} \\
        \hat{\mathbf{Q}}_h &= \sigma(\mathrm{MLP}_h(\mathbf{Q}_h)
        \mathbf{C}_h^{\top}), \qquad
        \hat{\mathbf{K}}_h = \sigma(\mathrm{MLP}_h(\mathbf{K}_h)
        \mathbf{C}_h^{\top})

    so that the edge probability :math:`p_{ij} = \hat{\mathbf{Q}}_i
    \hat{\mathbf{S}}_h \hat{\mathbf{K}}_j^{\top}` lies in :math:`(0, 1)`.
    All heads are computed at once with batched matrix products.

    Because :math:`\hat{\mathbf{S}}_h` sums to 1 over its :math:`k^2`
    entries, a graph of :math:`V` disjoint dense blocks has a mean
    within-block probability of at most :math:`1/V` plus its cross-block
    probabilities (:func:`sbm_pyg.theory.within_block_cap`). With
    :obj:`parametrization="mmsb"` (the mixed-membership SBM of Airoldi et
    al., 2008) the memberships lie on the simplex and every block entry in
    :math:`(0, 1)` on its own, with a learned offset :math:`b_h` per head:

    .. math::
        \hat{\mathbf{S}}_h = \sigma(\mathbf{C}_h \mathbf{C}_h^{\top} + b_h),
        \qquad
        \hat{\mathbf{Q}}_h = \mathrm{softmax}(\mathrm{MLP}_h(\mathbf{Q}_h)
        \mathbf{C}_h^{\top}), \qquad
        \hat{\mathbf{K}}_h = \mathrm{softmax}(\mathrm{MLP}_h(\mathbf{K}_h)
        \mathbf{C}_h^{\top})

    (softmax over the :math:`k` clusters), so that :math:`p_{ij} \le 1`
    and :math:`V` blocks can each be dense. :obj:`parametrization="sharp"`
    sharpens it: a learned temperature :math:`\tau_h` per head, separate
    key clusters :math:`\mathbf{C}'_h`, and each membership kept on its
    :data:`SHARP_TOP` largest clusters and renormalized,

    .. math::
        \hat{\mathbf{S}}_h = \sigma(\mathbf{C}_h \mathbf{C}_h'^{\top} + b_h),
        \quad
        \hat{\mathbf{Q}}_h = \mathrm{top}_2(\mathrm{softmax}(\tau_h
        \mathrm{MLP}_h(\mathbf{Q}_h) \mathbf{C}_h^{\top})), \quad
        \hat{\mathbf{K}}_h = \mathrm{top}_2(\mathrm{softmax}(\tau_h
        \mathrm{MLP}_h(\mathbf{K}_h) \mathbf{C}_h'^{\top}))

    (the form that, fitted alone to a trained MQAR model's attention, put
    the most probability on each query's needed key: docs/experiments.md).
    :math:`p_{ij}` is a product of nonnegative factors in every form: every
    sampler, the expected density, the estimators and the kernels take
    them all.

    Args:
        heads (int): number of heads :math:`H`.
        channels (int): head dimension :math:`d`.
        num_clusters (int): clusters :math:`k` per head. (default: :obj:`128`)
        init (str): :obj:`"paper"` (the paper's initialization, about 25%
            of the pairs sampled, see :meth:`reset_parameters`) or
            :obj:`"dense"` (nodes and clusters gathered in one place, the
            paper's Figure 3(a): every :math:`p_{ij} \approx 0.99`, a head
            that starts as full attention). Under :obj:`"mmsb"` the same
            starts are set by the offset :math:`b_h`: about 25% and 99.8%
            of the pairs. (default: :obj:`"paper"`)
        parametrization (str): :obj:`"paper"`, :obj:`"mmsb"` or
            :obj:`"sharp"`, see above. (default: :obj:`"paper"`)
        density (float, optional): start near this expected density
            :math:`\rho \in (0, 1)` instead of :obj:`init`'s (which must
            then be :obj:`"paper"`): a large graph, whose 25% of the pairs
            would not fit, starts sparse. See :meth:`reset_parameters`.
            (default: :obj:`None`)

    Shapes:
        - **input:** query :math:`(N_q, H, d)`, key :math:`(N_k, H, d)`
        - **output:** q_memb :math:`(N_q, H, k)`, block :math:`(H, k, k)`,
          k_memb :math:`(N_k, H, k)`

    Example:
        >>> sbm = StochasticBlockModel(heads=2, channels=16, num_clusters=8)
        >>> q_memb, block, k_memb = sbm(torch.randn(10, 2, 16), torch.randn(12, 2, 16))
        >>> q_memb.shape, block.shape, k_memb.shape
        (torch.Size([10, 2, 8]), torch.Size([2, 8, 8]), torch.Size([12, 2, 8]))
    """

    def __init__(self, heads: int, channels: int, num_clusters: int = 128,
                 init: str = "paper", parametrization: str = "paper",
                 density: Optional[float] = None):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if density is not None:
            if isinstance(density, bool) or not isinstance(density, (int, float)) \
                    or not 0 < density < 1:
                raise ValueError(f"density must be a number in (0, 1), got {density!r}")
            if init != "paper":
                raise ValueError(f"give init={init!r} or a density, not both")
        self.density = None if density is None else float(density)
        if parametrization not in PARAMETRIZATIONS:
            raise ValueError(f"parametrization must be one of "
                             f"{PARAMETRIZATIONS}, got {parametrization!r}")
        self.init, self.parametrization = init, parametrization
        for name, value in (("heads", heads), ("channels", channels),
                            ("num_clusters", num_clusters)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.heads, self.channels, self.num_clusters = heads, channels, num_clusters
        self.weight1 = Parameter(torch.empty(heads, channels, channels))
        self.bias1 = Parameter(torch.empty(heads, 1, channels))
        self.weight2 = Parameter(torch.empty(heads, channels, channels))
        self.bias2 = Parameter(torch.empty(heads, 1, channels))
        self.clusters = Parameter(torch.empty(heads, num_clusters, channels))
        # The paper's parametrization has no offset: its state dict (and the
        # checkpoints saved with it) keep their keys.
        self.block_bias = (Parameter(torch.empty(heads, 1, 1))
                           if parametrization != "paper" else None)
        sharp = parametrization == "sharp"
        self.key_clusters = (Parameter(torch.empty(heads, num_clusters, channels))
                             if sharp else None)
        self.log_temperature = Parameter(torch.empty(heads, 1, 1)) if sharp else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""MLP layers as :class:`torch.nn.Linear` initializes them; cluster
        embeddings kaiming-normal, as the paper's appendix says, computed as
        the published code computes it: on the one :obj:`[H, k, d]` tensor,
        whose fan-in torch counts as :math:`k d`, so
        :math:`\mathcal{N}(0, 2/(k d))` (std about 0.022 at :math:`k = 128`,
        :math:`d = 32`). The paper does not give the fan-in; this one is
        what its experiments ran. About 25% of the pairs are sampled at the
        start, the paper's figure.

        With :obj:`init="dense"`, each head's clusters are one random unit
        vector :math:`\mathbf{u}_h` plus :math:`\mathcal{N}(0, 0.1^2)`
        noise and the MLP's output bias is :math:`6\mathbf{u}_h`, so every
        membership logit is about 6 (:math:`\sigma(6) \approx 0.998`).

        Under :obj:`parametrization="mmsb"` the MLP and the clusters start
        as the paper's start has them (so :math:`\mathbf{C}_h
        \mathbf{C}_h^{\top} \approx 0` and the memberships are spread
        over many clusters), and the offset sets the start: :math:`b_h =
        \mathrm{logit}(0.25)` (about 25% of the pairs, as the paper's
        start) or, with :obj:`init="dense"`, :math:`b_h = 6` (every
        :math:`p_{ij} \approx 0.998`). :obj:`"sharp"` starts as
        :obj:`"mmsb"` but for its query and key clusters,
        :math:`\mathcal{N}(0, 0.3^2)` each, and its temperature 1.

        With a :obj:`density` :math:`\rho`: under :obj:`"mmsb"` and
        :obj:`"sharp"`, whose :math:`p_{ij}` is a mixture of the block's
        entries whatever the tokens, :math:`b_h` is set so that the block's
        entries average :math:`\rho` (bisection on :math:`b_h`; the
        clusters as above), which is every pair's :math:`p_{ij}` where the
        memberships spread evenly. Under :obj:`"paper"` the start is the
        dense one's with the offset :math:`\mathrm{logit}(\sqrt{\rho})`
        in place of 6 (the clusters' noise kept orthogonal to
        :math:`\mathbf{u}_h`, and the MLP's second layer's output too, so
        that every membership logit is that offset plus a tenth of the
        MLP's output along the noise): :math:`\hat{q}_{iu}, \hat{k}_{ju}
        \approx \sqrt{\rho}` and, as :math:`\hat{\mathbf{S}}_h` sums to
        1, :math:`p_{ij} \approx \rho`. Under :obj:`"sharp"` each token
        keeps its top clusters, which favour the block's larger entries:
        the start lies above :math:`\rho`."""
        bound = 1.0 / math.sqrt(self.channels)
        for weight, bias in ((self.weight1, self.bias1),
                             (self.weight2, self.bias2)):
            torch.nn.init.uniform_(weight, -bound, bound)
            torch.nn.init.uniform_(bias, -bound, bound)
        if self.key_clusters is not None and self.log_temperature is not None:
            for clusters in (self.clusters, self.key_clusters):
                torch.nn.init.normal_(clusters, std=SHARP_INIT_STD)
            torch.nn.init.zeros_(self.log_temperature)
        elif self.block_bias is not None:
            torch.nn.init.kaiming_normal_(self.clusters)
        if self.block_bias is not None:
            torch.nn.init.constant_(self.block_bias, _MMSB_BIAS[self.init])
            if self.density is not None:
                with torch.no_grad():
                    self.block_bias.copy_(_mean_offset(
                        self.block().logit() - self.block_bias, self.density))
            return
        if self.init == "paper" and self.density is None:
            torch.nn.init.kaiming_normal_(self.clusters)
            return
        with torch.no_grad():
            u = torch.nn.functional.normalize(
                torch.randn_like(self.clusters[:, :1]), dim=-1)
            noise = torch.randn_like(self.clusters)
            if self.density is None:  # init="dense"
                offset = 6.0
            else:  # each logit's offset exact: noise and MLP output off u
                offset = math.log(math.sqrt(self.density) / (1 - math.sqrt(self.density)))
                noise -= (noise * u).sum(-1, keepdim=True) * u
                self.weight2.sub_((self.weight2 @ u.transpose(1, 2)) @ u)
            self.clusters.copy_(u + 0.1 * noise)
            self.bias2.copy_(offset * u)

    def block(self) -> Tensor:
        r""":math:`\hat{\mathbf{S}}` :obj:`[H, k, k]`: each head summing to
        1 (:obj:`"paper"`), or each entry in :math:`(0, 1)`."""
        keys = self.clusters if self.key_clusters is None else self.key_clusters
        logits = torch.bmm(self.clusters, keys.transpose(1, 2))
        if self.block_bias is not None:
            return (logits + self.block_bias).sigmoid()
        return logits.flatten(1).softmax(dim=-1).view_as(logits)

    def membership(self, x: Tensor, key: bool = False) -> Tensor:
        r""":math:`\sigma(\mathrm{MLP}_h(\mathbf{x}) \mathbf{C}_h^{\top})`
        (:obj:`"paper"`), its softmax over the clusters (:obj:`"mmsb"`) or
        the sharp form's (with the key clusters where :obj:`key`) for
        :obj:`x [N, H, d]`; returns :obj:`[N, H, k]`."""
        N = x.size(0)
        x, S = _row_chunks(x.transpose(0, 1))  # [H S, L, d]
        x = torch.baddbmm(_per_chunk(self.bias1, S), x,
                          _per_chunk(self.weight1, S)).relu()
        x = torch.baddbmm(_per_chunk(self.bias2, S), x,
                          _per_chunk(self.weight2, S))
        clusters = self.key_clusters if key and self.key_clusters is not None \
            else self.clusters
        logits = torch.bmm(x, _per_chunk(clusters, S).transpose(1, 2))
        if self.log_temperature is not None:
            memb = _top(logits * _per_chunk(self.log_temperature, S).exp())
        elif self.block_bias is not None:
            memb = logits.softmax(dim=-1)
        else:
            memb = logits.sigmoid()
        # Contiguous: torch.compile (2.13) fails to replay a transposed view
        # returned across the graph break at the sampler.
        memb = memb.view(self.heads, -1, memb.size(-1))[:, :N]
        return memb.transpose(0, 1).contiguous()

    def forward(self, query: Tensor, key: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        for name, x in (("query", query), ("key", key)):
            require_tensor(name, x, 3, floating=True)
            if x.shape[1:] != (self.heads, self.channels):
                raise ValueError(f"{name} must have shape [N, {self.heads}, "
                                 f"{self.channels}], got {tuple(x.shape)}")
        return self.membership(query), self.block(), self.membership(key, key=True)

    def __repr__(self) -> str:
        extra = "" if self.init == "paper" else f", init={self.init!r}"
        if self.density is not None:
            extra += f", density={self.density:g}"
        if self.parametrization != "paper":
            extra += f", parametrization={self.parametrization!r}"
        return (f"{self.__class__.__name__}(heads={self.heads}, "
                f"channels={self.channels}, num_clusters={self.num_clusters}{extra})")


# Rows of one chunk of the membership products: the weights' gradients
# sum over every row (K = N); as one product per head cuBLAS runs them on a
# handful of 32 x 32 tiles (3.6 ms at N = 16384 on an H200), as one product
# per chunk of rows on H N / ROW_CHUNK tiles, their sum a small reduction.
ROW_CHUNK = 1024


def _mean_offset(logits: Tensor, density: float, steps: int = 60) -> Tensor:
    # The offset b [H, 1, 1] of each head whose block sigma(logits + b)
    # [H, k, k] averages density: the mean is increasing in b, so a
    # bisection on [-40, 40] (to 80 / 2^60 of its root).
    lo = logits.new_full((logits.size(0), 1, 1), -40.0)
    hi = logits.new_full((logits.size(0), 1, 1), 40.0)
    for _ in range(steps):
        mid = (lo + hi) / 2
        above = (logits + mid).sigmoid().mean((1, 2), keepdim=True) > density
        hi, lo = torch.where(above, mid, hi), torch.where(above, lo, mid)
    return (lo + hi) / 2


def _top(logits: Tensor) -> Tensor:
    # The softmax over the clusters kept on its SHARP_TOP largest entries,
    # renormalized: a token in at most SHARP_TOP clusters. That is the
    # softmax of the kept logits alone (the full softmax's normalizer
    # cancels), with no k-wide softmax or division.
    top = logits.topk(min(SHARP_TOP, logits.size(-1)), dim=-1)
    return torch.zeros_like(logits).scatter(-1, top.indices, top.values.softmax(-1))


def _row_chunks(x: Tensor) -> Tuple[Tensor, int]:
    # [H, N, d] -> [H S, L, d], S chunks of L = min(N, ROW_CHUNK) rows, the
    # last padded with zeros (their outputs are cut, their gradients 0).
    H, N, d = x.shape
    L = min(N, ROW_CHUNK)
    S = -(-N // L) if N else 1
    if S * L != N:  # a copy: only where a chunk is short
        x = torch.nn.functional.pad(x, (0, 0, 0, S * L - N))
    return x.reshape(H * S, L, d), S


def _per_chunk(w: Tensor, S: int) -> Tensor:
    # A head's [H, a, b] parameter for each of its S chunks: [H S, a, b]; its
    # gradient is the sum over the chunks (split-K).
    if S == 1:
        return w
    return w[:, None].expand(-1, S, -1, -1).reshape(-1, *w.shape[1:])


def cluster_masses(ptr: Tensor, memb: Tensor) -> Tensor:
    r"""The cluster masses :math:`\sum_{i \in g} \hat{\mathbf{Q}}_i` of
    each sequence :obj:`[G, H, k]` from memberships :obj:`[N, H, k]` cut
    by :obj:`ptr` :obj:`[G + 1]` (0 for an empty sequence);
    differentiable. Summed in float32 (float64 stays float64) whatever the
    memberships' dtype or autocast: a bfloat16 sum stops growing at 256."""
    # index_add over the sequence of each row: torch.segment_reduce along
    # dim 0 of an [N, H, k] tensor costs 20x more forward and backward on
    # the CPU (N = 4096, k = 128: 7.4 ms against 0.35 ms), a fifth of the
    # whole layer at 1% density.
    return _masses(row_index(ptr, memb.size(0)), ptr.numel() - 1, memb)


# Rows summed into one partial mass before the sequences' sums: one
# sequence's N H k additions on its H k sums would be atomics on H k
# addresses on a GPU (0.17 ms at N = 16384, 30x its bytes on an H200);
# in pieces they spread over N / PIECE_ROWS times as many.
PIECE_ROWS = 256


def _masses(seq: Tensor, G: int, memb: Tensor) -> Tensor:
    # cluster_masses from each row's sequence seq [N] (sorted), of G, in
    # pieces of PIECE_ROWS rows of one sequence: row i's piece is
    # i // PIECE_ROWS + seq[i], distinct between sequences because seq is
    # sorted (a later sequence's rows sit at least one piece on), at most
    # N // PIECE_ROWS + G of them: sizes known without a read.
    N = memb.size(0)
    acc = torch.promote_types(memb.dtype, torch.float32)
    rows = torch.arange(N, device=memb.device)
    piece = torch.div(rows, PIECE_ROWS, rounding_mode="floor") + seq
    P = N // PIECE_ROWS + G
    # Each piece's sequence (every row of a piece writes the same value;
    # unused pieces hold 0 and add nothing).
    piece_seq = torch.zeros(P, dtype=seq.dtype, device=seq.device).scatter_(
        0, piece, seq)
    partial = memb.new_zeros(P, *memb.shape[1:], dtype=acc).index_add_(
        0, piece, memb.to(acc))
    return partial.new_zeros(G, *memb.shape[1:]).index_add_(0, piece_seq, partial)


def expected_densities(ptr_q: Tensor, ptr_k: Tensor, q_memb: Tensor,
                       block: Tensor, k_memb: Tensor) -> Tensor:
    r"""The expected density :math:`\frac{1}{n_q n_k} \sum_{ij} p_{ij}` of
    each sequence and head :obj:`[G, H]` (0 for an empty sequence), in
    closed form from the cluster masses, :math:`O(N k + G k^2)`, and
    differentiable: known before anything is sampled. Computed in float32
    (or float64 for float64 memberships) whatever autocast is on: it is
    the density penalty, the budget's and the regime choice's input."""
    G, Nq, Nk = ptr_q.numel() - 1, q_memb.size(0), k_memb.size(0)
    seq_q = row_index(ptr_q, Nq)
    # One pointer for queries and keys (self-attention): one row index.
    seq_k = seq_q if ptr_k is ptr_q and Nk == Nq else row_index(ptr_k, Nk)
    mass_q, mass_k = _masses(seq_q, G, q_memb), _masses(seq_k, G, k_memb)
    pairs = (ptr_q.diff() * ptr_k.diff()).to(mass_q.dtype)
    with full_precision(q_memb.device):
        expected = torch.einsum("ghu,huv,ghv->gh", mass_q,
                                block.to(mass_q.dtype), mass_k)
    return expected / pairs.clamp(min=1)[:, None]


def check_exact_densities(expected: Tensor) -> Tuple[Tensor, str]:
    r"""The deferred check (flag, message) that no sequence and head of
    :obj:`expected` densities :obj:`[G, H]` (:func:`expected_densities`)
    exceeds 1: in :obj:`mode="exact"` a pair is an edge with probability
    :math:`p_{ij}`, and a mean above 1 means :math:`p_{ij} > 1` for some
    pairs (the sampler would draw them as 1, and the densities it reports
    would be no densities)."""
    # Beyond float32's rounding of a mean of p close to 1.
    return ((expected.detach() > 1 + 1e-4).any(),
            "sbm: in mode='exact' each pair is an edge with probability "
            "p_ij = q_memb[i] @ block @ k_memb[j], which must not exceed 1; "
            "a (sequence, head) has a mean p_ij above 1: scale block or the "
            "memberships down (or use mode='poisson', where p_ij is a rate)")


def mean_densities(ptr_q: Tensor, ptr_k: Tensor, edge_counts: Tensor,
                   expected: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The expected and the sampled density of each head :obj:`[H]`,
    averaged over the non-empty sequences, from each sequence and head's
    :obj:`expected` density :obj:`[G, H]` (:func:`expected_densities`) and
    its sampled edges :obj:`edge_counts` :obj:`[G, H]`: the sampled
    density is :math:`|E_{g,h}| / (n_{q,g} n_{k,g})`."""
    pairs = (ptr_q.diff() * ptr_k.diff()).to(expected.dtype)
    nonempty = (pairs > 0).to(expected.dtype)[:, None]  # [G, 1]
    count = nonempty.sum().clamp(min=1)
    sampled = edge_counts.to(expected.dtype) / pairs.clamp(min=1)[:, None]
    return ((expected * nonempty).sum(0) / count,
            (sampled * nonempty).sum(0) / count)
