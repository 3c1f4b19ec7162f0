r"""Every Triton kernel compiled ahead of time for NVIDIA GPUs, on a machine
without one, with the signatures the JIT builds: ``python -m
benchmarks.checks.triton_compile``.

Triton's interpreter checks what a kernel computes, not what the compiled
kernel is given. So the launches are first recorded (a subprocess runs the
Triton tests and launches at the model's sizes under the interpreter, with
:mod:`tests.triton_abi` writing each launch's arguments: tensors' dtypes and
alignments, scalars' values, constexprs, warps); then each launch is bound
by the JIT's own binder for a CUDA target, as :meth:`JITFunction.run` does
on a GPU (``mangle_type``, annotations, specialisation on divisibility and
on 1, ``do_not_specialize``), and compiled to PTX and a cubin for sm_80 and
sm_90.

The check fails (exit 1) if

* a kernel with a float64 pointer takes a float32 scalar (a Python float
  given no ``tl.float64`` annotation arrives rounded to fp32),
* a kernel uses local memory (spills: stack bytes or ``ld.local`` /
  ``st.local`` in the PTX) where the baseline's compile of the same
  signature did not, or a signature the baseline lacks spills, or a
  sampler kernel spills, or a dense-regime kernel spills at a head size up
  to 64 and k up to 128,
* a kernel calls ``tl.dot`` without an explicit ``input_precision`` (its
  default follows the TF32 setting),
* a kernel does not compile.

``--baseline-only`` judges the sampler's and the dense kernels' spills by
the baseline too: for other Triton versions, each with a baseline of its
own (``benchmarks/checks/version_matrix.sh``), where a new spill fails and the
spills that version has are recorded, not fixed.

* a dense-regime kernel asked for tensor-core products (its ``DOT``
  constexpr: TF32, bfloat16, float16 or the mask's three-pass TF32)
  issues no tensor-core instruction.

Each row says whether the kernel's PTX issues tensor-core instructions
(``tensor_cores``: ``mma`` or ``wgmma``).

Registers and stack bytes per kernel, signature and architecture land in
``benchmarks/checks/results-triton-compile.json``, the baseline (``--update``
rewrites it; with ``--family`` that family's rows alone, the others'
kept). CI runs the check.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, Iterable, List

from benchmarks.checks.families import FAMILIES, owns, recorded

ARCHS = (80, 90)
OUT = Path(__file__).with_name("results-triton-compile.json")
ROOT = Path(__file__).resolve().parents[2]
# The tests that launch Triton kernels (selected by "triton" in their names
# or parameters) are those of benchmarks.checks.families: a family's
# launches are checked alone when only its own files changed.


def record(directory: Path, family: str = "all") -> None:
    """Runs :obj:`family`'s launches under the interpreter in a subprocess,
    which writes them to :obj:`directory`."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               SBM_PYG_TRITON_SIGNATURES=str(directory), SBM_PYG_TEST_DEVICE="cpu")
    env.pop("SBM_PYG_TRITON_ABI", None)
    subprocess.run([sys.executable, "-m", "benchmarks.checks.triton_compile", "--record",
                    str(directory), "--family", family], cwd=ROOT, env=env, check=True)


def _launch_all(family: str) -> int:
    # In the recording subprocess: the family's tests, then its launches at
    # the model's sizes.
    import pytest

    from tests import triton_abi
    triton_abi.install()
    # On every core where pytest-xdist is there: each worker records its
    # own launches (launches-<pid>.json, merged by load()).
    try:
        import xdist  # noqa: F401
        workers = ["-n", "auto"]
    except ImportError:
        workers = []
    code = pytest.main(["-q", "-p", "no:cacheprovider", *workers, "-k", "triton",
                        *recorded(family)])
    # The paper's and the benchmarks' sizes, few rows, as the interpreter
    # runs them; each part with a generator of its own, so that a family
    # alone launches what it launches beside the other.
    import torch
    if family in ("all", "sampler"):
        _sampler_sizes(torch.Generator().manual_seed(0))
    if family in ("all", "attention"):
        _attention_sizes(torch.Generator().manual_seed(1))
        _dense_sizes(torch.Generator().manual_seed(2))
    return int(code)


def _sampler_sizes(g) -> None:
    # k = 128 and 256 clusters, float32 and float64, both modes with and
    # without exploration.
    import torch

    from sbm_pyg.sampling import fastrg
    N, H = 24, 2
    for dtype in (torch.float32, torch.float64):
        for k in (128, 256):
            memb = torch.rand(N, H, k, generator=g, dtype=dtype)
            block = torch.rand(H, k, k, generator=g, dtype=dtype) * 4 / k**2
            for mode in ("poisson", "exact"):
                for delta in (0.0, 0.01):
                    fastrg(memb, block, memb, mode=mode, exploration=delta,
                           generator=g, backend="triton")


def _attention_sizes(g) -> None:
    # The sparse attention on a graph the sampler drew: heads of 32, 64 and
    # 128, float32, float64 and bfloat16 rows, with edge probabilities and
    # with memberships, with and without dropout.
    import torch

    from sbm_pyg.nn.functional import sparse_attention
    from sbm_pyg.sampling import fastrg
    N, H, k = 24, 2, 128
    memb = torch.rand(N, H, k, generator=g)
    block = torch.rand(H, k, k, generator=g) * 8 / k**2
    graph = fastrg(memb, block, memb, generator=g, backend="triton")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for D in (32, 64, 128):
            q, kk, v = (torch.randn(N, H, D, generator=g).to(dtype).requires_grad_()
                        for _ in range(3))
            prob = torch.rand(graph.num_edges, generator=g).requires_grad_()
            sparse_attention(q, kk, v, graph, prob, backend="triton").sum().backward()
            sbm = tuple(t.to(dtype).requires_grad_() for t in (memb, block, memb))
            sparse_attention(q, kk, v, graph, sbm=sbm,
                             backend="triton").sum().backward()
            # With attention dropout (GraphGPS's 0.5): the mask recomputed
            # in all three kernels.
            sparse_attention(q, kk, v, graph, sbm=sbm, dropout=0.5, training=True,
                             generator=g, backend="triton").sum().backward()


def _dense_sizes(g) -> None:
    # The dense-regime kernels at k = 128 and 256, heads of 32, 64 and 128,
    # float32 and float64, both modes and estimators, with and without
    # dropout.
    import torch

    from sbm_pyg.ops import dense_attention
    N, H = 40, 2
    ptr = torch.tensor([0, N])
    for dtype in (torch.float32, torch.float64):
        for k in (128, 256):
            q_block, k_memb = (torch.rand(H * N, k, generator=g, dtype=dtype)
                               .div_(k).requires_grad_() for _ in "qk")
            for D in (32, 64, 128):
                x = [torch.randn(H * N, D, generator=g, dtype=dtype)
                     .requires_grad_() for _ in "qkv"]
                for mode, ste in (("exact", "paper"), ("poisson", "published")):
                    res = dense_attention(*x, q_block, k_memb, ptr, ptr,
                                          heads=H, scale=D**-0.5, seed=1,
                                          mode=mode, exploration=0.01,
                                          self_loops=True, ste=ste,
                                          triton_on_cpu=True)
                    res.out.sum().backward()
                # With attention dropout (GraphGPS's 0.5).
                res = dense_attention(*x, q_block, k_memb, ptr, ptr, heads=H,
                                      scale=D**-0.5, seed=1, ste="paper",
                                      dropout=0.5, dropout_seed=2**40 + 3,
                                      triton_on_cpu=True)
                res.out.sum().backward()
    # float32 on tensor cores, in each precision, at the model's sizes.
    k = 128
    q_block, k_memb = (torch.rand(H * N, k, generator=g).div_(k)
                       .requires_grad_() for _ in "qk")
    for precision in ("tf32", "bfloat16", "float16"):
        for D in (32, 64):
            x = [torch.randn(H * N, D, generator=g).requires_grad_()
                 for _ in "qkv"]
            for dropout in (0.0, 0.5):
                res = dense_attention(*x, q_block, k_memb, ptr, ptr, heads=H,
                                      scale=D**-0.5, seed=1, ste="paper",
                                      dropout=dropout, dropout_seed=5,
                                      precision=precision, triton_on_cpu=True)
                res.out.sum().backward()


def load(directory: Path) -> List[dict]:
    """The recorded launches, one per kernel and specialisation."""
    seen, launches = set(), []
    for path in sorted(directory.glob("launches-*.json")):
        for launch in json.loads(path.read_text()):
            key = json.dumps(launch, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                launches.append(launch)
    return launches


def f32_params(ptx: str) -> List[str]:
    """The fp32 scalar parameters of a PTX kernel entry."""
    return re.findall(r"\.param \.f32 (\w+)", ptx)


def local_memory(ptx: str) -> int:
    """Local-memory loads and stores in PTX (register spills, local
    arrays)."""
    return len(re.findall(r"\b(?:ld|st)\.local\b", ptx))


def tensor_cores(ptx: str) -> bool:
    """Whether PTX issues tensor-core instructions (``mma`` on sm_80,
    ``wgmma`` on sm_90)."""
    return re.search(r"\b(?:wgmma\.mma_async|mma\.sync)\b", ptx) is not None


def _half_operand(node: ast.expr) -> bool:
    # x.to(tl.bfloat16) or x.to(tl.float16): a product that no float32
    # setting touches.
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "to" and len(node.args) == 1
            and isinstance(node.args[0], ast.Attribute)
            and node.args[0].attr in ("bfloat16", "float16"))


def dots_without_precision(source: str) -> List[int]:
    """Lines of ``tl.dot`` calls that leave ``input_precision`` to the
    global setting (calls on half-precision casts need none)."""
    lines = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "dot"
                and not any(kw.arg == "input_precision" for kw in node.keywords)
                and not all(_half_operand(a) for a in node.args[:2])):
            lines.append(node.lineno)
    return lines


def _key(row: dict) -> str:
    return json.dumps([row["kernel"], row["arch"], row["signature"],
                       row["constexprs"], row["num_warps"]], sort_keys=True)


def _spill_free(row: dict) -> bool:
    # The sampler's kernels must not spill at any size, the dense-regime
    # kernels not at the model's sizes (heads of up to 64, k up to 128),
    # baseline or not.
    sizes, module = row["constexprs"], row.get("module", "")
    return module.endswith(("fastrg_triton_kernels", "key_masses")) or (
        module.endswith("triton_dense_kernels")
        and int(sizes.get("D", 0)) <= 64 and int(sizes.get("KC", 0)) <= 128)


def problems(rows: Iterable[dict], baseline: Iterable[dict],
             spill_free: bool = True) -> List[str]:
    """What fails the check in compiled :obj:`rows` against the
    :obj:`baseline`'s rows; with :obj:`spill_free` False the kernels that
    must never spill are judged by the baseline as the others are (for
    another Triton, whose baseline records where it spills)."""
    before = {_key(r): r for r in baseline}
    found = []
    for row in rows:
        name = f"{row['kernel']} ({row['arch']}, {row['signature']}, {row['constexprs']})"
        if "error" in row:
            found.append(f"{name}: does not compile: {row['error']}")
            continue
        if row["f32_params"] and any(t == "*fp64" for t in row["signature"].values()):
            found.append(f"{name}: float64 kernel takes fp32 scalars {row['f32_params']}")
        if (row.get("module", "").endswith("triton_dense_kernels")
                and int(row["constexprs"].get("DOT", 0)) != 0
                and not row["tensor_cores"]):
            found.append(f"{name}: a product asked of tensor cores "
                         f"(DOT={row['constexprs']['DOT']}) issues no mma")
        spills = row["stack_bytes"] > 0 or row["local_memory"] > 0
        if spills and spill_free and _spill_free(row):
            found.append(f"{name}: spills ({row['stack_bytes']} stack bytes) "
                         "where no kernel of its module may")
            continue
        old = before.get(_key(row))
        if spills and (old is None or (old["stack_bytes"] == 0
                                       and old["local_memory"] == 0)):
            found.append(f"{name}: spills ({row['stack_bytes']} stack bytes, "
                         f"{row['local_memory']} local loads/stores) where "
                         + ("the baseline has no such signature" if old is None
                            else "the baseline did not"))
    return found


def _resources(cubin: bytes) -> Dict[str, int]:
    # Registers and stack bytes, as cuobjdump (which the triton wheel ships
    # beside ptxas) reads them off the binary.
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)],
                             capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return dict(registers=int(regs.group(1)) if regs else -1,
                stack_bytes=int(stack.group(1)) if stack else -1)


def compile_all(launches: List[dict], archs=ARCHS) -> List[dict]:
    """Each launch bound by the JIT's binder and compiled for each
    architecture; a kernel that does not compile gives a row with its
    ``error`` (and the others are compiled all the same)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tests.triton_abi import jit_binding, mock_args
    rows = []
    for launch in launches:
        module, name = launch["kernel"].rsplit(".", 1)
        launched = getattr(importlib.import_module(module), name)
        kwargs = dict(mock_args(launch["args"]), **launch["options"])
        for arch in archs:
            start = time.perf_counter()
            target = GPUTarget("cuda", arch, 32)
            jit, backend, bound, specialization, options = jit_binding(
                launched, (), kwargs, target)
            options, signature, constexprs, attrs = jit._pack_args(
                backend, kwargs, bound, specialization, options)
            try:
                kernel = triton.compile(ASTSource(jit, signature, constexprs, attrs),
                                        target=target, options=options.__dict__)
            except Exception as e:  # noqa: BLE001 - reported per kernel
                rows.append(dict(
                    kernel=name.lstrip("_"), module=module, arch=f"sm_{arch}",
                    signature={k: v for k, v in signature.items() if v != "constexpr"},
                    constexprs={jit.arg_names[path[0]]: str(value)
                                for path, value in constexprs.items()},
                    num_warps=options.num_warps,
                    error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                continue
            ptx = kernel.asm["ptx"]
            row = dict(
                kernel=name.lstrip("_"), module=module, arch=f"sm_{arch}",
                signature={k: v for k, v in signature.items() if v != "constexpr"},
                constexprs={jit.arg_names[path[0]]: str(value)
                            for path, value in constexprs.items()},
                num_warps=options.num_warps, **_resources(kernel.asm["cubin"]),
                local_memory=local_memory(ptx), f32_params=f32_params(ptx),
                tensor_cores=tensor_cores(ptx),
                seconds=round(time.perf_counter() - start, 2))
            rows.append(row)
    return rows


def compile_parallel(launches: List[dict], archs=ARCHS,
                     jobs: int = 1) -> List[dict]:
    """:func:`compile_all` on :obj:`jobs` processes (each compile is one
    core's work: Triton's passes and ptxas)."""
    if jobs <= 1 or len(launches) < 2:
        return compile_all(launches, archs)
    from concurrent.futures import ProcessPoolExecutor
    chunks = [launches[i::jobs] for i in range(jobs)]
    with ProcessPoolExecutor(jobs) as pool:
        parts = list(pool.map(compile_all, chunks, [archs] * jobs))
    return [row for part in parts for row in part]


def kernels() -> list:
    """Every Triton kernel function of the package, helpers included."""
    from triton.runtime.jit import JITFunction

    from sbm_pyg.ops import triton_attention, triton_dense_kernels, triton_streams
    from sbm_pyg.sampling import fastrg_triton_kernels, key_masses
    return [fn for module in (triton_attention, triton_dense_kernels,
                              fastrg_triton_kernels, key_masses, triton_streams)
            for fn in vars(module).values() if isinstance(fn, JITFunction)
            and fn.fn.__module__ == module.__name__]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--baseline", type=Path, default=OUT)
    parser.add_argument("--update", action="store_true",
                        help="accept new spills (rewrite the baseline)")
    parser.add_argument("--baseline-only", action="store_true",
                        help="judge every spill by the baseline alone (another "
                             "Triton than the development pin's)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="compiling processes (default: one per core)")
    parser.add_argument("--family", choices=["all", *FAMILIES], default="all",
                        help="the kernels whose launches to check (default: all)")
    parser.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.record is not None:  # the recording subprocess
        return _launch_all(args.family)
    os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret
    found = [f"{fn.fn.__name__} line {line}: tl.dot without input_precision"
             for fn in kernels() for line in dots_without_precision(
                 inspect.getsource(fn.fn))]
    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp), args.family)
        launches = load(Path(tmp))
    start = time.perf_counter()
    rows = compile_parallel(launches, args.arch, args.jobs)
    baseline = (json.loads(args.baseline.read_text())["kernels"]
                if args.baseline.exists() else [])
    found += problems(rows, [] if args.update else baseline,
                      spill_free=not args.baseline_only)
    if args.update:
        found = [f for f in found if "spills" not in f]
    import triton
    written = rows
    if args.update and args.family != "all":
        # One family's rows rewritten, the others' kept (each family's keys
        # take its own rows of the baseline); the family's launches also
        # reach the other's kernels (the layer's tests), not rewritten here.
        ours = lambda row: owns(args.family, row.get("module", ""))  # noqa: E731
        written = [r for r in baseline if not ours(r)] + [r for r in rows if ours(r)]
    args.out.write_text(json.dumps(dict(triton=triton.__version__, kernels=written),
                                   indent=1) + "\n")
    spilled = sorted({f"{r['kernel']}/{r['arch']}" for r in rows
                      if r.get("stack_bytes", 0) > 0})
    print(f"{len(launches)} launches, {len(rows)} compiles in "
          f"{time.perf_counter() - start:.0f} s; with stack (spills): "
          + (", ".join(spilled) or "none"))
    for problem in found:
        print("FAIL:", problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
