r"""One call of :func:`~sbm_pyg.nn.sbm_attention` as each regime takes it:
its inputs and requests (:class:`Call`), a regime's share of its result
(:class:`Part`), what the tiled regime cannot serve of it, and the
attention over a sampled graph (the kernels, or the caller's
:obj:`attend`)."""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.sampling.graph import SampledGraph
from sbm_pyg.validation import Check

__all__ = ["Attend", "Call", "Part", "unsupported", "attend_graph"]

# attend(graph, need_weights) -> (out [N_q, H, D_v], weights [E] or None):
# an attention over the sampled graph in place of the kernels (a layer's
# MessagePassing path).
Attend = Callable[[SampledGraph, bool], Tuple[Tensor, Optional[Tensor]]]


class Call(NamedTuple):
    r"""One call's inputs and requests, as each regime takes them (the
    pointers checked; a mixed batch's dense part is a :class:`Call` of its
    own)."""

    query: Tensor
    key: Tensor
    value: Tensor
    q_memb: Tensor
    block: Tensor
    k_memb: Tensor
    ptr_q: Tensor
    ptr_k: Tensor
    include_edges: Optional[Tensor]
    options: SBMAttentionOptions
    training: bool
    need_graph: bool
    need_alpha: bool
    attend: Optional[Attend]
    generator: Optional[torch.Generator]
    # Checks of the inputs not raised yet (they raise at the regime's one
    # host sync) and the first seed, where it was drawn before the regime
    # was chosen.
    checks: List[Check]
    seed: Optional[int]
    # The sink's logits: [H], or one per heads-first row (a mixed batch's
    # dense pairs, as one head).
    sink: Optional[Tensor] = None
    # A static call's dropout seed, on the device (its sampler's seed: the
    # dropout's row streams are of their own purpose), so that nothing is
    # drawn on the host; None: drawn from the generator.
    dropout_seed: Optional[Tensor] = None


class Part(NamedTuple):
    r"""One regime's share of a call: its output, graph and weights where
    asked for, and the edges of each (sequence, head) :obj:`[G, H]`."""

    out: Tensor
    graph: Optional[SampledGraph]
    alpha: Optional[Tensor]
    edges: Tensor


def unsupported(call: Call) -> Dict[str, bool]:
    r"""What of :obj:`call` the tiled regime does not serve, by name."""
    return dict(include_edges=call.include_edges is not None,
                sink=call.sink is not None, attend=call.attend is not None,
                dropout=call.training and call.options.dropout > 0,
                max_edges=call.options.max_edges is not None,
                return_attention_weights=call.need_alpha)


def attend_graph(call: Call, graph: SampledGraph, attention: str
                 ) -> Tuple[Tensor, Optional[Tensor]]:
    r"""The attention over a sampled :obj:`graph`: the :obj:`attention`
    kernel, or the call's own :obj:`attend`; the output and, where asked
    for, the weights."""
    if call.attend is not None:
        return call.attend(graph, call.need_alpha)
    # The straight-through estimator uses the edge probabilities' gradient
    # only: their values are never computed.
    ste = call.options.ste
    need_ste = (torch.is_grad_enabled() and call.q_memb.requires_grad
                and ste is not None)
    sbm = (call.q_memb, call.block, call.k_memb) if need_ste else None
    res = sparse_attention(call.query, call.key, call.value, graph, None,
                           call.options.dropout, call.training,
                           ste=ste or "paper", generator=call.generator,
                           dropout_seed=call.dropout_seed, backend=attention,
                           sbm=sbm, sink=call.sink,
                           return_attention_weights=call.need_alpha)
    if isinstance(res, tuple):  # with the weights
        return res[0], res[1]
    return res, None
