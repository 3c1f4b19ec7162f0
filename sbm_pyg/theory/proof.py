r"""The proof's attention patterns and an SBM that samples them."""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

# The proof's patterns


def _check_nk(n: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(k, int) and 1 <= k < n):
        raise ValueError(f"need integers 1 <= k < n, got n={n}, k={k}")


def proof_patterns(n: int, k: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The three patterns of the proof of Lemma 2, with self-loops, as
    :obj:`[n, n]` bool masks (0-indexed; the relays are the last :math:`k`
    tokens):

    * :math:`\mathcal{A}^1_i = \{i\} \cup \{j : \lfloor ik/n \rfloor =
      \lfloor jk/n \rfloor\}` (:math:`k` blocks),
    * :math:`\mathcal{A}^2_i = \{i\} \cup \{n-k, \dots, n-1\}` (everyone
      attends the relays),
    * :math:`\mathcal{A}^3_i = \{i\}` for :math:`i < n - k`, all tokens for
      the relays.

    Condition 3 as defined cycles through the patterns in order. In this
    order the relays gather every token at :math:`t = 3` (:math:`\mathcal{A}^3`)
    but pass it on only when :math:`\mathcal{A}^2` comes round again, so
    :math:`s = 5` (4 when :math:`k = 2`); the order :math:`(\mathcal{A}^1,
    \mathcal{A}^3, \mathcal{A}^2)` gives the paper's :math:`s = 3`.
    """
    _check_nk(n, k)
    idx = torch.arange(n)
    cluster = idx * k // n
    eye = idx[:, None] == idx[None, :]
    relay = idx >= n - k
    A1 = (cluster[:, None] == cluster[None, :]) | eye
    A2 = relay[None, :].expand(n, n) | eye
    A3 = relay[:, None].expand(n, n) | eye
    return A1, A2, A3


def proof_sbm(n: int, k: int) -> List[Tuple[Tensor, Tensor, Tensor]]:
    r"""SBM parameters :obj:`(q_memb [n, 1, c], block [1, c, c], k_memb [n,
    1, c])` whose edge probabilities are 0/1 and equal the proof's patterns
    without their diagonal; with ``self_loops=True`` and ``mode="exact"``,
    :func:`~sbm_pyg.sampling.fastrg` samples exactly
    :func:`proof_patterns`."""
    _check_nk(n, k)
    idx = torch.arange(n)
    one_hot = torch.nn.functional.one_hot(idx * k // n, k).double()[:, None, :]
    relay = (idx >= n - k).double().view(n, 1, 1)
    ones = torch.ones(n, 1, 1, dtype=torch.float64)
    unit = torch.ones(1, 1, 1, dtype=torch.float64)
    return [(one_hot, torch.eye(k, dtype=torch.float64)[None], one_hot),
            (ones, unit, relay),   # every query attends the relays
            (relay, unit, ones)]   # relays attend every key


def proof_hamiltonian_path(n: int, k: int) -> List[int]:
    r"""The proof's Hamiltonian path through the union of the three
    patterns: the non-relay tokens in order, block by block (:math:`\mathcal{
    A}^1` joins a block), hopping from one block to the next through an
    unused relay (token → relay by :math:`\mathcal{A}^3`, relay → token by
    :math:`\mathcal{A}^2`), then the remaining relays (relay → relay by
    :math:`\mathcal{A}^3`)."""
    _check_nk(n, k)
    relays = list(range(n - k, n))
    path, used, previous = [], 0, None
    for token in range(n - k):
        block = token * k // n
        if previous is not None and block != previous:
            path.append(relays[used])
            used += 1
        path.append(token)
        previous = block
    return path + relays[used:]
