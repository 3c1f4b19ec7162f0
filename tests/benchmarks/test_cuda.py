"""The CUDA benchmark script runs end to end (tiny sizes; on the CPU the
Triton kernels are not timed) and its byte model is the documented one."""
import json

import pytest
import torch

from benchmarks import cuda
from sbm_pyg.ops import triton_runs

pytestmark = pytest.mark.host


def test_bytes_per_edge_model():
    # Forward and query pass: index + key + value rows; key pass: index +
    # query + output-gradient rows + log-sum-exp and delta.
    assert cuda.bytes_per_edge(32, torch.bfloat16) == 2 * (4 + 64 + 64) + (4 + 64 + 64 + 8)
    assert cuda.bytes_per_edge(32, torch.float32) == 788


def test_mask_keys_are_sorted_and_at_the_density():
    keys = cuda.mask_keys(64, 2, 0.25, torch.device("cpu"), chunk=1000)
    assert bool((keys[1:] > keys[:-1]).all()) and int(keys.max()) < 2 * 64 * 64
    # 8192 pairs at 0.25: mean 2048, sd 39; far outside 6 sd fails.
    assert abs(keys.numel() - 2048) < 6 * 39.2


def test_quick_run_writes_every_section(tmp_path):
    out = tmp_path / "r.json"
    cuda.main(["--quick", "--repeats", "1", "--out", str(out),
               "--sections", "attention", "sampler"])
    result = json.loads(out.read_text())
    assert {r["density"] for r in result["attention"]} == {0.05, 1.0}
    full = next(r for r in result["attention"] if r["density"] == 1.0)
    assert full["edges"] == 2 * 64 * 64
    assert all(full[m]["time"] > 0 for m in ("sbm", "sdpa"))
    assert [r["mode"] for r in result["sampler"]] == ["poisson", "exact"]


@pytest.mark.slow
def test_quick_run_of_the_narrowed_sections_and_the_dense_kernel(tmp_path):
    # The options a short GPU call uses, and the sections that crashed on
    # CUDA before (tuning: the kernels' dropout arguments) run here too,
    # the Triton kernels interpreted.
    out = tmp_path / "r.json"
    sections = ["sampler", "dense"]
    from sbm_pyg.ops import triton_runs
    if triton_runs(torch.device("cpu")):
        sections.append("tuning")
    cuda.main(["--quick", "--repeats", "1", "--out", str(out), "--sections",
               *sections, "--sampler-sizes", "64", "96", "--sampler-densities",
               "0.01", "0.05", "--dense-sizes", "64"])
    result = json.loads(out.read_text())
    assert [(r["n"], r["mode"]) for r in result["sampler"]] == [
        (n, m) for _ in range(2) for n in (64, 96) for m in ("poisson", "exact")]
    (dense,) = result["dense"]
    assert 0.3 < dense["density"] < 0.7 and dense["dense_time"] > 0
    assert result["command"].startswith("python -m benchmarks.cuda --quick")
    if "tuning" in sections:
        assert len(result["tuning"][0]["rows"]) == 9
    with pytest.raises(SystemExit):
        cuda.main(["--quick", "--out", str(out), "--cases", "64:2:x:float32"])


def test_profile_script_runs(tmp_path):
    from benchmarks.gpu import cuda_profile
    rows = cuda_profile.main(["--quick", "--repeats", "1", "--out",
                              str(tmp_path / "p.json")])
    assert [r["case"].split()[0] for r in rows] == ["fastrg", "fastrg", "SBMConv", "LRA",
                                                    "dense", "dense", "parts"]
    assert all(r["wall"] > 0 for r in rows[:-1])
    # The parts: each change against what it replaced, both timed.
    triton = triton_runs(torch.device("cpu"))
    assert set(rows[-1]["key_masses"]) == ({"segment_reduce", "sequence_reduce"}
                                           | ({"key_masses"} if triton else set()))
    assert set(rows[-1]["memberships"]) == {"one product", "row chunks"}
    assert all(t > 0 for part in ("key_masses", "memberships")
               for t in rows[-1][part].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's behaviour")
def test_gpu_run_skips_the_cuda_stages_on_a_cpu(tmp_path):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env = dict(os.environ, OUT=str(tmp_path), PY=sys.executable)
    done = subprocess.run(["bash", "benchmarks/gpu/gpu_run.sh", "env", "suite", "bench",
                           "profile"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "gpu_run.log").read_text()
    for stage in ("suite", "bench", "profile"):
        assert f"stage {stage}: skipped, no CUDA device" in log
    assert "torch " + torch.__version__ in log
