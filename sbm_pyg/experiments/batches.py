r"""What a task generated afresh gives the training loop: batches of
tokens, a mask and labels, where the model's token head runs, and the loss
over the asked tokens."""
from __future__ import annotations

from typing import Iterator, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Batch", "FreshBatches", "AskedTokens", "HELD_OUT_SEEDS", "held_out_generator"]

Batch = Tuple[Tensor, Tensor, Tensor]  # tokens [B, N], mask [B, N], labels

#: The seeds of the held-out splits' generators: far from the training
#: streams' (seed * 1000 + rank), so that no rank trains on them.
HELD_OUT_SEEDS = {"val": 2**62 + 1, "test": 2**62 + 2}
# The graphs' streams of a split: apart from its batches' (which start
# from the same numbers otherwise).
_GRAPHS = 16


def held_out_generator(split: str, device: Union[torch.device, str] = "cpu",
                       graphs: bool = False) -> torch.Generator:
    """A fresh generator of the held-out :obj:`split`'s batches (or, with
    :obj:`graphs`, of the graphs a model samples for them) on
    :obj:`device`: an evaluation that draws from it draws the same at
    every call, and nothing from the training stream, so that how often a
    run evaluates does not change how it trains."""
    if split not in HELD_OUT_SEEDS:
        raise ValueError(f"split must be one of {tuple(HELD_OUT_SEEDS)}, got {split!r}")
    return torch.Generator(device).manual_seed(HELD_OUT_SEEDS[split] + (_GRAPHS if graphs else 0))


class FreshBatches:
    """A task whose batches are generated afresh for every split; every
    token real (no padding: the model takes no mask)."""

    output = "token"
    padded = False

    @staticmethod
    def positions(labels: Tensor) -> Optional[Tensor]:
        """Where the token head must run (bool :obj:`[B, N]`); :obj:`None`:
        everywhere."""
        return None

    def batch(self, split: str = "train",
              generator: Optional[torch.Generator] = None) -> Batch:
        raise NotImplementedError

    def eval_batches(self, split: str, count: int) -> Iterator[Batch]:
        """:obj:`count` batches of the held-out :obj:`split`, the same on
        every call (:func:`held_out_generator`)."""
        generator = held_out_generator(split)
        return (self.batch(split, generator) for _ in range(count))


class AskedTokens(FreshBatches):
    """A task that asks for a class at some positions (the labels there;
    :obj:`-100` elsewhere), the same number in every sequence."""

    @staticmethod
    def positions(labels: Tensor) -> Tensor:
        """Where an answer is asked: the positions :obj:`[B, P]` in order,
        found on the host (the labels are the generator's) so that the
        model gathers a known size; the model's token head runs only there
        (``SBMTransformer(..., positions=)``)."""
        return (labels != -100).nonzero()[:, 1].view(labels.size(0), -1)

    @staticmethod
    def loss_and_correct(out, mask: Tensor, labels: Tensor
                         ) -> Tuple[Tensor, Tensor, int]:
        """Cross-entropy over the asked positions, the number right and the
        number asked; the token logits at every position :obj:`[B, N, C]`
        or at the asked ones only :obj:`[P, C]` (:meth:`positions`)."""
        logits = out.token_logits
        # Selected on the host, where the labels are: no read of the device.
        asked = labels != -100
        target = labels[asked].to(logits.device)
        if logits.dim() == 3:
            logits = logits[asked.to(logits.device)]
        loss = F.cross_entropy(logits, target)
        return loss, (logits.argmax(-1) == target).sum(), target.numel()
