r"""Dense references for the samplers: the expected mask and one Bernoulli
per pair, :math:`O(H N_q N_k)`, for tests and small inputs."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.utils.sparse import ptr2index

from sbm_pyg.sampling.checks import PtrLike, as_ptr, check_sampler_options, check_sbm
from sbm_pyg.sampling.edges import edges_from_keys
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import check_generator, check_memory, sync

__all__ = ["expected_adjacency", "bernoulli"]


def expected_adjacency(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
) -> Tensor:
    r"""The dense expected mask :math:`\mathbb{E}[\mathbf{M}]` of
    :func:`fastrg` with the same arguments (reference path,
    :math:`O(H N_q N_k)`).

    .. math::
        \mathbb{E}[M_{hij}] = \begin{cases}
        1 - e^{-(p_{hij} + \delta)} & \text{poisson} \\
        \min(p_{hij} + \delta, 1) & \text{exact}
        \end{cases}

    for :math:`i, j` in the same sequence, 0 across sequences, and 1 on the
    diagonal with :obj:`self_loops`.

    Returns:
        Tensor :obj:`[H, N_q, N_k]` in the dtype of :obj:`q_memb`.
    """
    check_sampler_options(mode, exploration, None)
    ptr_q, ptr_k, checks = check_sbm(q_memb, block, k_memb, ptr_q, ptr_k,
                                     self_loops)
    sync(checks)
    Nq, H, _ = q_memb.shape
    Nk = k_memb.size(0)
    check_memory(3 * H * Nq * Nk * q_memb.element_size(), q_memb.device,
                 f"a dense [{H}, {Nq}, {Nk}] expected adjacency")
    p = torch.einsum("ihu,huv,jhv->hij", q_memb, block, k_memb) + exploration
    same = ptr2index(ptr_q, Nq)[:, None] == ptr2index(ptr_k, Nk)[None, :]
    p = p * same
    P = -torch.expm1(-p) if mode == "poisson" else p.clamp(max=1.0)
    if self_loops:
        P.diagonal(dim1=1, dim2=2).fill_(1.0)
    return P


def bernoulli(
    q_memb: Tensor,
    block: Tensor,
    k_memb: Tensor,
    *,
    ptr_q: PtrLike = None,
    ptr_k: PtrLike = None,
    mode: str = "poisson",
    exploration: float = 0.0,
    self_loops: bool = False,
    generator: Optional[torch.Generator] = None,
) -> SampledGraph:
    r"""Dense reference sampler: one independent Bernoulli per pair with the
    probabilities of :func:`expected_adjacency`, :math:`O(H N_q N_k)`.

    It has the same distribution as :func:`fastrg` with the same arguments
    and is meant for tests and small inputs.

    Example:
        >>> memb = torch.ones(4, 1, 1)
        >>> bernoulli(memb, torch.ones(1, 1, 1), memb, mode="exact").num_edges
        16
    """
    P = expected_adjacency(q_memb, block, k_memb, ptr_q=ptr_q, ptr_k=ptr_k,
                           mode=mode, exploration=exploration,
                           self_loops=self_loops)
    check_generator(generator, P.device)
    H, Nq, Nk = P.shape
    mask = torch.bernoulli(P.double(), generator=generator).bool()
    key = mask.reshape(-1).nonzero().view(-1)  # (h * N_q + i) * N_k + j
    # expected_adjacency has checked the pointers.
    ptr_q, _ = as_ptr("ptr_q", ptr_q, Nq, P.device)
    ptr_k, _ = as_ptr("ptr_k", ptr_k, Nk, P.device)
    edges = edges_from_keys(key, H, Nq, Nk, key.numel(), float(P.sum()))
    return SampledGraph(edges.csr, Nq, Nk, H, ptr_q, ptr_k, edges.num_draws,
                        edges.expected_draws)

