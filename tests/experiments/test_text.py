"""The masked-byte task: its corpus, split, batches and a run of it."""
import json
import math

import pytest
import torch

from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.text import (
    MASK,
    ByteCorpus,
    MaskedBytesTask,
    split_of,
    text_root,
)
from sbm_pyg.experiments.train import train
from tests.helpers import seeded


def _corpus_dir(tmp_path, count=30):
    # Files of known text, some in a subdirectory; every split gets some.
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    texts = {}
    for i in range(count):
        rel = f"pkg/m{i}.py" if i % 3 else f"m{i}.py"
        text = (f"def f{i}(x):\n    return x + {i}\n" * (3 + i % 4)).encode()
        (root / rel).write_bytes(text)
        texts[rel] = text
    (root / "notes.txt").write_text("not python\n")
    assert {split_of(rel) for rel in texts} == {"train", "val", "test"}
    return root, texts


def test_the_split_follows_the_path_hash_and_keeps_every_byte(tmp_path):
    root, texts = _corpus_dir(tmp_path)
    corpus = ByteCorpus(root)
    for name in ("train", "val", "test"):
        mine = sorted(rel for rel in texts if split_of(rel) == name)
        expected = b"".join(texts[rel] + b"\n" for rel in mine)
        assert bytes(corpus.splits[name].tolist()) == expected
        assert corpus.files[name] == len(mine)
    assert "train=" in repr(corpus)


def test_split_of_holds_out_a_tenth_of_torchs_files():
    files = [p.relative_to(text_root()).as_posix() for p in text_root().rglob("*.py")]
    assert len(files) > 1000
    shares = {name: sum(split_of(f) == name for f in files) / len(files)
              for name in ("train", "val", "test")}
    # Each of 10 hash buckets holds a tenth in expectation: 3 sigma bounds.
    sigma = math.sqrt(0.1 * 0.9 / len(files))
    assert abs(shares["test"] - 0.1) < 3 * sigma and abs(shares["val"] - 0.1) < 3 * sigma


def test_batches_mask_a_fixed_share_of_real_windows(tmp_path):
    root, _ = _corpus_dir(tmp_path)
    task = MaskedBytesTask(ByteCorpus(root), seq_len=20, batch_size=6,
                           generator=seeded(0), mask_rate=0.15)
    tokens, mask, labels = task.batch()
    assert tokens.shape == labels.shape == mask.shape == (6, 20) and mask.all()
    asked = labels != -100
    assert asked.sum(1).tolist() == [3] * 6  # ceil(0.15 * 20)
    assert (tokens[asked] == MASK).all() and (tokens[~asked] < 256).all()
    assert task.positions(labels).shape == (6, 3)
    # Unmasked, every window is a piece of the training stream.
    stream = bytes(task.corpus.splits["train"].tolist())
    for row in torch.where(asked, labels, tokens).tolist():
        assert bytes(row) in stream
    # Fresh training windows; the same held-out windows on every call.
    assert not torch.equal(task.batch()[0], tokens)
    first, again = list(task.eval_batches("test", 2)), list(task.eval_batches("test", 2))
    assert all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    test_stream = bytes(task.corpus.splits["test"].tolist())
    t, _, lab = first[0]
    assert all(bytes(r) in test_stream for r in torch.where(lab != -100, lab, t).tolist())


def test_bad_corpora_and_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match="root must be a directory"):
        ByteCorpus(tmp_path / "missing")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="too little text"):
        ByteCorpus(tmp_path / "one")
    root, _ = _corpus_dir(tmp_path)
    corpus = ByteCorpus(root)
    with pytest.raises(ValueError, match="seq_len 100000 is longer"):
        MaskedBytesTask(corpus, 100000, 2, seeded(0))
    with pytest.raises(ValueError, match="mask_rate must lie in"):
        MaskedBytesTask(corpus, 8, 2, seeded(0), mask_rate=1.0)
    with pytest.raises(ValueError, match="--mask-rate must lie in"):
        train_arguments(task="mlm", out=tmp_path / "r", mask_rate=0.0)


@pytest.mark.parametrize("attention", ["sbm", "full"])
def test_a_masked_byte_run_reports_bits_per_byte(tmp_path, attention):
    root, _ = _corpus_dir(tmp_path)
    out = tmp_path / attention
    final = train(train_arguments(
        task="mlm", text_root=root, out=out, attention=attention, seq_len=16,
        batch_size=3, channels=16, num_clusters=4, steps=2, eval_batches=2,
        no_progress=True))
    assert final["bits_per_byte"] == pytest.approx(final["loss"] / math.log(2))
    assert 0 <= final["accuracy"] <= 1 and final["args"]["task"] == "mlm"
    assert json.loads((out / "final.json").read_text())["bits_per_byte"] == \
        final["bits_per_byte"]


def test_the_text_presets_share_the_setting(tmp_path):
    shared = ("task", "seq_len", "num_layers", "heads", "channels", "short_conv",
              "batch_size", "lr", "steps", "schedule")
    full = vars(train_arguments("mlm-full", out=tmp_path))
    assert (full["task"], full["seq_len"], full["attention"]) == ("mlm", 1024, "full")
    for preset in ("mlm-bigbird", "mlm-sparse", "mlm-random"):
        args = vars(train_arguments(preset, out=tmp_path))
        assert {k: args[k] for k in shared} == {k: full[k] for k in shared}
    sparse = train_arguments("mlm-sparse", out=tmp_path)
    assert (sparse.recipe, sparse.target_density, sparse.teacher_accuracy) == \
        ("teacher", 0.05, 0.0)
    random = train_arguments("mlm-random", out=tmp_path)
    # Dense for as long as the learned selector's latest switch.
    assert random.dense_steps == sparse.dense_steps + sparse.selector_steps
    assert (random.sbm_lr, random.ste, random.init_density) == (0.0, "none", 0.05)
