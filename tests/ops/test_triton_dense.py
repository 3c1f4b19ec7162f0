"""The Triton dense-regime kernels against the CPU operator: the same mask
for the same seed, the same output and gradients.

Without a GPU the Triton kernels run under the interpreter on CPU tensors
(the twin operators sbm_pyg::triton_dense_attention(_backward)); on CUDA
the operator's own kernels run and the CPU operator is given copies."""

import pytest
import torch

from sbm_pyg.ops import dense_attention
from sbm_pyg.ops.csr import heads_first
from sbm_pyg.sampling.fastrg_op import included_csr
from tests.helpers import TEST_DEVICE, seeded
from tests.markers import needs_extension, needs_triton_installed

# The CPU operator (sbm_pyg._C) is what the Triton kernels are compared with.
pytestmark = [needs_triton_installed, needs_extension]

H, D, DV, K = 2, 8, 6, 5
# A ragged batch: a sequence without queries or keys, one longer than
# every tile (32 rows at most).
SIZES = (5, 0, 37, 70)


def inputs(dtype, sizes=SIZES, scale=0.25):
    g = seeded(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    N = int(ptr[-1])
    memb = [torch.rand(N, H, K, generator=g, dtype=dtype) for _ in "qk"]
    block = torch.rand(H, K, K, generator=g, dtype=dtype) * scale
    x = [torch.randn(H * N, d, generator=g, dtype=dtype) for d in (D, D, DV)]
    return ptr, memb[0], block, memb[1], x


def run(device, ptr, q_memb, block, k_memb, x, ste="paper", lse_weight=0.0,
        **kwargs):
    # The operator on `device` ("twin": the Triton kernels on CPU tensors),
    # its output, mask, edges and the gradients of a fixed loss.
    twin = device == "twin"
    device = "cpu" if twin else device
    leaves = [t.detach().to(device).requires_grad_()
              for t in (*x, q_memb, block, k_memb)]
    q, k, v, qm, b, km = leaves
    q_block = heads_first(torch.einsum("nhu,huv->nhv", qm, b))
    if "included" in kwargs:
        kwargs["included"] = tuple(t.to(device) for t in kwargs["included"])
    res = dense_attention(q, k, v, q_block, heads_first(km), ptr.to(device),
                          ptr.to(device), heads=H, scale=0.3, seed=12345,
                          ste=ste, triton_on_cpu=twin, **kwargs)
    w = torch.randn(res.out.shape, generator=torch.Generator("cpu").manual_seed(3),
                    dtype=res.out.dtype, device="cpu").to(device)
    params = leaves if ste else leaves[:3]
    loss = (res.out * w).sum()
    if lse_weight:  # an attention sink's way in: the log-sum-exp's gradient
        loss = loss + lse_weight * res.lse.nan_to_num(neginf=0.0).sin().sum()
    grads = torch.autograd.grad(loss, params)
    return [t.cpu() for t in (res.out, res.mask, res.edges, *grads, res.lse)]


def unpack(mask):
    return (mask[:, None] >> torch.arange(8, dtype=torch.uint8, device=mask.device)) & 1


def triton_device():
    return "twin" if TEST_DEVICE.type == "cpu" else TEST_DEVICE


@pytest.mark.parametrize("ste", ["paper", "published", None])
@pytest.mark.parametrize("mode", ["exact", "poisson"])
def test_same_mask_output_and_gradients_as_the_cpu_kernel(mode, ste):
    # float64: the masks bit for bit, outputs and every gradient to 1e-9,
    # with exploration, self-loops and included pairs (one a self-loop, one
    # already likely drawn).
    ptr, *args = inputs(torch.float64)
    inc = included_csr(torch.tensor([3, 10, 10, 50, 50]),
                       torch.tensor([1, 12, 40, 100, 50]), int(ptr[-1]),
                       int(ptr[-1]))
    kwargs = dict(mode=mode, exploration=0.01, self_loops=True, included=inc)
    ref = run("cpu", ptr, *args, ste=ste, **kwargs)
    got = run(triton_device(), ptr, *args, ste=ste, **kwargs)
    assert torch.equal(got[1], ref[1]), "mask"
    assert torch.equal(got[2], ref[2]), "edges"
    pairs = float((ptr.diff() ** 2).sum() * H)
    assert 0.15 < float(ref[2].sum()) / pairs < 0.85
    names = ["out", "q", "k", "v", "q_memb", "block", "k_memb"]
    for name, a, b in zip(names, [got[0], *got[3:-1]], [ref[0], *ref[3:-1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=name)
        assert b.abs().max() > 0, name


@pytest.mark.parametrize("ste", ["paper", None])
def test_the_log_sum_exp_and_its_gradient_as_the_cpu_kernel(ste):
    # An attention sink differentiates each row's log-sum-exp: its values
    # and the gradients it adds (through each row's delta) match.
    ptr, *args = inputs(torch.float64)
    ref = run("cpu", ptr, *args, ste=ste, lse_weight=0.7)
    got = run(triton_device(), ptr, *args, ste=ste, lse_weight=0.7)
    plain = run("cpu", ptr, *args, ste=ste)
    torch.testing.assert_close(got[-1], ref[-1], rtol=0, atol=1e-12)
    for name, a, b, c in zip(["q", "k", "v", "q_memb", "block", "k_memb"],
                             got[3:-1], ref[3:-1], plain[3:-1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=name)
        # The log-sum-exp's gradient took part (v's is A^T dOut alone).
        assert (name == "v") == torch.allclose(b, c), name


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE.type != "cpu",
                    reason="switches a compiled kernel's global (interpreter only)")
def test_float64_as_elementwise_sums(monkeypatch):
    # Triton before 3.9 takes float64 products as elementwise sums on
    # 4-row tiles (FP64_SUMS): the same mask, output and gradients.
    from tests import triton_abi
    if triton_abi.RECORD is not None:
        pytest.skip("recorded launches are compiled with the installed "
                    "Triton's own FP64_SUMS (benchmarks.checks.triton_compile)")
    from sbm_pyg.ops import triton_dense_kernels as kernels
    monkeypatch.setattr(kernels, "FP64_SUMS", True)
    monkeypatch.setattr(kernels, "_FP64_SUMS", kernels.tl.constexpr(True))
    ptr, *args = inputs(torch.float64)
    ref = run("cpu", ptr, *args, mode="exact", ste="paper", exploration=0.01)
    got = run("twin", ptr, *args, mode="exact", ste="paper", exploration=0.01)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    for a, b in zip([got[0], *got[3:]], [ref[0], *ref[3:]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_float32():
    # float32 draws from the same uniforms; P's rounding differs between a
    # tl.dot and a BLAS product by ~1e-7, so at most a pair whose uniform
    # falls that close to p may differ. Outputs to float32's tolerance.
    ptr, *args = inputs(torch.float32)
    ref = run("cpu", ptr, *args, mode="exact")
    got = run(triton_device(), ptr, *args, mode="exact")
    assert (unpack(got[1]) != unpack(ref[1])).sum() <= 2
    if torch.equal(got[1], ref[1]):
        for a, b in zip([got[0], *got[3:]], [ref[0], *ref[3:]]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# Each precision's tolerance on the outputs and gradients (relative to
# their largest entry): its operands' rounding, 2^-11 (TF32, float16) or
# 2^-8 (bfloat16), grown by sums over a few dozen terms.
PRECISIONS = {"tf32": 5e-3, "bfloat16": 4e-2, "float16": 5e-3}


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_tensor_core_precisions(precision):
    # The mask's probabilities in three-pass TF32 stay float32's: the same
    # mask as the CPU kernel's but for pairs whose uniform falls within
    # rounding of p; the scores, outputs and gradients in the precision's
    # rounding (the interpreter rounds bfloat16 and float16 operands, and
    # computes TF32's products in float32).
    ptr, *args = inputs(torch.float32)
    ref = run("cpu", ptr, *args, mode="exact")
    got = run(triton_device(), ptr, *args, mode="exact", precision=precision)
    assert (unpack(got[1]) != unpack(ref[1])).sum() <= 2
    if torch.equal(got[1], ref[1]):
        names = ["out", "q", "k", "v", "q_memb", "block", "k_memb"]
        for name, a, b in zip(names, [got[0], *got[3:]], [ref[0], *ref[3:]]):
            tol = PRECISIONS[precision] * float(b.abs().max())
            torch.testing.assert_close(a, b, rtol=0, atol=tol, msg=name)


def test_unknown_precision_raises():
    ptr, *args = inputs(torch.float32, sizes=(3,))
    with pytest.raises(ValueError, match="precision"):
        run("cpu", ptr, *args, precision="fp8")
    ptr, q_memb, block, k_memb, x = inputs(torch.float32, sizes=(3,))
    q_block = heads_first(torch.einsum("nhu,huv->nhv", q_memb, block))
    empty = ptr.new_empty(0)
    ops, seed = [torch.ops.sbm_pyg.dense_attention], torch.tensor(1)
    if TEST_DEVICE.type == "cpu":
        ops.append(torch.ops.sbm_pyg.triton_dense_attention)
    for op in ops:
        with pytest.raises(RuntimeError, match="precision"):
            op(ptr, ptr, empty, empty, *x, q_block, heads_first(k_memb), H,
               0.0, True, False, seed, 0.5, 1, None, 0, 7)


def test_dense_heads_and_empty_rows():
    # p >= 1 everywhere (every pair sampled) in head-sized blocks, and
    # zero memberships (no pair but the included ones): rows without an
    # edge output zeros and pass no gradient.
    ptr = torch.tensor([0, 40, 43])
    N = 43
    x = [torch.randn(H * N, D, generator=seeded(2), dtype=torch.float64)
         for _ in range(3)]
    ones = torch.ones(N, H, K, dtype=torch.float64)
    block = torch.ones(H, K, K, dtype=torch.float64)
    got = run(triton_device(), ptr, ones, block, ones, x)
    assert got[2].tolist() == [[1600, 1600], [9, 9]]
    zeros = torch.zeros(N, H, K, dtype=torch.float64)
    inc = included_csr(torch.tensor([0]), torch.tensor([2]), N, N)
    got = run(triton_device(), ptr, zeros, block, zeros, x, ste=None,
              included=inc)
    assert got[2].tolist() == [[1, 1], [0, 0]]
    out = got[0].view(H, N, D)
    # (run() returns CPU tensors)
    torch.testing.assert_close(out[:, 0], x[2].view(H, N, D)[:, 2].cpu())
    assert torch.equal(out[:, 1:], torch.zeros_like(out[:, 1:]))
    # The query gradient of a row whose softmax has one key is zero (up to
    # rounding in its one weight), as of rows without an edge.
    torch.testing.assert_close(got[3], torch.zeros_like(got[3]), rtol=0,
                               atol=1e-12)


@pytest.mark.parametrize("device", ["cpu", "triton"])
def test_the_mask_size_given_or_read(device):
    # A caller that read the mask's size passes it (the GPU kernel then
    # reads nothing): the same mask, output and gradients; a size that
    # does not fit the pointers is refused on either kernel.
    from sbm_pyg.ops.dense_attention import mask_bytes
    device = triton_device() if device == "triton" else "cpu"
    ptr, *args = inputs(torch.float64)
    size = int(mask_bytes(ptr, ptr, H).sum())
    read = run(device, ptr, *args)
    given = run(device, ptr, *args, mask_bytes=size)
    for a, b in zip(read, given):
        assert torch.equal(a, b)
    assert given[1].numel() == size
    if TEST_DEVICE.type == "cuda":
        # On a GPU the refusal is a device-side assert, which ends the
        # process's CUDA context: the CPU suite checks it on both kernels
        # (the Triton one under its interpreter).
        return
    with pytest.raises(RuntimeError, match="mask_bytes"):
        run(device, ptr, *args, mask_bytes=size + 1)


def test_the_triton_forward_reads_nothing_given_the_mask_size():
    # Counted on the kernel's Python wrapper (the operator's dispatch hides
    # its kernels from a TorchFunctionMode): one read without the size, none
    # with it.
    from benchmarks.launches import count_reads
    from sbm_pyg.ops.dense_attention import mask_bytes
    from sbm_pyg.ops.triton_dense import dense_forward
    ptr, q_memb, block, k_memb, x = inputs(torch.float64)
    ptr, *x = (t.to(TEST_DEVICE) for t in (ptr, *x))
    q_block, k_memb = (heads_first(t).contiguous().to(TEST_DEVICE) for t in (
        torch.einsum("nhu,huv->nhv", q_memb, block), k_memb))
    empty, seed = ptr.new_empty(0), torch.tensor(1, device=TEST_DEVICE)

    def forward(size):
        return lambda: dense_forward(ptr, ptr, empty, empty, *x, q_block, k_memb, H,
                                     0.0, True, False, seed, 0.5, mask_bytes=size)
    assert count_reads(forward(int(mask_bytes(ptr, ptr, H).sum()))) == {}
    assert count_reads(forward(-1)) == {"ops/triton_dense.py:dense_forward": 1}


def test_bad_arguments_raise():
    ptr, q_memb, block, k_memb, x = inputs(torch.float64, sizes=(3,))
    q_block = heads_first(torch.einsum("nhu,huv->nhv", q_memb, block))
    op = (torch.ops.sbm_pyg.triton_dense_attention
          if TEST_DEVICE.type == "cpu" else torch.ops.sbm_pyg.dense_attention)
    empty, seed = ptr.new_empty(0), torch.tensor(1)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        op(ptr, ptr, empty, empty, *[t.half() for t in x], q_block.half(),
           heads_first(k_memb).half(), H, 0.0, True, False, seed, 0.5, 1)
    with pytest.raises(RuntimeError, match="multiples of heads"):
        op(ptr, ptr, empty, empty, *x, q_block, heads_first(k_memb), 4, 0.0,
           True, False, seed, 0.5, 1)
