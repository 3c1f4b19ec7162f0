"""The fused Triton kernels against the PyTorch path of sparse_attention.

On a machine without a GPU they run under Triton's interpreter
(TRITON_INTERPRET=1, set in conftest), on small inputs."""
import os

import pytest
import torch

from sbm_pyg.nn.functional import sparse_attention
from sbm_pyg.sampling import fastrg
from tests.helpers import TEST_DEVICE, seeded
from tests.markers import needs_triton_installed

PTR = [0, 4, 9, 9, 13]  # a ragged batch with an empty sequence


def graph_and_inputs(dtype, H=2, D=5, DV=6, k=3, density=0.4, seed=0):
    g = seeded(seed)
    N = PTR[-1]
    memb = torch.rand(N, H, k, generator=g, dtype=torch.float64)
    block = torch.rand(H, k, k, generator=g, dtype=torch.float64) * density
    graph = fastrg(memb, block, memb, ptr_q=PTR, ptr_k=PTR, generator=g)
    query, key = (torch.randn(N, H, D, generator=g).to(dtype) for _ in "qk")
    value = torch.randn(N, H, DV, generator=g).to(dtype)
    prob = torch.rand(graph.num_edges, generator=g).to(dtype)
    return graph, [query, key, value, prob]


def run(backend, graph, inputs, ste="paper", grad_seed=1):
    inputs = [t.clone().requires_grad_() for t in inputs]
    out, alpha = sparse_attention(*inputs[:3], graph, inputs[3], ste=ste,
                                  backend=backend,
                                  return_attention_weights=True)
    grad = torch.randn(out.shape, generator=seeded(grad_seed)).to(out.dtype)
    out.backward(grad)
    return out, alpha, [t.grad for t in inputs]


@needs_triton_installed
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12),
                                       (torch.float32, 1e-5)])
@pytest.mark.parametrize("ste", ["paper", "published"])
@pytest.mark.parametrize("D,DV", [(5, 6), (4, 4), (1, 3)])
def test_triton_matches_the_torch_path(dtype, tol, ste, D, DV):
    # float32's tolerance covers a GPU's FMA contraction and ex2.approx
    # (the interpreter computes neither).
    graph, inputs = graph_and_inputs(dtype, D=D, DV=DV)
    rows = graph.rowptr.diff()
    assert graph.num_edges > 20 and (rows == 0).any() and (rows > 1).any()
    ref = run("torch", graph, inputs, ste)
    got = run("triton", graph, inputs, ste)
    assert got[0].dtype == dtype
    for a, b in zip([got[0], got[1], *got[2]], [ref[0], ref[1], *ref[2]]):
        assert torch.allclose(a, b, rtol=tol, atol=tol)


@needs_triton_installed
def test_triton_rows_longer_than_a_block():
    # Every query attends to all 40 keys: rows span two blocks of 32 edges
    # and the online softmax rescales across them.
    from sbm_pyg.ops import triton_attention as _triton_attention
    N = 40
    memb = torch.ones(N, 1, 1, dtype=torch.float64)
    graph = fastrg(memb, torch.full((1, 1, 1), 50.0, dtype=torch.float64),
                   memb, generator=seeded(0))
    assert graph.num_edges == N * N > N * _triton_attention.BLOCK_E
    g = seeded(1)
    inputs = [torch.randn(N, 1, 8, generator=g, dtype=torch.float64) * 3
              for _ in range(3)] + [torch.rand(N * N, generator=g,
                                               dtype=torch.float64)]
    ref, got = run("torch", graph, inputs), run("triton", graph, inputs)
    for a, b in zip([got[0], *got[2]], [ref[0], *ref[2]]):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@needs_triton_installed
def test_triton_edge_offsets_past_int32():
    # One row of 40 edges stored at the end of an int32 CSR of 2^31 - 1
    # edges gives what it gives at offset 0: block starts near 2^31 plus
    # arange(BLOCK) must not wrap. The edge arrays are allocated, not
    # written, so on a CPU they take 40 edges' pages (8 GiB each of address
    # space).
    from sbm_pyg.ops.triton_attention import attention_backward, attention_forward
    E, n, C = 2**31 - 1, 40, 3
    g = seeded(0)
    q, k, v = (torch.randn(m, 4, generator=g) for m in (1, C, C))
    grad_out = torch.randn(1, 4, generator=g)
    c = torch.arange(n, dtype=torch.int32) % C
    # the edges in column order: all from row 0, keys 0, 1, 2
    colptr = torch.tensor([0, 14, 27, n], dtype=torch.int32)

    def at(offset, size):
        col = torch.empty(size, dtype=torch.int32)
        row_t = torch.empty(size, dtype=torch.int32)
        col[offset:] = c
        row_t[offset:] = 0
        rowptr = torch.tensor([offset, offset + n], dtype=torch.int32)
        out, lse = attention_forward(rowptr, col, q, k, v, 0.5)
        grads = attention_backward(rowptr, col, colptr + offset, row_t, q, k,
                                   v, out, lse, grad_out, 0.5, "paper")
        return out, lse, *grads[:3], grads[3][offset:]
    for got, ref in zip(at(E - n, E), at(0, n)):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


@needs_triton_installed
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_precision_inputs(dtype):
    # Accumulated in float32, returned in the inputs' dtype: as close to the
    # float32 result as the rounding of inputs and output allows.
    graph, inputs = graph_and_inputs(torch.float32)
    ref = run("torch", graph, inputs)
    got = run("triton", graph, [t.to(dtype) for t in inputs])
    assert got[0].dtype == dtype and all(g.dtype == dtype for g in got[2])
    assert torch.allclose(got[0].float(), ref[0], atol=5e-2, rtol=5e-2)
    for a, b in zip(got[2][:3], ref[2][:3]):
        assert torch.isfinite(a).all()
        assert torch.allclose(a.float(), b, atol=1e-1, rtol=1e-1)


@needs_triton_installed
@pytest.mark.parametrize("ste", ["paper", "published"])
def test_triton_membership_gradients_match_the_cpp_kernel(ste):
    # With sbm=, both kernels sum dL/dp_e into Q̂Ŝ (rows) and K̂ (columns)
    # inside backward: every gradient agrees, memberships included.
    graph, (q, k, v, _) = graph_and_inputs(torch.float64)
    g = seeded(3)
    memb = [torch.rand(PTR[-1], 2, 3, generator=g, dtype=torch.float64),
            torch.rand(2, 3, 3, generator=g, dtype=torch.float64),
            torch.rand(PTR[-1], 2, 3, generator=g, dtype=torch.float64)]
    grad_out = torch.randn(q.shape[0], 2, v.shape[2], generator=seeded(4),
                           dtype=torch.float64)
    grads = {}
    for backend in ("cpp", "triton", "torch"):
        # The C++ kernel runs on CPU copies.
        device = "cpu" if backend == "cpp" else q.device
        leaves = [t.to(device).clone().requires_grad_() for t in [q, k, v, *memb]]
        out = sparse_attention(*leaves[:3], graph.to(device), sbm=tuple(leaves[3:]),
                               ste=ste, backend=backend)
        out.backward(grad_out.to(device))
        grads[backend] = [out.cpu()] + [t.grad.cpu() for t in leaves]
    for name in ("triton", "torch"):
        for a, b in zip(grads[name], grads["cpp"]):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@needs_triton_installed
def test_triton_op_passes_opcheck():
    # The operator with its Triton kernels (on CPU tensors the twin
    # operator, under the interpreter) passes the schema, autograd and fake
    # kernel checks.
    from tests.ops.test_fused_attention import op_inputs
    op = (torch.ops.sbm_pyg.sparse_attention if TEST_DEVICE.type == "cuda"
          else torch.ops.sbm_pyg.triton_sparse_attention)
    for form in ("edge_prob", "sbm"):
        args = op_inputs(form)
        for i in range(4, 10):
            if args[i] is not None:
                args[i] = args[i].requires_grad_()
        for dropout in ((), (torch.tensor(2**40 + 3), 2**52)):
            torch.library.opcheck(op.default, args + [0.5, 1, True, *dropout])


@needs_triton_installed
def test_triton_without_edge_prob_or_grad():
    graph, (q, k, v, _) = graph_and_inputs(torch.float64)
    ref = sparse_attention(q, k, v, graph)
    with torch.no_grad():
        got = sparse_attention(q, k, v, graph, backend="triton")
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    q.requires_grad_()
    sparse_attention(q, k, v, graph, backend="triton").sum().backward()
    assert torch.isfinite(q.grad).all()


@needs_triton_installed
def test_triton_backend_errors():
    graph, (q, k, v, _) = graph_and_inputs(torch.float32)
    with pytest.raises(ValueError, match="backend must be one of"):
        sparse_attention(q, k, v, graph, backend="cuda")


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only")
def test_ci_runs_the_triton_kernels():
    # CI installs triton (the test extra), so the tests above cannot all be
    # skipped there without notice.
    from sbm_pyg.ops import triton_runs
    assert triton_runs(torch.get_default_device())


@needs_triton_installed
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_triton_sink_matches_the_torch_path(dtype, tol):
    # An attention sink: the kernels' log-sum-exp and its gradient (which
    # joins each row's delta), against the PyTorch path's; the estimator's
    # gradient included.
    graph, inputs = graph_and_inputs(dtype)
    sink = torch.tensor([0.4, -0.7], dtype=dtype)
    results = []
    for backend in ("torch", "triton"):
        x = [t.clone().requires_grad_() for t in (*inputs, sink)]
        out, alpha = sparse_attention(*x[:3], graph, x[3], sink=x[4],
                                      backend=backend, return_attention_weights=True)
        out.backward(torch.randn(out.shape, generator=seeded(1)).to(dtype))
        results.append([out, alpha, *(t.grad for t in x)])
    assert results[1][-1].abs().min() > 1e-6  # the sink's gradient
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=tol, atol=tol)


@needs_triton_installed
def test_triton_half_rows_gather_the_factors_in_half_precision():
    # Under autocast the rows are bfloat16: the backward reads the factors'
    # rows in bfloat16 too (half the bytes it gathers per edge), sums their
    # gradients in float32 and returns them in float32. So float32 factors
    # give exactly what their bfloat16 roundings give, and the gradients
    # stay near the float32 rows' ones.
    from sbm_pyg.ops.triton_attention import attention_backward, attention_forward
    graph, (q, k, v, _) = graph_and_inputs(torch.float32, H=1)
    csr, g = graph.csr, seeded(5)
    q, k, v = (t[:, 0] for t in (q, k, v))
    q_block, k_memb = (torch.rand(t.size(0), 3, generator=g) for t in (q, k))
    grad_out = torch.randn(v.shape, generator=g)

    def grads(rows, factors):
        q_, k_, v_ = (t.to(rows) for t in (q, k, v))
        out, lse = attention_forward(csr.rowptr, csr.col, q_, k_, v_, 0.5)
        return attention_backward(csr.rowptr, csr.col, csr.colptr, csr.row_t(),
                                  q_, k_, v_, out, lse, grad_out.to(rows), 0.5,
                                  "paper", *factors)[4:]
    half = grads(torch.bfloat16, (q_block, k_memb))
    assert all(t.dtype == torch.float32 for t in half)
    rounded = grads(torch.bfloat16, [t.bfloat16().float() for t in (q_block, k_memb)])
    full = grads(torch.float32, (q_block, k_memb))
    for a, b, c in zip(half, rounded, full):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
        torch.testing.assert_close(a, c, rtol=5e-2, atol=5e-2)
