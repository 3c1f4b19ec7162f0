r"""Every Triton kernel compiled ahead of time for NVIDIA GPUs, on a machine
without one: ``python -m benchmarks.triton_compile``.

Triton's interpreter checks what a kernel computes, not that it compiles:
this lowers each kernel to PTX for sm_80 and sm_90 (``triton.compile`` with
a :class:`GPUTarget`; Triton assembles it with the ``ptxas`` its wheel
ships), and records registers and stack (spill) bytes per kernel, dtype
and head size, as ``cuobjdump`` reads them off the binary, in
``benchmarks/results-triton-compile.json``. It exits non-zero if any kernel
fails to compile. CI runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sbm_pyg.ops import triton_attention as attention  # noqa: E402
from sbm_pyg.sampling import fastrg_triton as sampler  # noqa: E402

ARCHS = (80, 90)
OUT = Path(__file__).with_name("results-triton-compile.json")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _sampler_cases() -> List[dict]:
    # The sampler computes in the memberships' float32 or float64; k up to
    # 128 clusters (the paper's) and 256.
    cases = []
    for dt in ("fp32", "fp64"):
        for k in (128, 256):
            common = dict(H=2, K=k, BLOCK_K=k)
            cases += [
                dict(fn=sampler._plan_kernel, dtype=dt, k=k, signature=dict(
                    W=f"*{dt}", Mass="*fp64", MaxK="*fp64", Seq="*i64",
                    PtrK="*i64", Degree="*i64", Inflation="*fp64", Mu="*fp64",
                    seed="i64", delta="fp64", threshold="fp64", R="i64",
                    Nq="i64"), constexprs=dict(common, BLOCK_R=sampler.BLOCK_ROWS,
                                               EXACT=True)),
                dict(fn=sampler._draw_kernel, dtype=dt, k=k, signature=dict(
                    W=f"*{dt}", Z=f"*{dt}", Mass="*fp64", Seq="*i64",
                    PtrK="*i64", Degree="*i64", Offset="*i64", Prob="*fp32",
                    Alias="*i32", Out="*i32", seed="i64", delta="fp64",
                    Nq="i64", Nk="i64"), constexprs=dict(
                        common, BLOCK_D=sampler.BLOCK_DRAWS, EXACT=True,
                        EXPLORE=True)),
                dict(fn=sampler._thin_kernel, dtype=dt, k=k, signature=dict(
                    Key="*i64", RowStart="*i64", W=f"*{dt}", Z=f"*{dt}",
                    Degree="*i64", Inflation="*fp64", Keep="*i8", seed="i64",
                    delta="fp64", E="i64", Nq="i64", Nk="i64"),
                    constexprs=dict(common, BLOCK_E=sampler.BLOCK_EDGES)),
            ]
            cases.append(dict(fn=sampler._alias_kernel, dtype=dt, k=k, signature=dict(
                Z=f"*{dt}", PtrK="*i64", Prob="*fp32", Alias="*i32", Nk="i64"),
                constexprs=dict(H=2, K=k)))
    return cases


def _attention_cases() -> List[dict]:
    # The dtypes the operator takes (half precision rows are read as they
    # are and computed in float32), head sizes 32, 64 and 128, the backward
    # kernels without and with the memberships' gradients (k = 128
    # clusters); int32 CSR; the scale, the row statistics and the edge and
    # membership gradients in the accumulation dtype; the launch's warps
    # as the operator chooses them.
    import triton.language as tl
    cases = []
    for dt in ("fp32", "fp64", "bf16"):
        acc = tl.float64 if dt == "fp64" else tl.float32
        a = "*fp64" if dt == "fp64" else "*fp32"
        for D in (32, 64, 128):
            meta = dict(D=D, DV=D, BLOCK_D=D, BLOCK_DV=D, BLOCK=attention.BLOCK_E,
                        ACC=acc)
            warps = attention.num_warps(D, D)  # forward; backward below
            t = f"*{dt}"
            cases.append(dict(fn=attention._forward_kernel, dtype=dt, D=D, warps=warps,
                              signature=dict(Q=t, K=t, V=t, Out=t, Lse=a,
                                             rowptr="*i32", col="*i32",
                                             Scale=a), constexprs=meta))
            for memb, K in ((False, 1), (True, 128)):
                extra = dict(meta, STE=1, MEMB=memb, KM=K, BLOCK_K=K)
                warps = attention.num_warps(D, D, K)
                cases += [
                    dict(fn=attention._backward_query_kernel, dtype=dt, D=D,
                         memb=memb, warps=warps, signature=dict(
                             Q=t, K=t, V=t, GradOut=t, Lse=a, Delta=a, GradQ=t,
                             GradProb=a, Km=a, GradQb=a, rowptr="*i32",
                             col="*i32", Scale=a), constexprs=extra),
                    dict(fn=attention._backward_key_kernel, dtype=dt, D=D,
                         memb=memb, warps=warps, signature=dict(
                             Q=t, K=t, V=t, GradOut=t, Lse=a, Delta=a, GradK=t,
                             GradV=t, Qb=a, GradKm=a, colptr="*i32",
                             row_t="*i32", Scale=a), constexprs=extra),
                ]
    return cases


def _resources(cubin: bytes) -> Dict[str, int]:
    # Registers and spill bytes of the compiled kernel, as cuobjdump (which
    # the triton wheel ships beside ptxas) reports them.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", str(path)],
                             capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return dict(registers=int(regs.group(1)) if regs else -1,
                stack_bytes=int(stack.group(1)) if stack else -1)


def compile_all(archs=ARCHS) -> List[dict]:
    """Compiles every case for every architecture; raises on the first
    kernel that does not compile."""
    rows = []
    cases = _sampler_cases() + _attention_cases()
    for case in cases:
        for arch in archs:
            start = time.perf_counter()
            fn = case["fn"]
            src = ASTSource(fn, dict(case["signature"], **{
                name: "constexpr" for name in case["constexprs"]}),
                case["constexprs"])
            options = dict(enable_fp_fusion=False) if fn.__module__ == sampler.__name__ else {}
            if "warps" in case:
                options["num_warps"] = case["warps"]
            kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                    options=options)
            row = dict(kernel=fn.__name__.lstrip("_"), module=fn.__module__,
                       arch=f"sm_{arch}", dtype=case["dtype"],
                       **{k: case[k] for k in ("k", "D", "memb") if k in case},
                       **_resources(kernel.asm["cubin"]),
                       seconds=round(time.perf_counter() - start, 1))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = compile_all(args.arch)
    args.out.write_text(json.dumps(dict(triton=triton.__version__, kernels=rows),
                                   indent=1) + "\n")
    spilled = [r for r in rows if r["stack_bytes"] > 0]
    print(f"{len(rows)} kernels compiled; {len(spilled)} use stack (spills): "
          + ", ".join(f"{r['kernel']}/{r['arch']}/{r['dtype']}" for r in spilled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
