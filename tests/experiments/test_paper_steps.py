"""The paper's parametrization pinned: the first training steps of the
``repeat-paper`` preset on a tiny configuration, against the records its
code gave when they were written (tests/experiments/data/paper-steps.json).

A regression pin, not a correctness check: it holds "the paper's
parametrization and presets unchanged" while other parametrizations,
recipes and kernels change around them. A change meant to alter these
steps rewrites the file (``python -m tests.experiments.test_paper_steps``)
and says why in its commit. Tolerances allow another CPU's rounding (a
relative 1e-4 on losses, two edges of 2048 pairs on densities), not
another algorithm.
"""
import json
import sys
import tempfile
from pathlib import Path

import pytest

from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.train import train
from sbm_pyg.ops import backends

DATA = Path(__file__).with_name("data") / "paper-steps.json"
CONFIG = dict(seq_len=16, batch_size=8, steps=6, log_every=1, seed=0,
              device="cpu", no_progress=True)
# The preset's dense start (every pair drawn), and the published code's
# start, whose heads sample a quarter of the pairs (the sampler and the
# straight-through estimator in the steps).
STARTS = ("dense", "paper")
KEYS = ("loss", "accuracy", "density", "expected_density")


def paper_steps(out: Path, sbm_init: str) -> list:
    """The preset's first steps' records (step, loss, accuracy, sampled and
    expected density) and the test evaluation's, on CPU tensors."""
    final = train(train_arguments("repeat-paper", out=out, sbm_init=sbm_init, **CONFIG))
    with open(out / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    rows = [{k: r[k] for k in ("step", *KEYS)} for r in records if r["split"] == "train"]
    return rows + [{k: final[k] for k in ("loss", "accuracy", "density")}]


@pytest.mark.skipif(backends("cpu") != {"sampler": "cpp", "attention": "cpp"},
                    reason="pinned with the compiled CPU kernels (the pure-PyTorch "
                           "path draws its own graphs; its twin tests compare it)")
@pytest.mark.parametrize("sbm_init", STARTS)
def test_the_paper_parametrization_trains_as_pinned(tmp_path, sbm_init):
    pinned = json.loads(DATA.read_text())
    assert pinned["config"] == CONFIG
    got = paper_steps(tmp_path, sbm_init)
    assert len(got) == len(pinned["records"][sbm_init])
    for mine, want in zip(got, pinned["records"][sbm_init]):
        assert mine.get("step") == want.get("step")
        for key in want:
            if key == "step":
                continue
            tol = 1e-3 if "density" in key else 0.0
            assert mine[key] == pytest.approx(want[key], rel=1e-4, abs=tol), (mine, key)


if __name__ == "__main__":  # rewrite the pinned record
    records = {}
    for start in STARTS:
        with tempfile.TemporaryDirectory() as tmp:
            records[start] = paper_steps(Path(tmp), start)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(dict(config=CONFIG, records=records), indent=1) + "\n")
    print(f"wrote {DATA}", file=sys.stderr)
