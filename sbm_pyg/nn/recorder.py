r"""Recording the graphs that SBMConv layers sample."""
from __future__ import annotations

from typing import List, Tuple

import torch

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

    Layers are numbered by their order in :meth:`model.modules`.
    """

    def __init__(self, model: torch.nn.Module):
        self.convs = [m for m in model.modules() if isinstance(m, SBMConv)]
        if not self.convs:
            raise ValueError("model has no SBMConv layer to record")
        self.graphs: List[Tuple[int, SampledGraph]] = []
        self._handles = []

    def __enter__(self) -> "GraphRecorder":
        for index, conv in enumerate(self.convs):
            self._handles.append(conv.register_graph_hook(
                lambda module, graph, index=index: self.graphs.append((index, graph))))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
