r"""What :class:`~sbm_pyg.nn.SBMConv` takes: node features (dense or
sparse) and the sequences of a batch, as a sorted batch vector or CSR
pointers."""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import is_sparse

from sbm_pyg.nn.block_model import INITS, PARAMETRIZATIONS
from sbm_pyg.nn.options import SBM_ATTENTION_BACKENDS
from sbm_pyg.validation import invalid_values, require_tensor, sync

__all__ = ["eval_randomness", "project", "batch_to_ptr", "check_not_edges", "sequence_pointers",
           "check_layer_options", "raise_for_features", "raise_for_batch",
           "raise_for_memory"]


def project(lin: Linear, x, name: str) -> Tensor:
    r""":obj:`lin(x)` for node features :obj:`x` :obj:`[N, F]` checked by
    :obj:`name`; sparse features (torch.sparse or torch_sparse.SparseTensor)
    are projected with a sparse-dense product."""
    if not (isinstance(x, Tensor) or is_sparse(x)):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be a [num_nodes, channels] matrix, got "
                         f"shape {tuple(x.size())}")
    if lin.in_channels > 0 and x.size(-1) != lin.in_channels:
        raise ValueError(f"{name} must have {lin.in_channels} channels, got "
                         f"{x.size(-1)}")
    if not is_sparse(x):
        return lin(x)
    weight_t = lin.weight.t()
    out = x @ weight_t if isinstance(x, SparseTensor) else torch.sparse.mm(x, weight_t)
    return out if lin.bias is None else out + lin.bias


def batch_to_ptr(batch: Tensor, num_rows: int, num_graphs: int,
                 name: str) -> Tensor:
    r"""The CSR pointer :obj:`[G + 1]` of a sorted batch vector."""
    require_tensor(name, batch, 1)
    if batch.dtype != torch.long:
        raise TypeError(f"{name} must be a LongTensor, got {batch.dtype}")
    if batch.numel() != num_rows:
        raise ValueError(f"{name} must have one entry per node ({num_rows}), "
                         f"got {batch.numel()}")
    return torch.searchsorted(batch, torch.arange(num_graphs + 1,
                                                  device=batch.device))


def check_not_edges(batch: object) -> None:
    r"""Refuses an :obj:`edge_index` passed where the batch vector goes."""
    # conv(x, edge_index) is every PyG user's first call: say what this
    # layer takes instead.
    if is_sparse(batch) or (isinstance(batch, Tensor) and batch.dim() == 2):
        shape = tuple(batch.size()) if isinstance(batch, Tensor) else "sparse"
        raise ValueError(
            f"SBMConv takes (x, batch): batch must be the 1-D sequence index "
            f"of each node, got a {shape} graph, which looks like an "
            f"edge_index. SBMConv samples its own attention graph; pass a "
            f"local graph as include_edges=edge_index to add it to every "
            f"head's graph")


def sequence_pointers(batch, ptr, num_src: int, num_dst: int,
                      batch_size: Optional[int] = None
                      ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    r"""CSR pointers :obj:`(ptr_k, ptr_q)` of the key and query rows, from a
    sorted :obj:`batch` vector (or a pair) or given :obj:`ptr` (or a pair);
    :obj:`(None, None)` for one sequence.

    Without :obj:`batch_size` the number of sequences is read off the
    batch vector (a host read, with the vector's checks). With it (PyG's
    :obj:`Batch.num_graphs`) nothing is read: a batch vector that is not
    sorted, has a negative entry or one at :obj:`batch_size` or above gives
    pointers whose check fails at the layer's one sync, where
    :func:`raise_for_batch` names the batch vector."""
    if batch_size is not None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool):
            raise TypeError(f"batch_size must be an int or None, got "
                            f"{type(batch_size).__name__}")
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if ptr is not None:
        if batch is not None:
            raise ValueError("pass either batch or ptr, not both")
        if batch_size is not None:
            raise ValueError("batch_size goes with batch: ptr gives the "
                             "sequences itself")
        return ptr if isinstance(ptr, tuple) else (ptr, ptr)
    if batch is None:
        if batch_size not in (None, 1):
            raise ValueError(f"batch_size goes with batch: without one the "
                             f"nodes are one sequence, got batch_size={batch_size}")
        return None, None
    check_not_edges(batch)
    batch_src, batch_dst = batch if isinstance(batch, tuple) else (batch, batch)
    if batch_src is None or batch_dst is None:
        raise ValueError("batch must give both the source and the "
                         "target batch vector")
    if batch_size is not None:
        return (_unread_ptr(batch_src, num_src, batch_size),
                _unread_ptr(batch_dst, num_dst, batch_size))
    flags = [(b.diff() < 0).any() | (b < 0).any()
             for b in (batch_src, batch_dst) if isinstance(b, Tensor)]
    last = [b[-1] for b in (batch_src, batch_dst)
            if isinstance(b, Tensor) and b.numel() > 0]
    flags_and_max = sync([(flag, "batch must be sorted and non-negative "
                                 "(as PyG's DataLoader makes it)")
                          for flag in flags],
                         *last)
    num_graphs = int(max(flags_and_max, default=-1)) + 1
    return (batch_to_ptr(batch_src, num_src, num_graphs, "batch"),
            batch_to_ptr(batch_dst, num_dst, num_graphs, "batch"))


def _unread_ptr(batch: Tensor, num_rows: int, batch_size: int) -> Tensor:
    # The pointer of batch_size sequences, its last entry made -1 (which
    # the pointer's own deferred check refuses) where the vector is not
    # sorted or not in [0, batch_size): no host read here.
    ptr = batch_to_ptr(batch, num_rows, batch_size, "batch")
    bad = ((batch.diff() < 0).any() | (batch < 0).any()
           | (batch >= batch_size).any())
    return torch.cat([ptr[:-1], torch.where(bad, -1, ptr[-1:])])


def raise_for_batch(err: ValueError, batch_size: Optional[int]) -> None:
    r"""Re-raises a pointer's failed check as one naming the batch vector,
    where the pointers came from a batch vector with :obj:`batch_size`
    (:func:`sequence_pointers`); returns for any other error."""
    if batch_size is not None and str(err).startswith(("ptr_q must", "ptr_k must")):
        raise ValueError(
            f"batch must be sorted and non-negative (as PyG's DataLoader "
            f"makes it), each entry below batch_size ({batch_size})") from err


def raise_for_features(err: ValueError) -> None:
    r"""Re-raises the sampler's error on non-finite memberships as one
    naming the layer's inputs; returns for any other error."""
    # Sigmoid memberships are never negative: NaN or inf came in with the
    # features (or the weights). Name what the user passed.
    for memb, source in (("q_memb", "x (x_dst: the queries)"),
                         ("k_memb", "x (x_src: the keys)")):
        if str(err) == invalid_values(memb):
            raise ValueError(
                f"SBMConv: {source} or the layer's weights contain NaN or "
                f"inf, so its SBM memberships are not finite") from err


def check_layer_options(kwargs: Dict[str, Any], *, sbm_init: str,
                        sbm_parametrization: str, attention_backend: str,
                        eval_seed: Optional[int],
                        init_density: Optional[float] = None,
                        weights: Optional[Dict[str, float]] = None) -> None:
    r"""Checks the options an SBM attention layer (:class:`SBMConv`) has
    beside :class:`~sbm_pyg.nn.SBMAttentionOptions`' when it is built,
    naming the argument (:obj:`weights`: its losses' weights by name, each
    a number >= 0); sets :obj:`aggr` and :obj:`flow` of the
    :class:`MessagePassing` :obj:`kwargs`."""
    for weight, number in (weights or {}).items():
        if not (isinstance(number, (int, float)) and number >= 0):
            raise ValueError(f"{weight} must be a number >= 0, got {number!r}")
    # The softmax over a query's edges is the aggregation, from keys to
    # queries: no kernel has other aggregations or flows.
    if kwargs.setdefault("aggr", "add") != "add":
        raise ValueError(f"aggr must be 'add' (attention sums its "
                         f"softmax-weighted values), got {kwargs['aggr']!r}")
    if kwargs.setdefault("flow", "source_to_target") != "source_to_target":
        raise ValueError(f"flow must be 'source_to_target' (keys are "
                         f"sources, queries targets), got {kwargs['flow']!r}")
    # The layer's attention also has PyG's gather/scatter message() path.
    layer_backends = SBM_ATTENTION_BACKENDS + ("message_passing",)
    for name, value, choices in (
            ("sbm_init", sbm_init, INITS),
            ("sbm_parametrization", sbm_parametrization, PARAMETRIZATIONS),
            ("attention_backend", attention_backend, layer_backends)):
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got "
                             f"{value!r}")
    if eval_seed is not None and (not isinstance(eval_seed, int)
                                  or isinstance(eval_seed, bool)):
        raise TypeError(f"eval_seed must be an int or None, got "
                        f"{eval_seed!r}")
    if init_density is not None:
        if isinstance(init_density, bool) or not isinstance(init_density, (int, float)) \
                or not 0 < init_density < 1:
            raise ValueError(f"init_density must be a number in (0, 1) (e.g. an "
                             f"expected degree over the nodes), got {init_density!r}")
        if sbm_init != "paper":
            raise ValueError(f"give sbm_init={sbm_init!r} or init_density, not both")


def raise_for_memory(err: ValueError) -> None:
    r"""Re-raises the sampler's refusal of a graph that would not fit into
    memory as one saying what a layer can do about it; returns for any
    other error."""
    if "GiB are available" in str(err):
        raise ValueError(
            f"{err}. An SBMConv starts near 25% of the pairs: on a large "
            f"graph build it with init_density (e.g. 64 / n for an expected "
            f"degree of 64) and hold it there while training with a "
            f"DensityBudget or the density penalty (max_edges caps one "
            f"call)") from err


_EVAL_WARNED = [False]


def _warn_eval_samples() -> None:
    # Said once: a user who compares two eval() calls on one input sees them
    # differ; sampling stays the default, as the paper evaluates.
    if not _EVAL_WARNED[0]:
        _EVAL_WARNED[0] = True
        warnings.warn("SBMConv samples its attention graph in eval() too, as "
                      "the paper evaluates: two calls on one input differ. "
                      "Build the layer with eval_seed=<int> (SBMConv, "
                      "SBMMultiheadAttention, SBMTransformer; SBMGPSConv "
                      "through attn_kwargs={'eval_seed': <int>}), or pass a "
                      "seeded generator, for repeatable evaluation.",
                      UserWarning, stacklevel=4)


def eval_randomness(eval_seed: Optional[int], static: bool, device: torch.device
                    ) -> Tuple[Optional[torch.Generator], Optional[Tensor]]:
    r"""A layer's randomness in :obj:`eval()` without a generator: a
    generator seeded with :obj:`eval_seed`, or with :obj:`static` shapes
    (a capacity) that seed as a 0-dim tensor, which a compiled graph takes
    where it takes no generator; :obj:`(None, None)` without an
    :obj:`eval_seed` (and the warning, once, that evaluation samples)."""
    if eval_seed is None:
        _warn_eval_samples()
        return None, None
    if static:
        return None, torch.full((), eval_seed, dtype=torch.int64, device=device)
    return torch.Generator(device).manual_seed(eval_seed), None
