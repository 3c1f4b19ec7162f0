r"""The ext suite: torch-scatter and torch-sparse kernels against the ones
sbm_pyg uses, per operation of the attention."""
from __future__ import annotations

from typing import Sequence

import torch

from benchmarks.cases import HEAD_DIM, HEADS, fixed_graph
from benchmarks.measure import median_times


def bench_ext(n: int, densities: Sequence[float], device: torch.device,
              repeats: int, log) -> dict:
    """The optional PyG kernels (torch-scatter, torch-sparse) against the ones
    sbm_pyg uses, per operation of the attention, on one sampled graph."""
    import torch_geometric.typing as pyg_typing
    if not (pyg_typing.WITH_TORCH_SCATTER and pyg_typing.WITH_TORCH_SPARSE):
        log("  skipped: torch-scatter / torch-sparse not installed")
        return dict(skipped="torch-scatter / torch-sparse not installed")
    import torch_scatter
    import torch_sparse

    from sbm_pyg.ops.csr import spmm
    rows = []
    for density in densities:
        graph = fixed_graph(n, density, device)
        # torch-scatter and torch-sparse take int64 indices.
        rowptr, col = graph.rowptr.long(), graph.csr.col.long()
        g = torch.Generator(device).manual_seed(0)
        values = torch.rand(graph.num_edges, generator=g, device=device)
        dense = torch.randn(HEADS * n, HEAD_DIM, generator=g, device=device)
        adj = torch_sparse.SparseTensor(rowptr=rowptr, col=col, value=values,
                                        sparse_sizes=(HEADS * n, HEADS * n),
                                        is_sorted=True, trust_data=True)
        cases = {
            "segment_max": (
                lambda: torch.segment_reduce(values, "max", offsets=rowptr,
                                             unsafe=True),
                lambda: torch_scatter.segment_csr(values, rowptr, reduce="max")),
            "segment_sum": (
                lambda: torch.segment_reduce(values, "sum", offsets=rowptr,
                                             unsafe=True),
                lambda: torch_scatter.segment_csr(values, rowptr, reduce="sum")),
            "spmm": (lambda: spmm(rowptr, col, values, dense),
                     lambda: torch_sparse.matmul(adj, dense)),
        }
        row = dict(n=n, density=density, edges=graph.num_edges)
        for name, (ours, theirs) in cases.items():
            t = median_times(dict(ours=ours, theirs=theirs), device, repeats)
            row[name] = dict(ours=t["ours"], ext=t["theirs"],
                             ratio=t["theirs"] / t["ours"])
            log(f"  density {density} {name}: ours {t['ours'] * 1e3:.2f} ms, "
                f"ext {t['theirs'] * 1e3:.2f} ms ({row[name]['ratio']:.2f}x)")
        rows.append(row)
    return dict(rows=rows)
