"""The CPU targets of static shapes on the default layer: a
SBMConv(64, 32, heads=2) with a capacity, training mode, one sequence of
1024 tokens (batch_size=1): the operator and shape traces of five
forward+backward calls after a first, their host reads, and torch.compile (inductor,
fullgraph=True, dynamic=False) over four forward+backward calls, its
graphs and recompiles, and the compiled output against the eager one in
evaluation with eval_seed.

    PYTHONPATH=<repo> python targets_check.py > targets_check.log
"""
import json

import torch
import torch._dynamo.utils
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.launches import count_reads
from sbm_pyg.nn import SBMConv
from sbm_pyg.sampling import round_capacity


class Trace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), tuple((tuple(a.shape), str(a.dtype)) for a in args
                                          if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


torch.manual_seed(0)
conv = SBMConv(64, 32, heads=2, capacity=1, eval_seed=0).train()
x = torch.randn(1024, 64)
batch = torch.zeros(1024, dtype=torch.long)
conv(x, batch, batch_size=1)
conv.capacity = round_capacity(float(conv.expected_draws))


def step(layer):
    layer(x, batch, batch_size=1).sum().backward()


step(conv)  # the gradients exist from here on: a steady state
traces = []
for _ in range(5):
    with Trace() as t:
        step(conv)
    traces.append(t.ops)
result = dict(capacity=conv.capacity, expected_draws=float(conv.expected_draws),
              operators=len(traces[0]),
              traces_identical=all(t == traces[0] for t in traces[1:]),
              host_reads=count_reads(lambda: step(conv)))
torch._dynamo.utils.counters.clear()
compiled = torch.compile(conv, fullgraph=True, dynamic=False)
overflows = []
for _ in range(4):
    step(compiled)
    overflows.append(bool(conv.overflow))
result.update(graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"],
              recompiles=sum(torch._dynamo.utils.counters["recompiles"].values()),
              graph_breaks=sum(torch._dynamo.utils.counters["graph_break"].values()),
              overflows=overflows)
conv.eval()
with torch.no_grad():
    a, b = compiled(x, batch, batch_size=1), conv(x, batch, batch_size=1)
# Inductor computes the memberships with other float32 roundings, so a
# draw at a cell's edge (or an edge's thinning at its threshold) can fall
# the other way: how many rows differ, and by how much.
rows = (a - b).abs().amax(1)
result.update(eval_compiled_equals_eager=bool(torch.equal(a, b)),
              eval_max_abs_diff=float(rows.max()),
              eval_rows_differing=int((rows > 1e-5).sum()), eval_rows=a.size(0))
print(json.dumps(result, indent=1))
