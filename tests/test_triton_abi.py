"""The interpreter mode of tests/triton_abi.py: scalars reach interpreted
kernels with the types a compiled kernel gets."""
import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from tests import triton_abi  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1"
    or os.environ.get("SBM_PYG_TRITON_ABI") == "plain",
    reason="the compiled-ABI interpreter mode is off")


@triton.jit
def _store_floats(Out, x, y: tl.float64):
    tl.store(Out, x.to(tl.float64))
    tl.store(Out + 1, y)


@triton.jit(do_not_specialize=["n"])
def _square(Out, n, m: tl.int64):
    tl.store(Out, (n * n).to(tl.int64))
    tl.store(Out + 1, m * m)


def test_a_float_reaches_an_unannotated_parameter_as_fp32():
    out = torch.zeros(2, dtype=torch.float64, device="cpu")
    _store_floats[(1,)](out, 0.1, 0.1)
    # 0.1 rounded to fp32 is 0.100000001490116...: what a GPU computes with.
    assert out[0].item() == float(torch.tensor(0.1, dtype=torch.float32))
    assert out[0].item() != 0.1
    assert out[1].item() == 0.1  # annotated tl.float64: exact


def test_ints_take_the_type_of_their_value_or_annotation():
    out = torch.zeros(2, dtype=torch.int64, device="cpu")
    # 2^16 fits i32, so n * n wraps in 32 bits as on a GPU (2^32 -> 0);
    # m is annotated i64 and does not.
    _square[(1,)](out, 2**16, 2**16)
    assert out.tolist() == [0, 2**32]
    _square[(1,)](out, 2**31, 3)  # past i32: i64
    assert out.tolist() == [2**62, 9]


def test_the_binding_is_the_jits():
    out = torch.zeros(2, dtype=torch.int64, device="cpu")
    _, _, _, spec, _ = triton_abi.jit_binding(_square, (out, 7, 7), {})
    # do_not_specialize: no divisibility or value attribute for n
    assert [t for t, _ in spec] == ["*i64", "i32", "i64"]
    assert spec[1][1] is None
    _, _, _, spec, _ = triton_abi.jit_binding(_store_floats, (out, 1.5, 1.5), {})
    assert [t for t, _ in spec] == ["*i64", "fp32", "fp64"]


def test_a_described_launch_binds_as_the_launch():
    out = torch.zeros(8, dtype=torch.float32, device="cpu")
    args = dict(Out=out[1:], x=0.5, y=2.0)  # a pointer not 16-byte aligned
    described = {k: triton_abi.describe(v) for k, v in args.items()}
    assert described["Out"] == {"tensor": "float32", "align": 4}
    mocked = triton_abi.mock_args(described)
    spec = triton_abi.jit_binding(_store_floats, (), args)[3]
    assert triton_abi.jit_binding(_store_floats, (), mocked)[3] == spec
    assert spec[0] == ("*fp32", "")  # no divisibility by 16
