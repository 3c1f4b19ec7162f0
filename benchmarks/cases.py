r"""Inputs of the benchmark cases: sampled graphs of a given density, SBM
memberships, queries/keys/values, and an SBMConv calibrated to a density."""
from __future__ import annotations

import math
from typing import List, Sequence

import torch
from torch import Tensor

from sbm_pyg.nn import SBMConv
from sbm_pyg.sampling import SampledGraph, fastrg

HEADS, HEAD_DIM, CLUSTERS = 2, 32, 128


def fixed_graph(n: int, density: float, device: torch.device,
                seed: int = 0) -> SampledGraph:
    """Each pair of each head is an edge with probability ``density``
    (constant memberships, exact mode)."""
    memb = torch.full((n, HEADS, 1), math.sqrt(density), device=device)
    block = torch.ones(HEADS, 1, 1, device=device)
    return fastrg(memb, block, memb, mode="exact",
                  generator=torch.Generator(device).manual_seed(seed))


def sbm_memberships(n: int, density: float, device: torch.device,
                    batch: int = 1, seed: int = 0):
    """Random k=128 memberships scaled so that the expected density is
    ``density`` (rates scale with the square of the memberships)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(batch * n, HEADS, CLUSTERS, generator=g)
    k = torch.rand(batch * n, HEADS, CLUSTERS, generator=g)
    block = torch.softmax(torch.randn(HEADS, CLUSTERS * CLUSTERS, generator=g),
                          -1).view(HEADS, CLUSTERS, CLUSTERS)
    mass = torch.einsum("hu,huv,hv->h", q[:n].sum(0), block, k[:n].sum(0))
    scale = torch.sqrt(density * n * n / mass.mean())
    ptr = torch.arange(batch + 1) * n
    return ((q * scale).to(device), block.to(device), (k * scale).to(device),
            ptr.to(device))


def qkv(n: int, device: torch.device, seed: int = 1) -> List[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, HEADS, HEAD_DIM, generator=g).to(device).requires_grad_()
            for _ in range(3)]


def kaiming_sbm(batch: int, n: int, device: torch.device, seed: int = 0):
    """A random SBM-Transformer head at initialization: memberships
    sigmoid(N(0, 1)) and the block softmax(C C^T) of kaiming-normal cluster
    embeddings C [k, D]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch * n, HEADS, CLUSTERS, generator=g).sigmoid()
    k = torch.randn(batch * n, HEADS, CLUSTERS, generator=g).sigmoid()
    C = torch.randn(HEADS, CLUSTERS, HEAD_DIM, generator=g) * math.sqrt(2 / HEAD_DIM)
    block = (C @ C.transpose(1, 2)).flatten(1).softmax(-1).view(HEADS, CLUSTERS, CLUSTERS)
    ptr = torch.arange(batch + 1) * n
    return q.to(device), block.to(device), k.to(device), ptr.to(device)


def calibrated_conv(channels: int, density: float, device: torch.device,
                    steps: int = 300, attention_backend: str = "auto") -> SBMConv:
    """An SBMConv whose expected density on N(0, 1) inputs is about
    ``density``: its SBM is fitted to that target with Adam on the
    closed-form expected density (no sampling needed); the same weights
    for every ``attention_backend``."""
    torch.manual_seed(0)
    conv = SBMConv(channels, HEAD_DIM, heads=HEADS, num_clusters=CLUSTERS,
                   root_weight=False, exploration=0.0,
                   attention_backend=attention_backend).to(device)
    opt = torch.optim.Adam(conv.sbm.parameters(), lr=1e-2)
    x = torch.randn(512, channels, device=device)
    for _ in range(steps):
        q = conv.lin_query(x).view(-1, HEADS, HEAD_DIM)
        k = conv.lin_key(x).view(-1, HEADS, HEAD_DIM)
        qm, block, km = conv.sbm(q, k)
        expected = torch.einsum("hu,huv,hv->h", qm.sum(0), block, km.sum(0)) / 512**2
        loss = (expected.log() - math.log(density)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return conv


def backward(out: Tensor, tensors: Sequence[Tensor]) -> None:
    """Gradients of ``out.sum()`` with respect to ``tensors``."""
    torch.autograd.grad(out.sum(), tensors)
