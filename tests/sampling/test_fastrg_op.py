"""The sampler operators sbm_pyg::fastrg_plan and fastrg_sample: one schema
with a kernel per device, as torch.library's checker sees them, and the C++
and Triton kernels' plans and graphs against each other."""
import os

import pytest
import torch

from sbm_pyg.ops import WITH_TRITON, triton_runs
from sbm_pyg.sampling import fastrg_triton
from tests.helpers import seeded
from tests.markers import needs_cpp, needs_triton

pytestmark = pytest.mark.host


def op_inputs(mode="exact", exploration=0.0, dtype=torch.float64):
    """The plan's arguments for a ragged batch of three sequences (one
    empty), as fastrg_op.sample builds them."""
    g = seeded(0)
    Nq, H, k = 30, 2, 4
    Y = torch.rand(Nq, H, k, generator=g, dtype=dtype)
    Z = torch.rand(Nq, H, k, generator=g, dtype=dtype)
    B = torch.rand(H, k, k, generator=g, dtype=dtype) * 0.1
    W = torch.bmm(Y.transpose(0, 1), B).contiguous()
    ptr = torch.tensor([0, 12, 12, Nq])
    return [Y, W, Z, ptr, ptr, exploration, mode == "exact", 2**61 + 7, 0.5]


def sample_inputs(plan_args, plan_out, self_loops=True):
    Y, W, Z, ptr_q, ptr_k, delta, exact, seed, _ = plan_args
    degree, inflation, mass, _ = plan_out
    # Included pairs: query 0 gets key 5, query 13 gets key 20.
    inc_ptr = torch.zeros(Y.size(0) + 1, dtype=torch.long)
    inc_ptr[1:] = 1
    inc_ptr[14:] = 2
    inc_col = torch.tensor([5, 20])
    # The Triton kernel's draw buffer (the C++ kernel does not read it).
    capacity = int(fastrg_triton.buffer_slots(degree, ptr_q, ptr_k, W.size(0),
                                              inc_ptr, self_loops).sum())
    return [W, Z, mass, ptr_q, ptr_k, delta, exact, seed, degree, inflation,
            self_loops, inc_ptr, inc_col, capacity]


def test_one_schema_with_a_kernel_per_device():
    # Fake kernels for every operator; the Triton kernels on CUDA where
    # Triton imports.
    for name in ("fastrg_plan", "fastrg_sample"):
        op = f"sbm_pyg::{name}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")
        assert (torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
                == WITH_TRITON)


@needs_cpp
def test_cpu_kernel_is_the_extension():
    for name in ("fastrg_plan", "fastrg_sample"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            f"sbm_pyg::{name}", "CPU")


@needs_cpp
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_opcheck(mode):
    # Schemas and fake kernels as torch.library's checker sees them; the
    # sample's edge count is data-dependent (a dynamic size in the fake).
    args = op_inputs(mode, exploration=0.01)
    torch.library.opcheck(torch.ops.sbm_pyg.fastrg_plan.default, args)
    out = torch.ops.sbm_pyg.fastrg_plan(*args)
    torch.library.opcheck(torch.ops.sbm_pyg.fastrg_sample.default,
                          sample_inputs(args, out),
                          test_utils=("test_schema", "test_faketensor"))


@needs_cpp
def test_plan_statistics():
    args = op_inputs("poisson")
    degree, inflation, mass, stats = torch.ops.sbm_pyg.fastrg_plan(*args)
    Y, W, Z, ptr = args[:4]
    assert degree.dtype == torch.long and degree.shape == (2 * 30,)
    assert torch.equal(inflation, torch.ones(60, dtype=torch.float64))
    # Key cluster masses and maxima of each (sequence, head), the empty
    # sequence's zero.
    expect = torch.stack([Z[0:12].sum(0), Z[0:0].sum(0), Z[12:30].sum(0)])
    torch.testing.assert_close(mass[0], expect, rtol=1e-12, atol=0)
    top = torch.stack([Z[0:12].amax(0), torch.zeros_like(Z[0]), Z[12:30].amax(0)])
    assert torch.equal(mass[1], top)
    mass = mass[0]
    draws, expected, edges, overflow, bad_q, bad_k = stats.tolist()
    assert draws == degree.clamp(min=0).sum() and draws == edges
    lam = (W.reshape(2, 30, 4) * mass[[0] * 12 + [2] * 18].transpose(0, 1)
           ).sum(-1)
    assert expected == pytest.approx(float(lam.sum()), rel=1e-12)
    assert (overflow, bad_q, bad_k) == (0, 0, 0)
    Y = Y.clone()
    Y[3, 1, 2] = float("nan")
    Z = Z.clone()
    Z[0, 0, 0] = -1.0
    Z[1, 0, 0] = float("inf")
    stats = torch.ops.sbm_pyg.fastrg_plan(Y, *[W, Z] + args[3:])[3]
    assert stats[4:].tolist() == [1.0, 1.0]  # flags: q_memb, k_memb invalid
    stats = torch.ops.sbm_pyg.fastrg_plan(*args[:2], Z, *args[3:])[3]
    assert stats[4:].tolist() == [0.0, 1.0]


@needs_cpp
@needs_triton
@pytest.mark.skipif(not triton_runs(torch.device("cpu")),
                    reason="the twin operators need TRITON_INTERPRET=1")
@pytest.mark.parametrize("mode,exploration", [("poisson", 0.0),
                                              ("exact", 0.02)])
def test_triton_kernels_give_the_cpp_outputs(mode, exploration):
    # Plan and sample of both kernels from the same arguments: the same
    # degrees, masses, statistics and graph.
    args = op_inputs(mode, exploration)
    ops = torch.ops.sbm_pyg
    ref = ops.fastrg_plan(*args)
    out = ops.triton_fastrg_plan(*args)
    assert torch.equal(out[0], ref[0])
    for a, b in zip(out[1:], ref[1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    graph_ref = ops.fastrg_sample(*sample_inputs(args, ref))
    graph = ops.triton_fastrg_sample(*sample_inputs(args, ref))
    assert graph_ref[1].numel() > 20
    for a, b in zip(graph, graph_ref):
        assert a.dtype == b.dtype == torch.int32
        assert torch.equal(a, b)


def _sample_ops():
    ops = torch.ops.sbm_pyg
    out = [pytest.param(ops.fastrg_sample, marks=needs_cpp, id="cpp")]
    if WITH_TRITON and triton_runs(torch.device("cpu")):
        out.append(pytest.param(ops.triton_fastrg_sample, id="triton"))
    return out


@pytest.mark.parametrize("op", _sample_ops())
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_sample_into_padded_buffers(op, mode):
    # slots > 0: the same graph written into buffers of that length, padded
    # with column and row 0 and perm the identity, and the row of each edge;
    # fewer slots than edges refused.
    args = op_inputs(mode, exploration=0.01)
    plan = torch.ops.sbm_pyg.fastrg_plan(*args)
    inputs = sample_inputs(args, plan)
    rowptr, col, perm, colptr, row_t, row = op(*inputs)
    assert row.numel() == 0
    E = col.numel()
    assert E > 20
    slots = E + 9
    out = op(*inputs, slots)
    assert all(t.dtype == torch.int32 for t in out)
    assert torch.equal(out[0], rowptr) and torch.equal(out[3], colptr)
    for padded, exact in zip((out[1], out[2], out[4]), (col, perm, row_t)):
        assert padded.shape == (slots,)
        assert torch.equal(padded[:E], exact)
    assert torch.equal(out[1][E:], torch.zeros(9, dtype=torch.int32))
    assert torch.equal(out[4][E:], torch.zeros(9, dtype=torch.int32))
    assert torch.equal(out[2][E:], torch.arange(E, slots, dtype=torch.int32))
    counts = rowptr.diff().long()
    expect = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    assert torch.equal(out[5][:E].long(), expect)
    assert torch.equal(out[5][E:], torch.zeros(9, dtype=torch.int32))
    assert torch.equal(op(*inputs, E)[1], col)  # exactly full
    with pytest.raises(RuntimeError if op is torch.ops.sbm_pyg.fastrg_sample
                       else ValueError, match="do not fit"):
        op(*inputs, E - 1)


@needs_cpp
def test_padded_sample_fake_is_static():
    # The fake kernel of a padded call has the slots' static length.
    from torch._subclasses.fake_tensor import FakeTensorMode
    args = op_inputs("poisson")
    inputs = sample_inputs(args, torch.ops.sbm_pyg.fastrg_plan(*args))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                for t in inputs]
        out = torch.ops.sbm_pyg.fastrg_sample(*fake, 77)
    assert [tuple(t.shape) for t in out] == [
        (61,), (77,), (77,), (61,), (77,), (77,)]


@needs_triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="reads the kernels' interpreted form")
def test_triton_kernels_compile_once_whatever_the_seed_and_sizes():
    # The JIT specialises an int on divisibility by 16 and on the value 1,
    # and types it by its value: a seed, a size or an edge count that
    # changed that would compile another variant of the kernel for some
    # calls. Their types are fixed and they are not specialised.
    import inspect

    from sbm_pyg.sampling import fastrg_triton_kernels as kernels
    from tests.triton_abi import jit_binding
    scalars = {"seed", "delta", "threshold", "R", "Nq", "Nk", "N", "E"}
    for kernel in (kernels.plan_kernel, kernels.weight_kernel,
                   kernels.guide_kernel, kernels.draw_kernel,
                   kernels.merge_kernel, kernels.graph_kernel):
        params = inspect.signature(kernel.fn).parameters
        tensor = torch.empty(4, dtype=torch.float64, device="cpu")

        def launch(value, seed):
            return {name: (1 if "constexpr" in str(p.annotation) else
                           (seed if name == "seed" else value) if name in scalars
                           else tensor) for name, p in params.items()}
        specs = [jit_binding(kernel, (), launch(v, s))[3]
                 for v, s in ((16, 16), (17, 3), (1, 2**61 + 1))]
        assert specs[0] == specs[1] == specs[2], kernel.fn.__name__
        types = dict(zip(params, (t for t, _ in specs[0])))
        assert types.get("seed", "i64") == "i64"
        assert types.get("delta", "fp64") == types.get("threshold", "fp64") == "fp64"


class _PhiloxGenerator:
    """A CUDA generator's host-side state: a seed and a Philox offset."""

    def __init__(self, seed, offset=0):
        self.seed, self.offset = seed, offset

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return self.offset

    def set_offset(self, offset):
        self.offset = offset


def test_a_cuda_stream_seed_is_drawn_on_the_host():
    # From the generator's seed and offset, which advances by 4 per seed as
    # a kernel's draws would: the same state gives the same seed, every
    # draw another one, and no kernel runs (a CPU test can pass a CUDA
    # device: nothing touches it).
    from sbm_pyg.sampling.fastrg_op import stream_seed
    cuda = torch.device("cuda")
    gen = _PhiloxGenerator(1234)
    seeds = [stream_seed(gen, cuda) for _ in range(100)]
    assert gen.offset == 400
    assert len(set(seeds)) == 100
    assert all(0 <= s < 2**62 for s in seeds)
    assert stream_seed(_PhiloxGenerator(1234, 8), cuda) == seeds[2]
    assert stream_seed(_PhiloxGenerator(1235, 8), cuda) != seeds[2]
    # The top bits are used: the largest of 100 seeds is near 2^62.
    assert max(seeds) > 2**61


@needs_cpp
@pytest.mark.parametrize("lengths", [[5, 0, 40, 17], [700, 300]])
def test_sampled_rows_in_column_order_are_the_rows_through_perm(lengths):
    # The C++ sample writes row_t in its column sort (one pass per
    # (sequence, head) block, two radix passes past 256 keys): it must be
    # the row of each edge in column order, row()[perm].
    from sbm_pyg.ops.csr import row_index
    from sbm_pyg.sampling import fastrg
    g = torch.Generator().manual_seed(5)
    n = sum(lengths)
    ptr = torch.tensor([0] + lengths).cumsum(0)
    memb = torch.rand(n, 2, 4, generator=g) * 0.3
    block = torch.rand(2, 4, 4, generator=g)
    graph = fastrg(memb, block, memb, ptr_q=ptr, ptr_k=ptr, mode="exact",
                   self_loops=True, generator=g, backend="cpp")
    csr = graph.csr
    assert csr.num_edges > 100
    expected = row_index(csr.rowptr, csr.num_edges)[csr.perm.long()]
    assert torch.equal(csr.row_t(), expected)
    # And in column order the columns are sorted, rows increasing within.
    cols = csr.col[csr.perm.long()]
    assert bool((cols.diff() >= 0).all())
    same = cols.diff() == 0
    assert bool((csr.row_t().diff()[same] > 0).all())
