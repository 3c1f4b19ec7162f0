r"""How many operators a training step dispatches, and where
``torch.compile`` breaks its graphs: the CPU's proxy for the launches a GPU
pays per step (each dispatched aten or sbm_pyg operator is at least one
kernel launch there), and the host reads among them
(``aten._local_scalar_dense``: ``int()``, ``float()``, ``.item()``,
``bool()`` of a tensor).

    python -m benchmarks.launches --out launches.json [--quick]

Counted for one training step (forward, backward, Adam) of the LRA model
(``benchmarks.training``: 2 layers, 2 heads of 32, k = 128, batch 1) at
n = 4096 with SBM attention at about 1% and with full attention, and for
one forward and backward of an ``SBMGPSConv`` layer on a random graph
and of ``sbm_attention`` over a batch of both regimes;
graph breaks from ``torch._dynamo.explain`` over ``SBMConv``'s forward, and
that forward's operators by the part of the layer that dispatched them.
Counts, not timings: they do not depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.training import training_step

# What reads a tensor's values to the host, at the Python level (tolist
# reads without dispatching an operator).
READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__index__)
# What reads on CUDA to size its output (a sync there, none on the CPU):
# counted as reads, so that the CPU's count finds them.
SIZED = (torch.bincount, torch.Tensor.bincount, torch.nonzero,
         torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere,
         torch.unique, torch.Tensor.unique, torch.unique_consecutive,
         torch.Tensor.unique_consecutive, torch.masked_select,
         torch.Tensor.masked_select)


def _sized_by_read(func, args, kwargs) -> bool:
    # repeat_interleave with tensor repeats and no output_size sums them on
    # the host; so does a boolean mask as an index.
    if func in SIZED:
        return True
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return (isinstance(repeats, torch.Tensor) and repeats.numel() > 1
                and kwargs.get("output_size") is None)
    if func is torch.Tensor.__getitem__ and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                   for i in index)
    return False


def _reader() -> str:
    # Where a read comes from: the innermost frame of sbm_pyg (file and
    # function), of torch.optim (the optimizers' step counters, which live
    # on the host: no device read on a GPU), or else the caller's.
    stack = traceback.extract_stack()[:-2]  # less this and the mode
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "torch/optim/" in path:
            return "torch.optim"
        if "/sbm_pyg/" in path:
            return f"{path.split('/sbm_pyg/')[-1]}:{frame.name}"
    return "other"


class _Count(TorchDispatchMode):
    # Every operator call that reaches the dispatcher, by name; the views
    # among them (no kernel: a new shape over the same memory) apart.
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        self.views += bool(getattr(func, "is_view", False))
        return func(*args, **(kwargs or {}))


class _Reads(TorchFunctionMode):
    # Every read of a tensor's values to the host, by where it comes from.
    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS or _sized_by_read(func, args, kwargs or {}):
            self.reads[_reader()] += 1
        return func(*args, **(kwargs or {}))


def count_reads(fn: Callable[[], object]) -> Dict[str, int]:
    """The host reads of one call of ``fn``, by where they come from (the
    file under sbm_pyg and its function, ``torch.optim`` or ``other``)."""
    with _Reads() as reads:
        fn()
    return dict(reads.reads)


def count_ops(fn: Callable[[], object]) -> Dict[str, object]:
    """The operators one call of ``fn`` dispatches (after a warm-up call):
    their total, the views among them (which launch nothing), the sbm_pyg
    operators and the ten most frequent; and its
    reads of tensor values to the host, by where they come from
    (``host_reads`` counts all but the optimizers')."""
    fn()
    with _Reads() as reads, _Count() as count:
        fn()
    ops = count.ops
    return dict(ops=sum(ops.values()), views=count.views,
                host_reads=sum(v for k, v in reads.reads.items()
                               if k != "torch.optim"),
                reads=dict(reads.reads),
                sbm_pyg_ops=sum(v for k, v in ops.items()
                                if k.startswith("sbm_pyg.")),
                top=dict(ops.most_common(10)))


#: The parts of an SBM attention forward its operators are counted by
#: (the innermost of these functions that dispatched each one).
PARTS = ("membership", "block", "regimes", "tiles_share", "_plan", "draw",
         "mask_bytes", "attend_graph", "edge_counts", "mean_densities")


class _Parts(TorchDispatchMode):
    # Every operator that launches a kernel (views aside), by the innermost
    # function of PARTS on the Python stack ("other" outside them).
    def __init__(self) -> None:
        super().__init__()
        self.parts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not getattr(func, "is_view", False):
            names = [f.name for f in traceback.extract_stack()[:-1]
                     if "/sbm_pyg/" in f.filename.replace("\\", "/")]
            self.parts[next((n for n in reversed(names) if n in PARTS), "other")] += 1
        return func(*args, **(kwargs or {}))


def forward_parts(n: int) -> Dict[str, int]:
    """The operators (views aside) of one ``SBMConv`` forward (n tokens,
    one sequence, ``attention_backend="auto"``, after a warm-up call), by
    the part of the layer that dispatched them (:data:`PARTS`)."""
    from sbm_pyg.nn import SBMConv
    torch.manual_seed(0)
    conv = SBMConv(64, 32, heads=2, num_clusters=128)
    x = torch.randn(n, 64)
    g = torch.Generator().manual_seed(0)
    conv(x, generator=g)
    with _Parts() as parts:
        conv(x, generator=g)
    return dict(parts.parts.most_common())


def gps_step(nodes: int, channels: int = 64,
             batch_size: Optional[int] = None) -> Callable[[], None]:
    """One forward and backward of an ``SBMGPSConv`` (GatedGCN local, SBM
    global attention, 2 heads) on a random graph of ``nodes`` nodes, its
    batch vector given with its size ``batch_size`` (1) or without."""
    from sbm_pyg.nn import GatedGCNConv, SBMGPSConv
    torch.manual_seed(0)
    layer = SBMGPSConv(channels, GatedGCNConv(channels), heads=2,
                       attn_kwargs=dict(num_clusters=32, eval_seed=0))
    x = torch.randn(nodes, channels, requires_grad=True)
    edge_index = torch.randint(nodes, (2, 4 * nodes))
    edge_attr = torch.randn(edge_index.size(1), channels)
    batch = torch.zeros(nodes, dtype=torch.long)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        out = layer(x, edge_index, batch, edge_attr=edge_attr, generator=g,
                    batch_size=batch_size)
        out.square().sum().backward()
    return step


def mixed_batch(n: int, device: torch.device = torch.device("cpu")
                ) -> Tuple[Callable[[], object], Callable[[object], None]]:
    """The forward and the backward of ``sbm_attention`` over a batch of
    both regimes: two sequences of ``n // 2`` tokens, 2 heads of 32,
    k = 128, exploration 0.01, the first with memberships 1 (p = 1: the
    dense regime), the second 0.01 (the sampler)."""
    from sbm_pyg.nn import SBMAttentionOptions, sbm_attention
    half = n // 2
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(2 * half, 2, 32, generator=g, device=device,
                           requires_grad=True) for _ in "qkv")
    memb = torch.full((2 * half, 2, 128), 0.01, device=device)
    memb[:half] = 1.0
    memb.requires_grad_()
    block = torch.softmax(torch.randn(2, 128 * 128, generator=g, device=device),
                          -1).view(2, 128, 128)
    ptr = torch.tensor([0, half, 2 * half], device=device)
    options = SBMAttentionOptions(exploration=0.01)

    def forward() -> object:
        res = sbm_attention(q, k, v, (memb, block, memb), ptr_q=ptr, ptr_k=ptr,
                            options=options, generator=g)
        assert "dense_pairs" in res.backends, res.backends
        return res.out

    def backward(out: object) -> None:
        assert isinstance(out, torch.Tensor)
        out.square().sum().backward()
    return forward, backward


def graph_breaks(n: int) -> Dict[str, object]:
    """``torch._dynamo.explain`` over one ``SBMConv`` forward (n tokens, one
    sequence): the graphs, the breaks and their reasons, and the sbm_pyg
    operators traced into the graphs (those not there ran eagerly)."""
    from sbm_pyg.nn import SBMConv
    torch.manual_seed(0)
    conv = SBMConv(64, 32, heads=2, num_clusters=128)
    x = torch.randn(n, 64)
    g = torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    out = torch._dynamo.explain(lambda x: conv(x, generator=g))(x)
    traced = sorted({str(node.target) for graph in out.graphs
                     for node in graph.graph.nodes
                     if str(node.target).startswith("sbm_pyg.")})
    return dict(graphs=out.graph_count, breaks=out.graph_break_count,
                reasons=sorted({str(r.reason).split("\n")[0][:160]
                                for r in out.break_reasons}),
                traced=traced)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    n, nodes = (64, 64) if args.quick else (4096, 1024)
    cpu = torch.device("cpu")
    results: dict = dict(n=n, gps_nodes=nodes, torch=torch.__version__)
    results["training_sbm"] = count_ops(training_step("sbm", n, 0.01, cpu))
    results["training_full"] = count_ops(training_step("full", n, 1.0, cpu))
    results["gps_layer"] = count_ops(gps_step(nodes))
    results["gps_layer_sized"] = count_ops(gps_step(nodes, batch_size=1))
    forward, backward = mixed_batch(n)
    results["mixed_batch"] = count_ops(lambda: backward(forward()))
    results["graph_breaks"] = graph_breaks(n)
    results["forward_parts"] = forward_parts(n)
    for name in ("training_sbm", "training_full", "gps_layer", "gps_layer_sized",
                 "mixed_batch"):
        r = results[name]
        print(f"{name}: {r['ops']} operators ({r['views']} views), "
              f"{r['sbm_pyg_ops']} of sbm_pyg; "
              f"{r['host_reads']} host reads: {r['reads']}", flush=True)
    print(f"SBMConv under torch.compile: {results['graph_breaks']}", flush=True)
    print(f"SBMConv forward's operators by part: {results['forward_parts']}",
          flush=True)
    args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
