r"""The lean CSR form of an attention graph: the one type every attention
kernel takes.

:math:`H` heads over :math:`N_q` queries and :math:`N_k` keys are one sparse
matrix of shape :math:`[H N_q, H N_k]` (see :mod:`sbm_pyg.ops.csr`). A
:class:`CSRGraph` stores it as int32 CSR in both orders, 8 bytes per edge:
:obj:`col` (the column :math:`h N_k + j` of each edge, in row order) and
:obj:`perm` (the edges in column order), with the row and column pointers.
Head, query and key of an edge are derived from these; the row of each edge
(:meth:`CSRGraph.row`, for the PyTorch softmax) and the rows in column order
(:meth:`CSRGraph.row_t`, for the transposed products) are built on first use
and cached, 4 bytes per edge each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Union

import torch
from torch import Tensor

from sbm_pyg.ops.csr import row_index

__all__ = ["CSRGraph", "INDEX_DTYPE", "check_index_range"]

# int32 halves every edge-sized index against int64; torch's CSR kernels,
# the C++ and the Triton kernels all take it.
INDEX_DTYPE = torch.int32
_LIMIT = 2**31 - 1


def check_index_range(num_edges: int, num_rows: int, num_cols: int) -> None:
    r"""Raises a :class:`ValueError` where a graph of this size does not fit
    int32 CSR: more than :math:`2^{31} - 1` edges, rows (:math:`H N_q`) or
    columns (:math:`H N_k`). Called before anything of the graph's size is
    allocated."""
    for name, n in (("edges", num_edges), ("rows (heads x queries)", num_rows),
                    ("columns (heads x keys)", num_cols)):
        if n > _LIMIT:
            raise ValueError(
                f"the attention graph would have {n} {name}, more than the "
                f"2^31 - 1 that its int32 CSR holds: attend over fewer "
                f"sequences, heads or tokens per batch")


@dataclass(eq=False)
class CSRGraph:
    r"""The block-diagonal attention matrix :math:`[R, C]`
    (:math:`R = H N_q`, :math:`C = H N_k`) in int32 CSR, both orders.

    Attributes:
        rowptr (IntTensor): :obj:`[R + 1]`, the edges of row :obj:`r` are
            :obj:`rowptr[r]:rowptr[r + 1]`.
        col (IntTensor): :obj:`[E]`, the column of each edge; within a row,
            increasing.
        colptr (IntTensor): :obj:`[C + 1]`, the transposed pointer, over
            :obj:`perm`.
        perm (IntTensor): :obj:`[E]`, the edges in :obj:`(column, row)`
            order; values in edge order are transposed by
            :obj:`values[perm]`.

    Example:
        >>> g = CSRGraph(torch.tensor([0, 1, 3], dtype=torch.int32),
        ...              torch.tensor([1, 0, 1], dtype=torch.int32),
        ...              torch.tensor([0, 1, 3], dtype=torch.int32),
        ...              torch.tensor([1, 0, 2], dtype=torch.int32))
        >>> g.row().tolist(), g.row_t().tolist()
        ([0, 1, 1], [1, 0, 1])
    """

    rowptr: Tensor
    col: Tensor
    colptr: Tensor
    perm: Tensor
    _cache: Dict[str, Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("rowptr", "col", "colptr", "perm"):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != INDEX_DTYPE:
                raise TypeError(f"CSRGraph.{name} must be a 1-D int32 tensor, "
                                f"got {getattr(t, 'dtype', type(t).__name__)}")
        if self.perm.numel() != self.col.numel():
            raise ValueError(f"CSRGraph: col and perm differ in length "
                             f"({self.col.numel()} vs {self.perm.numel()})")

    @property
    def num_rows(self) -> int:
        """:math:`R`, the number of rows."""
        return self.rowptr.numel() - 1

    @property
    def num_cols(self) -> int:
        """:math:`C`, the number of columns."""
        return self.colptr.numel() - 1

    @property
    def num_edges(self) -> int:
        """:math:`E`, the number of edges."""
        return self.col.numel()

    def row(self) -> Tensor:
        r"""The row of each edge, :obj:`[E]` int32, in edge order (cached:
        every layer attending over this graph shares it)."""
        if "row" not in self._cache:
            self._cache["row"] = row_index(self.rowptr, self.num_edges)
        return self._cache["row"]

    def row_t(self) -> Tensor:
        r"""The row of each edge in column order, :obj:`row()[perm]`,
        :obj:`[E]` int32 (cached)."""
        if "row_t" not in self._cache:
            # index_select: half the time of the advanced index on the CPU
            # (1.9 against 3.8 ms for 1.7 M edges), no int64 copy of perm.
            self._cache["row_t"] = self.row().index_select(0, self.perm)
        return self._cache["row_t"]

    def set_row(self, row: Tensor) -> None:
        r"""Caches :meth:`row` as given by a sampler that has it (a graph
        padded past :obj:`rowptr[-1]`, :func:`~sbm_pyg.sampling.fastrg_static`,
        gives its padding a row of its own choice)."""
        self._cache["row"] = self._checked("row", row)

    def set_row_t(self, row_t: Tensor) -> None:
        r"""Caches :meth:`row_t` as given by a kernel that computed it while
        sorting the edges by column (the compiled sampler does: a random
        gather :obj:`row()[perm]` afterwards costs more than the sort)."""
        self._cache["row_t"] = self._checked("row_t", row_t)

    def _checked(self, name: str, rows: Tensor) -> Tensor:
        if (not isinstance(rows, Tensor) or rows.dtype != INDEX_DTYPE
                or rows.shape != self.col.shape):
            raise ValueError(f"{name} must be an int32 tensor of shape "
                             f"{tuple(self.col.shape)}")
        return rows

    def nbytes(self) -> int:
        r"""Bytes held by the graph's edge-sized tensors, the cached views
        included."""
        return sum(t.numel() * t.element_size() for t in
                   (self.col, self.perm, *self._cache.values()))

    def to(self, device: Union[str, torch.device]) -> CSRGraph:
        """A copy on :obj:`device` (cached views are rebuilt there)."""
        return CSRGraph(self.rowptr.to(device), self.col.to(device),
                        self.colptr.to(device), self.perm.to(device))
