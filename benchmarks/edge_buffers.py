r"""Edge-sized memory of one ``SBMConv`` forward and backward: the bytes per
edge of the sampled graph with every view the pass built, and each tensor
of at least :math:`E` elements that an operator allocated during the pass
(seen through a dispatch mode: allocations inside the C++ and Triton kernels
that do not go through the dispatcher are not counted)."""
from __future__ import annotations

from typing import List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchmarks.cases import HEAD_DIM, HEADS, calibrated_conv


class _Allocations(TorchDispatchMode):
    """Records (op, dtype, shape) of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            # Sparse tensors share the storages of their index tensors.
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.seen.append((str(func.overloadpacket.__name__),
                                  str(t.dtype).removeprefix("torch."),
                                  tuple(t.shape), t.untyped_storage().data_ptr(),
                                  t.untyped_storage().nbytes()))
        return out


def edge_buffers(n: int, density: float, device: torch.device,
                 attention_backend: str = "auto") -> dict:
    r"""One forward and backward of a calibrated ``SBMConv`` over :obj:`n`
    tokens: the graph's bytes per edge (views included) and the distinct
    edge-sized buffers (storages of at least :math:`E` elements)."""
    conv = calibrated_conv(HEADS * HEAD_DIM, density, device)
    conv.attention_backend = attention_backend
    x = torch.randn(n, HEADS * HEAD_DIM, device=device, requires_grad=True)
    gen = torch.Generator(device).manual_seed(0)
    conv(x, generator=gen)  # warm-up: lazily registered state
    graphs = []
    conv.register_graph_hook(lambda module, graph: graphs.append(graph))
    with _Allocations() as mode:
        conv(x, generator=gen).square().sum().backward()
    graph = graphs[-1]
    E = graph.num_edges
    storages = {}
    for op, dtype, shape, ptr, nbytes in mode.seen:
        numel = 1
        for s in shape:
            numel *= s
        if numel >= E and ptr not in storages:
            storages[ptr] = dict(op=op, dtype=dtype, shape=list(shape),
                                 bytes_per_edge=nbytes / E)
    buffers = list(storages.values())
    return dict(n=n, density=density, edges=E,
                attention=conv.last_backends["attention"],
                sampler=conv.last_backends["sampler"],
                graph_bytes_per_edge=graph.csr.nbytes() / E,
                edge_sized_buffers=len(buffers),
                buffer_bytes_per_edge=sum(b["bytes_per_edge"] for b in buffers),
                buffers=buffers)
