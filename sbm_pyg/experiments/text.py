r"""Masked-byte modelling on real text that a pinned package ships: the
encoder's own task (15% of the bytes masked, the rest seen in both
directions), on the Python sources inside the installed ``torch``, nothing
downloaded.

The files are split by a hash of their path relative to the root (one in
ten held out for test, one in ten for validation), so a file's bytes are
never both trained on and tested, and the split does not move when files
are added elsewhere. Each split is its files' bytes end to end (a newline
between files); a sequence is a window of it at a random offset.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import torch
from torch import Tensor

from sbm_pyg.experiments.batches import AskedTokens, Batch

__all__ = ["MASK", "BYTE_CLASSES", "MASK_RATE", "text_root", "split_of", "ByteCorpus",
           "MaskedBytesTask", "add_text_arguments", "bits_per_byte"]

#: The 256 byte values are the classes; the token 256 marks a masked byte.
BYTE_CLASSES = 256
MASK = 256
#: The share of each sequence's bytes that is masked (BERT's).
MASK_RATE = 0.15
SPLITS = ("train", "val", "test")


def text_root() -> Path:
    """The default corpus: the directory of the installed ``torch`` package
    (its ``.py`` files; ``torch==2.13.0`` is pinned, so the text is too)."""
    return Path(torch.__file__).parent


def split_of(relative: str) -> str:
    r"""The split of the file at :obj:`relative` (a POSIX path below the
    root): the first byte of its SHA-1 modulo 10 is 0 for test, 1 for
    validation, else train.

    Example:
        >>> split_of("nn/modules/linear.py") in ("train", "val", "test")
        True
    """
    bucket = hashlib.sha1(relative.encode()).digest()[0] % 10
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


class ByteCorpus:
    r"""The ``.py`` files below :obj:`root` as three byte streams
    (:attr:`splits`: uint8 tensors), split by :func:`split_of`.

    Args:
        root (str or Path, optional): the directory (default
            :func:`text_root`).
        min_bytes (int): the least bytes each split must hold (a sequence
            is a window of one split).
    """

    def __init__(self, root: Optional[Union[str, Path]] = None, min_bytes: int = 2):
        self.root = Path(text_root() if root is None else root)
        if not self.root.is_dir():
            raise ValueError(f"root must be a directory of .py files, got {str(self.root)!r}")
        parts: Dict[str, list] = {name: [] for name in SPLITS}
        files: Dict[str, int] = dict.fromkeys(SPLITS, 0)
        for path in sorted(self.root.rglob("*.py")):
            name = split_of(path.relative_to(self.root).as_posix())
            parts[name] += [path.read_bytes(), b"\n"]
            files[name] += 1
        self.files = files
        self.splits = {name: _bytes(b"".join(chunks)) for name, chunks in parts.items()}
        short = {n: s.numel() for n, s in self.splits.items() if s.numel() < min_bytes}
        if short:
            raise ValueError(f"root {str(self.root)!r} holds too little text for "
                             f"sequences of {min_bytes} bytes in split(s) {short} "
                             f"(bytes per split; files per split: {files})")

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}={s.numel()}" for n, s in self.splits.items())
        return f"{self.__class__.__name__}({sizes})"


class MaskedBytesTask(AskedTokens):
    r"""Masked-byte modelling as a training task: windows of
    :obj:`seq_len` bytes of a :class:`ByteCorpus` split, exactly
    :math:`\lceil 0.15 N \rceil` of each window's bytes replaced by
    :data:`MASK`, the byte to predict there (:obj:`-100` elsewhere). The
    loss is the cross-entropy at the masked bytes; :obj:`bits_per_byte`
    is that loss over :math:`\ln 2`.

    Training windows are fresh draws of :obj:`generator`; validation and
    test windows and masks come from a generator seeded by the split alone,
    so every model of a comparison is scored on the same masked bytes.
    """

    def __init__(self, corpus: ByteCorpus, seq_len: int, batch_size: int,
                 generator: torch.Generator, mask_rate: float = MASK_RATE):
        if not 0 < mask_rate < 1:
            raise ValueError(f"mask_rate must lie in (0, 1), got {mask_rate!r}")
        self.corpus, self.seq_len, self.batch_size = corpus, seq_len, batch_size
        self.generator = generator
        self.num_masked = math.ceil(mask_rate * seq_len)
        short = {n: s.numel() for n, s in corpus.splits.items() if s.numel() < seq_len}
        if short:
            raise ValueError(f"seq_len {seq_len} is longer than the corpus's "
                             f"split(s) {short} (bytes)")

    def batch(self, split: str = "train",
              generator: Optional[torch.Generator] = None) -> Batch:
        """Random windows of :obj:`split`: tokens (bytes, :data:`MASK` where
        masked), mask (all real) and the masked bytes' values."""
        gen = self.generator if generator is None else generator
        stream = self.corpus.splits[split]
        starts = torch.randint(0, stream.numel() - self.seq_len + 1,
                               (self.batch_size, 1), generator=gen)
        window = stream[starts + torch.arange(self.seq_len)].long()
        # The same number masked in every window: the head gathers [B, M].
        scores = torch.rand(self.batch_size, self.seq_len, generator=gen)
        where = scores.topk(self.num_masked, dim=1).indices.sort(dim=1).values
        labels = torch.full_like(window, -100).scatter_(1, where, window.gather(1, where))
        tokens = window.scatter(1, where, MASK)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), labels


def add_text_arguments(add: Callable[..., object]) -> None:
    """The masked-byte task's options, added with :obj:`add` (a parser's
    :obj:`add_argument`)."""
    add("--text-root", type=Path, default=None,
        help="mlm: a directory whose .py files are the corpus (default: the "
             "installed torch's sources)")
    add("--mask-rate", type=float, default=MASK_RATE,
        help="mlm: the share of each sequence's bytes masked")


def bits_per_byte(loss: float) -> float:
    """A cross-entropy in nats per byte, in bits."""
    return loss / math.log(2)



def _bytes(data: bytes) -> Tensor:
    # torch.frombuffer refuses an empty buffer.
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
