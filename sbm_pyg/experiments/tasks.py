r"""The paper's tasks, generated locally: finding repeated tokens (Sec. 5.1)
and ListOps as in the Long Range Arena."""
from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from sbm_pyg.experiments.batches import AskedTokens, Batch, FreshBatches, held_out_generator

__all__ = ["repeat_batch", "repeat_accuracy_bound", "mqar_batch",
           "OPERATORS", "VOCAB", "generate_expression", "evaluate_expression",
           "tokenize", "ListOps", "RepeatTask", "ListOpsTask", "MQARTask",
           "make_task", "task_forward"]


def repeat_batch(batch: int, length: int,
                 generator: Optional[torch.Generator] = None
                 ) -> Tuple[Tensor, Tensor]:
    r"""One batch of "finding repeated tokens": :math:`N` integers uniform in
    :math:`\{1, \dots, N\}`; a token's label is 1 iff its value occurs
    elsewhere in the sequence.

    Returns:
        tokens :math:`(B, N)` long, labels :math:`(B, N)` float.

    Example:
        >>> tokens, labels = repeat_batch(2, 8, torch.Generator().manual_seed(0))
        >>> tokens.shape, labels.shape
        (torch.Size([2, 8]), torch.Size([2, 8]))
    """
    if batch < 1 or length < 2:
        raise ValueError(f"batch must be >= 1 and length >= 2, got {batch}, {length}")
    # On the generator's device, whatever torch's default device is.
    tokens = torch.randint(1, length + 1, (batch, length), generator=generator,
                           device=None if generator is None else generator.device)
    same = tokens[:, :, None] == tokens[:, None, :]
    return tokens, (same.sum(-1) > 1).float()


def repeat_accuracy_bound(length: int, edge_prob: float) -> float:
    r"""The best expected token accuracy on "finding repeated tokens" for one
    attention layer whose query :math:`i` sees each other token
    independently with probability :obj:`edge_prob` (:math:`q`).

    A token with :math:`m \sim \mathrm{Binomial}(N - 1, 1/N)` copies is
    certainly positive once it sees one (probability
    :math:`1 - (1 - q)^m`); seeing none, the best guess is the likelier label.
    So the bound is

    .. math::
        \sum_{m \geq 1} P(m) \bigl(1 - (1 - q)^m\bigr) +
        \max\Bigl(P(0), \sum_{m \geq 1} P(m) (1 - q)^m\Bigr).

    It shows what a sampler allows: the poisson merge mode sees a pair with
    probability at most :math:`1 - e^{-(1 + \delta)}` (about 0.636 at
    :math:`\delta = 0.01`), which caps the accuracy at about 84% for any
    :math:`N`.

    Example:
        >>> round(repeat_accuracy_bound(256, 1.0), 6)
        1.0
        >>> round(repeat_accuracy_bound(256, 0.0), 4)  # the majority class
        0.6314
    """
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int >= 2, got {length!r}")
    if not isinstance(edge_prob, (int, float)) or not 0 <= edge_prob <= 1:
        raise ValueError(f"edge_prob must be in [0, 1], got {edge_prob!r}")
    m = torch.arange(length, dtype=torch.float64)
    log_pm = (torch.lgamma(torch.tensor(length, dtype=torch.float64)) -
              torch.lgamma(m + 1) - torch.lgamma(length - m) +
              m * -math.log(length) + (length - 1 - m) * math.log1p(-1 / length))
    pm = log_pm.exp()
    missed = pm[1:] * (1 - edge_prob) ** m[1:]
    return float(pm[1:].sum() - missed.sum() + torch.maximum(pm[0], missed.sum()))


#: Zoology's exponent of the power law that places the queries (a < 1:
#: most queries close to the key-value pairs, some far).
MQAR_POWER = 0.01


def mqar_batch(batch: int, length: int, num_pairs: int, vocab_size: int,
               generator: Optional[torch.Generator] = None
               ) -> Tuple[Tensor, Tensor]:
    r"""One batch of multi-query associative recall (MQAR), by the recipe of
    Zoology (Arora et al., 2023, "Zoology: Measuring and Improving Recall in
    Efficient Language Models"): :obj:`num_pairs` key-value pairs
    :math:`k_1 v_1 k_2 v_2 \dots` open the sequence (keys distinct, from
    :math:`\{1, \dots, V/2 - 1\}`; values distinct, from :math:`\{V/2,
    \dots, V - 1\}`); each key is asked once in the rest of the sequence,
    at an even offset :math:`2g` after the pairs, the gaps :math:`g` drawn
    without replacement with probability :math:`\propto (g + 1)^{a - 1}`,
    :math:`a = 0.01`; every other position holds a uniform random token.
    The target of a query is its key's value; nothing else is asked.

    Returns:
        tokens :math:`(B, N)` long in :math:`[0, V)`, targets :math:`(B, N)`
        long: the value at each query, :obj:`-100` elsewhere.

    Example:
        >>> tokens, targets = mqar_batch(2, 16, 4, 32, torch.Generator().manual_seed(0))
        >>> tokens.shape, int((targets != -100).sum())  # 4 queries a sequence
        (torch.Size([2, 16]), 8)
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    check_mqar(length, num_pairs, vocab_size)
    device = None if generator is None else generator.device

    def distinct(low: int, high: int) -> Tensor:
        # num_pairs distinct integers in [low, high) per sequence.
        scores = torch.rand(batch, high - low, generator=generator, device=device)
        return scores.topk(num_pairs, dim=1).indices + low

    half = vocab_size // 2
    keys, values = distinct(1, half), distinct(half, vocab_size)
    tokens = torch.randint(0, vocab_size, (batch, length), generator=generator,
                           device=device)
    context = 2 * num_pairs
    tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
    space = (length - context) // 2
    weights = torch.arange(1, space + 1, dtype=torch.float64,
                           device=device) ** (MQAR_POWER - 1)
    gaps = torch.multinomial(weights.expand(batch, space), num_pairs,
                             replacement=False, generator=generator)
    where = context + 2 * gaps
    tokens.scatter_(1, where, keys)
    targets = torch.full_like(tokens, -100).scatter_(1, where, values)
    return tokens, targets


def check_mqar(length: int, num_pairs: int, vocab_size: int) -> None:
    r"""Raises :class:`ValueError` naming the first MQAR size that
    :func:`mqar_batch` cannot build."""
    for name, value in (("length", length), ("num_pairs", num_pairs),
                        ("vocab_size", vocab_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if 4 * num_pairs > length:
        raise ValueError(f"length must be at least 4 * num_pairs = "
                         f"{4 * num_pairs} (the pairs, then room for a query "
                         f"every other position), got {length}")
    if num_pairs > vocab_size // 2 - 1:
        raise ValueError(f"vocab_size must give num_pairs distinct keys in "
                         f"[1, vocab_size // 2): need vocab_size >= "
                         f"{2 * num_pairs + 2}, got {vocab_size}")


# ListOps (Nangia & Bowman, 2018) with the Long Range Arena's generator rules.
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
VOCAB = ("<pad>",) + OPERATORS + ("]",) + tuple(str(d) for d in range(10))
_INDEX = {token: i for i, token in enumerate(VOCAB)}
VALUE_PROBABILITY = 0.75

Tree = Union[int, Tuple[str, list]]


def generate_expression(rng: random.Random, max_depth: int = 10,
                        max_args: int = 10, depth: int = 1) -> Tree:
    r"""A random ListOps tree: a node at depth < :obj:`max_depth` is a value
    (0-9) with probability 0.75, else an operator with
    :obj:`randint(2, max_args)` arguments; at :obj:`max_depth` always a
    value."""
    if depth >= max_depth or rng.random() < VALUE_PROBABILITY:
        return rng.randint(0, 9)
    op = rng.choice(OPERATORS)
    return (op, [generate_expression(rng, max_depth, max_args, depth + 1)
                 for _ in range(rng.randint(2, max_args))])


def evaluate_expression(tree: Tree) -> int:
    r"""MIN, MAX, MED (the median, truncated to int) and SM (sum mod 10)."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [evaluate_expression(a) for a in args]
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[MED":
        return int(statistics.median(values))
    return sum(values) % 10


def tokenize(tree: Tree) -> List[str]:
    """Tokens with parentheses dropped: operator, arguments, ``]``."""
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [op] + [t for a in args for t in tokenize(a)] + ["]"]


class ListOps:
    r"""ListOps splits, generated with a seed and cached on disk.

    Expressions with :obj:`min_length < length < max_length` tokens are kept
    (LRA uses 500 and 2000); duplicates are dropped before splitting, so
    train, val and test are disjoint.

    Args:
        root (str or Path): cache directory.
        sizes (tuple): number of train, val and test sequences.
        min_length, max_length (int): length bounds (exclusive).
        max_depth, max_args (int): generator parameters (LRA: 10, 10).
        seed (int): generator seed.

    Attributes:
        splits: ``{"train": (tokens, lengths, labels), ...}`` with tokens
            padded with 0 to :obj:`max_length - 1`: :math:`(S, N)` long,
            lengths :math:`(S,)`, labels :math:`(S,)` in 0-9.
    """

    def __init__(self, root: Union[str, Path], sizes=(2000, 200, 200),
                 min_length: int = 20, max_length: int = 128,
                 max_depth: int = 10, max_args: int = 10, seed: int = 0):
        if not 0 <= min_length < max_length - 1:
            raise ValueError(f"need 0 <= min_length < max_length - 1, got "
                             f"{min_length}, {max_length}")
        if len(sizes) != 3 or min(sizes) < 0:
            raise ValueError(f"sizes must be three counts >= 0, got {sizes}")
        params = dict(sizes=list(sizes), min_length=min_length,
                      max_length=max_length, max_depth=max_depth,
                      max_args=max_args, seed=seed)
        digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
        path = Path(root) / f"listops-{digest}.pt"
        if path.exists():
            self.splits = torch.load(path, weights_only=True)
        else:
            self.splits = self._generate(**params)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(self.splits, path)
        self.max_length = max_length

    @staticmethod
    def _generate(sizes, min_length, max_length, max_depth, max_args, seed):
        rng = random.Random(seed)
        total, seen, samples = sum(sizes), set(), []
        for _ in range(10_000 * max(total, 1)):
            if len(samples) == total:
                break
            tree = generate_expression(rng, max_depth, max_args)
            tokens = tokenize(tree)
            key = " ".join(tokens)
            if min_length < len(tokens) < max_length and key not in seen:
                seen.add(key)
                samples.append(([_INDEX[t] for t in tokens], evaluate_expression(tree)))
        if len(samples) < total:
            raise ValueError(f"could only generate {len(samples)} distinct "
                             f"expressions of length in ({min_length}, "
                             f"{max_length}); ask for fewer or widen the range")
        splits, start = {}, 0
        for name, size in zip(("train", "val", "test"), sizes):
            chunk = samples[start:start + size]
            start += size
            tokens = torch.zeros(size, max_length - 1, dtype=torch.long)
            for i, (seq, _) in enumerate(chunk):
                tokens[i, :len(seq)] = torch.tensor(seq)
            splits[name] = (tokens, torch.tensor([len(s) for s, _ in chunk]),
                            torch.tensor([label for _, label in chunk]))
        return splits


class RepeatTask(FreshBatches):
    r"""Finding repeated tokens as a training task: fresh batches of
    :func:`repeat_batch`, a binary label per token."""

    def __init__(self, seq_len: int, batch_size: int,
                 generator: torch.Generator):
        self.seq_len, self.batch_size, self.generator = seq_len, batch_size, generator

    def batch(self, split: str = "train",
              generator: Optional[torch.Generator] = None) -> Batch:
        """A fresh batch (every split is drawn alike, from :obj:`generator`
        or the task's): tokens, mask (all real) and a label per token."""
        tokens, labels = repeat_batch(self.batch_size, self.seq_len,
                                      self.generator if generator is None else generator)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), labels

    @staticmethod
    def loss_and_correct(out, mask: Tensor, labels: Tensor
                         ) -> Tuple[Tensor, Tensor, int]:
        """Binary cross-entropy over the real tokens, the number predicted
        right and the number of tokens."""
        logits = out.token_logits.squeeze(-1)[mask]
        target = labels.to(logits.device)[mask.to(logits.device)]
        loss = F.binary_cross_entropy_with_logits(logits, target)
        return loss, ((logits > 0).float() == target).sum(), target.numel()


class ListOpsTask:
    r"""ListOps as a training task: random batches of a :class:`ListOps`
    split, a class (0-9) per sequence; the test split is evaluated whole."""

    output = "sequence"
    padded = True
    positions = staticmethod(FreshBatches.positions)

    def __init__(self, data: ListOps, batch_size: int,
                 generator: torch.Generator):
        self.data, self.batch_size, self.generator = data, batch_size, generator

    def batch(self, split: str = "train",
              generator: Optional[torch.Generator] = None) -> Batch:
        """Random examples of :obj:`split` (drawn by :obj:`generator` or
        the task's), padded to the longest: tokens, mask and a label per
        sequence."""
        tokens, lengths, labels = self.data.splits[split]
        # Each rank draws its own examples.
        idx = torch.randint(0, tokens.size(0), (self.batch_size,),
                            generator=self.generator if generator is None else generator)
        return self._padded(tokens[idx], lengths[idx], labels[idx])

    def eval_batches(self, split: str, count: int) -> Iterator[Batch]:
        """:obj:`count` random batches, the same on every call
        (:func:`held_out_generator`), or the whole test split in order."""
        if split != "test":
            generator = held_out_generator(split)
            return (self.batch(split, generator) for _ in range(count))
        tokens, lengths, labels = self.data.splits["test"]
        return (self._padded(tokens[start:start + self.batch_size],
                             lengths[start:start + self.batch_size],
                             labels[start:start + self.batch_size])
                for start in range(0, tokens.size(0), self.batch_size))

    @staticmethod
    def _padded(tokens: Tensor, lengths: Tensor, labels: Tensor) -> Batch:
        n = int(lengths.max())
        return tokens[:, :n], torch.arange(n)[None, :] < lengths[:, None], labels

    @staticmethod
    def loss_and_correct(out, mask: Tensor, labels: Tensor
                         ) -> Tuple[Tensor, Tensor, int]:
        """Cross-entropy over the sequences, the number predicted right and
        the number of sequences."""
        target = labels.to(out.seq_logits.device)
        loss = F.cross_entropy(out.seq_logits, target)
        return loss, (out.seq_logits.argmax(-1) == target).sum(), target.numel()


class MQARTask(AskedTokens):
    r"""Multi-query associative recall as a training task: fresh batches of
    :func:`mqar_batch`, a value to recall at each query position; the
    accuracy is over the query positions."""

    def __init__(self, seq_len: int, num_pairs: int, vocab_size: int,
                 batch_size: int, generator: torch.Generator):
        self.seq_len, self.num_pairs, self.vocab_size = seq_len, num_pairs, vocab_size
        self.batch_size, self.generator = batch_size, generator

    def batch(self, split: str = "train",
              generator: Optional[torch.Generator] = None) -> Batch:
        """A fresh batch (every split is drawn alike, from :obj:`generator`
        or the task's): tokens, mask (all real) and a target per token
        (:obj:`-100` where nothing is asked)."""
        tokens, targets = mqar_batch(self.batch_size, self.seq_len,
                                     self.num_pairs, self.vocab_size,
                                     self.generator if generator is None else generator)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), targets


def task_forward(model: torch.nn.Module, task: Union[RepeatTask, ListOpsTask, MQARTask],
                 batch: Batch, device: torch.device,
                 generator: Optional[torch.Generator] = None) -> Any:
    r"""The :class:`~sbm_pyg.models.SBMTransformer` (or its wrapper)
    :obj:`model` on one of :obj:`task`'s batches :obj:`(tokens, mask,
    labels)`: the task's head only (:obj:`output`), at the positions it
    asks (:meth:`MQARTask.positions`), the mask only where the task pads."""
    tokens, mask, labels = batch
    positions = task.positions(labels)
    # A task without padding passes no mask: the attentions then take the
    # sequences as they are, reading nothing off a mask.
    return model(tokens.to(device), mask.to(device) if task.padded else None,
                 generator=generator,
                 output=task.output,
                 positions=None if positions is None else positions.to(device))


def make_task(args, generator: torch.Generator
              ) -> Union[RepeatTask, ListOpsTask, MQARTask]:
    r"""The task of a training run's arguments (:obj:`task`,
    :obj:`seq_len`, :obj:`batch_size`, the ListOps, MQAR and masked-byte
    options)."""
    if args.task == "repeat":
        return RepeatTask(args.seq_len, args.batch_size, generator)
    if args.task == "mqar":
        return MQARTask(args.seq_len, args.num_pairs, args.vocab_size,
                        args.batch_size, generator)
    if args.task == "mlm":
        from sbm_pyg.experiments.text import ByteCorpus, MaskedBytesTask
        return MaskedBytesTask(ByteCorpus(args.text_root), args.seq_len,
                               args.batch_size, generator, args.mask_rate)
    data = ListOps(args.data_dir, sizes=tuple(args.listops_sizes),
                   min_length=args.listops_min_length, max_length=args.seq_len,
                   seed=args.seed)
    return ListOpsTask(data, args.batch_size, generator)
