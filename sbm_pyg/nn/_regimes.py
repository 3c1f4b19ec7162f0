r"""Which regime each (sequence, head) of an SBM attention call takes,
chosen before anything is sampled or read to the host: the sparse path or
the dense-regime kernel, by the expected density against the device's
crossover."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from sbm_pyg.nn.block_model import check_exact_densities, expected_densities
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.ops import backend_info
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend
from sbm_pyg.sampling.checks import PtrLike, check_pointers
from sbm_pyg.validation import Check

__all__ = ["regimes"]


@torch.compiler.disable  # data-dependent: the pointers' checks and the choice
def regimes(query: Tensor, sbm: Tuple[Tensor, Tensor, Tensor],
            ptr_q: PtrLike, ptr_k: PtrLike, Nk: int,
            opts: SBMAttentionOptions, custom: bool
            ) -> Tuple[Tensor, Tensor, List[Check], Optional[Tensor],
                       Optional[Tensor]]:
    r"""The pointers :obj:`[G + 1]` and their checks (raised at the
    regime's one sync; until then the pointers are made valid), which
    (sequence, head) pairs take the dense regime (:obj:`[G, H]` bool), or
    :obj:`None` where the choice is not the expected density's, and the
    expected densities :obj:`[G, H]` where they made the choice or the
    exact mode checks them (with their gradient: the layer reports them
    too). :obj:`custom`: an attention of the caller's runs (no dense
    regime). Nothing is read to the host here."""
    Nq, device = query.size(0), query.device
    ptr_q, ptr_k, checks = check_pointers(ptr_q, ptr_k, Nq, Nk, device)
    backend = opts.attention_backend
    auto = backend == "auto" and not custom and dense_runs(device)
    per = (expected_densities(ptr_q, ptr_k, *sbm)
           if auto or opts.mode == "exact" else None)
    if per is not None and opts.mode == "exact":
        checks.append(check_exact_densities(per))
    if per is None or not auto:
        if backend == "dense":
            resolve_backend("attention", "dense", device)
        return ptr_q, ptr_k, checks, None, per
    dense = (per.detach().double() + opts.exploration
             >= backend_info.dense_crossover(device)[0])
    pairs = ptr_q.diff() * ptr_k.diff()
    # Empty sequences join the other regime: no split for them.
    return (ptr_q, ptr_k, checks,
            dense | ((pairs == 0)[:, None] & dense.any()), per)
