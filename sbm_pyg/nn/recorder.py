r"""Recording the graphs that SBMConv layers sample."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.sampling import SampledGraph

__all__ = ["GraphRecorder"]


class GraphRecorder:
    r"""Records every sampled graph of every :class:`~sbm_pyg.nn.SBMConv` in
    a model during forward passes.

    .. code-block:: python

        with GraphRecorder(model) as recorder:
            model(tokens, mask)
        recorder.graphs   # [(layer_index, SampledGraph), ...] in call order
        recorder.backends # the kernels and regime that computed each

    Layers are numbered by their order in :meth:`model.modules`;
    :obj:`recorder.backends[i]` is the layer's :obj:`last_backends` for
    :obj:`recorder.graphs[i]` (its :obj:`"attention"` says whether the
    sparse path, the dense regime or the tiled regime computed it: the
    graph is the same :class:`~sbm_pyg.sampling.SampledGraph` whichever
    did). With
    :obj:`weights=True` each graph's attention weights are recorded too:
    :obj:`recorder.weights[i]` (:obj:`[E]`, detached) belongs to
    :obj:`recorder.graphs[i]` (and
    :func:`~sbm_pyg.theory.to_networkx` takes them).

    Example:
        >>> from sbm_pyg.models import SBMTransformer
        >>> model = SBMTransformer(num_tokens=10, max_len=8, num_layers=2,
        ...                        num_clusters=4)
        >>> with GraphRecorder(model) as recorder:
        ...     _ = model(torch.randint(1, 10, (3, 8)))
        >>> [layer for layer, graph in recorder.graphs]  # (layer, SampledGraph)
        [0, 1]
        >>> sorted(recorder.backends[0])  # the kernels that ran
        ['attention', 'sampler']
    """

    def __init__(self, model: torch.nn.Module, weights: bool = False):
        self.convs = [m for m in model.modules() if isinstance(m, SBMConv)]
        if not self.convs:
            raise ValueError("model has no SBMConv layer to record")
        self.graphs: List[Tuple[int, SampledGraph]] = []
        self.weights: List[Tensor] = []
        self.backends: List[Dict[str, str]] = []
        self.record_weights = weights
        self._handles: List[RemovableHandle] = []

    def __enter__(self) -> GraphRecorder:
        for index, conv in enumerate(self.convs):
            self._handles.append(
                conv.register_weights_hook(self._weights_hook(index))
                if self.record_weights else
                conv.register_graph_hook(self._hook(index)))
        return self

    def _hook(self, index: int) -> Callable[[SBMConv, SampledGraph], None]:
        def hook(module: SBMConv, graph: SampledGraph) -> None:
            self.graphs.append((index, graph))
            self.backends.append(dict(module.last_backends or {}))
        return hook

    def _weights_hook(self, index: int
                      ) -> Callable[[SBMConv, SampledGraph, Tensor], None]:
        def hook(module: SBMConv, graph: SampledGraph, alpha: Tensor) -> None:
            self.graphs.append((index, graph))
            self.backends.append(dict(module.last_backends or {}))
            self.weights.append(alpha)
        return hook

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
