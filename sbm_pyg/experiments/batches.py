r"""What a task generated afresh gives the training loop: batches of
tokens, a mask and labels, where the model's token head runs, and the loss
over the asked tokens."""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch.nn.functional as F
from torch import Tensor

__all__ = ["Batch", "FreshBatches", "AskedTokens"]

Batch = Tuple[Tensor, Tensor, Tensor]  # tokens [B, N], mask [B, N], labels


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

    def batch(self, split: str = "train") -> Batch:
        raise NotImplementedError

    def eval_batches(self, split: str, count: int) -> Iterator[Batch]:
        """:obj:`count` fresh batches."""
        return (self.batch(split) for _ in range(count))


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
