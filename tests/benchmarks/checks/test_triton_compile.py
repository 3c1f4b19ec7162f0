"""The ahead-of-time check's rules (benchmarks/checks/triton_compile.py), on made-up
PTX, sources and compile rows; CI runs the check on the real kernels."""
import json

import pytest

from benchmarks.checks import triton_compile
from benchmarks.checks.triton_compile import (
    dots_without_precision,
    f32_params,
    local_memory,
    problems,
    tensor_cores,
)

pytestmark = pytest.mark.host

PTX = """
.visible .entry _forward_kernel(
	.param .u64 .ptr .global .align 1 _forward_kernel_param_0,
	.param .f32 _forward_kernel_param_7,
	.param .u32 _forward_kernel_param_8
)
{
	ld.param.f32 	%f1, [_forward_kernel_param_7];
	cvt.f64.f32 	%fd1, %f1;
	st.local.f64 	[%rd9], %fd1;
	ld.local.f64 	%fd2, [%rd9];
"""


def test_ptx_readers():
    assert f32_params(PTX) == ["_forward_kernel_param_7"]
    assert local_memory(PTX) == 2
    assert f32_params(PTX.replace(".param .f32", ".param .f64")) == []
    assert not tensor_cores(PTX)
    mma = "\tmma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1}, {%r1};\n"
    wgmma = "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1;\n"
    assert tensor_cores(PTX + mma) and tensor_cores(PTX + wgmma)


def test_dots_must_name_their_input_precision():
    source = """
    @triton.jit
    def kernel(A, B):
        a = tl.dot(x, y)
        b = tl.dot(x, y, input_precision="ieee")
        c = tl.sum(x)
    """
    assert dots_without_precision(source) == [4]
    # Products of half-precision casts need none; a half cast of one operand
    # leaves the other float32's.
    half = """
    def kernel(A, B):
        a = tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
        b = tl.dot(x.to(tl.float16), y.to(tl.float16))
        c = tl.dot(x.to(tl.bfloat16), y)
    """
    assert dots_without_precision(half) == [5]


def _row(**changes):
    row = dict(kernel="forward_kernel", arch="sm_90", num_warps=1,
               signature={"Q": "*fp64", "Scale": "*fp64"}, constexprs={"D": "8"},
               registers=40, stack_bytes=0, local_memory=0, f32_params=[])
    row.update(changes)
    return row


def test_an_fp64_kernel_with_an_fp32_scalar_fails():
    bad = _row(signature={"Q": "*fp64", "scale": "fp32"},
               f32_params=["_forward_kernel_param_7"])
    assert "fp32 scalars" in problems([bad], [bad])[0]
    # an fp32 kernel may take fp32 scalars
    fine = _row(signature={"Q": "*fp32", "scale": "fp32"}, f32_params=["p"])
    assert problems([fine], []) == []


def test_spills_fail_where_the_baseline_had_none():
    assert problems([_row()], []) == []
    spilling = _row(stack_bytes=48)
    assert "baseline did not" in problems([spilling], [_row()])[0]
    assert "no such signature" in problems([spilling], [])[0]
    assert problems([spilling], [_row(stack_bytes=16)]) == []
    # another signature's baseline does not excuse it
    other = _row(constexprs={"D": "16"}, stack_bytes=48)
    assert problems([spilling], [other]) != []


def test_the_dense_kernels_never_spill_at_the_model_sizes():
    dense = dict(module="sbm_pyg.ops.triton_dense_kernels", stack_bytes=16)
    small = _row(constexprs={"D": "64", "KC": "128"}, **dense)
    assert "no kernel of its module may" in problems([small], [small])[0]
    # larger sizes follow the baseline
    large = _row(constexprs={"D": "128", "KC": "128"}, **dense)
    assert problems([large], [large]) == []


def test_the_sampler_kernels_never_spill():
    sampler = dict(module="sbm_pyg.sampling.fastrg_triton_kernels", kernel="merge_kernel")
    assert problems([_row(**sampler)], []) == []
    spilling = _row(stack_bytes=8, constexprs={"K": "256"}, **sampler)
    assert "no kernel of its module may" in problems([spilling], [spilling])[0]


def test_dense_products_asked_of_tensor_cores_must_issue_mma():
    dense = dict(module="sbm_pyg.ops.triton_dense_kernels")
    for dot in ("1", "2", "3", "4"):
        row = _row(constexprs={"D": "32", "KC": "128", "DOT": dot},
                   tensor_cores=False, **dense)
        assert "issues no mma" in problems([row], [row])[0]
        assert problems([dict(row, tensor_cores=True)], []) == []
    # "ieee" (DOT 0) runs on FMA units by design
    ieee = _row(constexprs={"D": "32", "KC": "128", "DOT": "0"},
                tensor_cores=False, **dense)
    assert problems([ieee], []) == []


def test_another_triton_is_judged_by_its_own_baseline():
    dense = dict(module="sbm_pyg.ops.triton_dense_kernels", stack_bytes=16)
    row = _row(constexprs={"D": "64", "KC": "128"}, **dense)
    assert problems([row], [row], spill_free=False) == []
    assert "baseline did not" in problems(
        [row], [dict(row, stack_bytes=0)], spill_free=False)[0]


def _module_rows(*modules):
    return [_row(module=m, kernel=m.rsplit(".", 1)[1], stack_bytes=0) for m in modules]


def test_update_of_one_family_keeps_the_other_familys_rows(tmp_path, monkeypatch):
    # The launches and their compile stubbed: the attention family's
    # launches reach a sampler kernel too (the layer's tests), whose row the
    # update must not rewrite.
    sampler, attention = "sbm_pyg.sampling.fastrg_triton_kernels", "sbm_pyg.ops.triton_attention"
    old = _module_rows(sampler, attention)
    new = [dict(r, registers=99) for r in _module_rows(sampler, attention)]
    monkeypatch.setattr(triton_compile, "record", lambda directory, family: None)
    monkeypatch.setattr(triton_compile, "load", lambda directory: [{}])
    monkeypatch.setattr(triton_compile, "compile_parallel", lambda *args: new)
    monkeypatch.setattr(triton_compile, "kernels", lambda: [])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main drops it; restored after
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(dict(triton="3.9.0", kernels=old)))
    assert triton_compile.main(["--update", "--family", "attention", "--baseline",
                                str(base), "--out", str(base)]) == 0
    rows = json.loads(base.read_text())["kernels"]
    assert sorted((r["module"], r["registers"]) for r in rows) == [
        (attention, 99), (sampler, old[0]["registers"])]
    assert triton_compile.main(["--update", "--baseline", str(base), "--out", str(base)]) == 0
    assert [r["registers"] for r in json.loads(base.read_text())["kernels"]] == [99, 99]
