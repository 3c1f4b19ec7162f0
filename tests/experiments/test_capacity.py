import json

import pytest
import torch

from sbm_pyg.experiments import capacity
from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.capacity import (
    CANDIDATES,
    CandidateSBM,
    fit_selector,
    sampled_accuracy,
    teacher_batches,
)
from sbm_pyg.experiments.runs import build_model
from sbm_pyg.experiments.tasks import make_task


def _teacher(tmp_path, **overrides):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", attention="full", out=tmp_path, seq_len=8,
                           batch_size=4, heads=2, num_layers=2, **overrides)
    return build_model(args).eval(), make_task(args, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("candidate", CANDIDATES)
def test_candidates_give_probabilities(candidate):
    torch.manual_seed(0)
    sbm = CandidateSBM(candidate, heads=2, channels=4, num_clusters=8)
    p = sbm(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 6, 4))
    assert p.shape == (3, 2, 5, 6)
    assert (p >= 0).all() and (p <= 1 + 1e-6).all()
    p.sum().backward()
    assert sbm.clusters.grad is not None and sbm.clusters.grad.abs().sum() > 0


def test_top2_memberships_have_two_clusters():
    torch.manual_seed(0)
    sbm = CandidateSBM("mmsb-top2", heads=1, channels=4, num_clusters=8)
    memb = sbm.memberships(torch.randn(2, 1, 5, 4), sbm.clusters)
    assert ((memb > 0).sum(-1) == 2).all()
    torch.testing.assert_close(memb.sum(-1), torch.ones(2, 1, 5))


@pytest.mark.parametrize("candidate,clusters,key_clusters,nonzero", [
    ("mmsb-sharp", 16, False, 2), ("mmsb-sharp-asymmetric", 16, True, 2),
    ("mmsb-sharp-k512", 32, False, 2), ("mmsb-asymmetric", 8, True, 8)])
def test_the_variants_forms(candidate, clusters, key_clusters, nonzero):
    torch.manual_seed(0)
    sbm = CandidateSBM(candidate, heads=1, channels=4, num_clusters=8)
    assert sbm.clusters.shape == (1, clusters, 4)
    assert (sbm.key_clusters is not None) == key_clusters
    memb = sbm.memberships(torch.randn(2, 1, 5, 4), sbm.clusters)
    assert ((memb > 0).sum(-1) == nonzero).all()


def test_candidate_bad_input():
    with pytest.raises(ValueError, match="candidate"):
        CandidateSBM("nope", 1, 4)


def test_teacher_rows_are_the_models_attention(tmp_path):
    model, task = _teacher(tmp_path)
    (layer0, layer1), = teacher_batches(model, task, 1)
    A = layer0["attention"]
    assert A.shape == (4, 2, 8, 8)
    torch.testing.assert_close(A.sum(-1), torch.ones(4, 2, 8))
    # The first layer's rows are those of its own projections.
    q, k = layer0["query"], layer0["key"]
    torch.testing.assert_close(A, (q @ k.transpose(-1, -2) / 2 ** 0.5 / 2).softmax(-1)
                               if q.size(-1) == 8 else
                               (q @ k.transpose(-1, -2) / q.size(-1) ** 0.5).softmax(-1))
    assert layer0["scored"].all()  # the repeat task scores every token


def test_sampled_attention_on_every_pair_is_the_teacher(tmp_path):
    model, _ = _teacher(tmp_path)

    def accuracy(sbms):  # on the same test batches each time
        return sampled_accuracy(model, _teacher(tmp_path)[1], sbms, 2)

    sbms = [CandidateSBM("mmsb", 2, 16, 4) for _ in range(2)]
    for sbm in sbms:  # p = 1 on every pair: the graph is complete
        sbm.bias.data.fill_(50.0)
    dense = accuracy([])  # no layer replaced
    assert accuracy(sbms) == dense
    for sbm in sbms:  # p = 0: no edge, every attention output zero
        sbm.bias.data.fill_(-50.0)
    empty = accuracy(sbms)
    with torch.no_grad():
        for block in model.blocks:
            block.attention.out.weight.zero_()  # the layer's output is its bias
    assert accuracy([]) == empty
    assert empty != dense


def test_fit_holds_the_density(tmp_path):
    model, task = _teacher(tmp_path)
    batches = teacher_batches(model, task, 3)
    layer0 = [b[0] for b in batches]
    sbm, stats = fit_selector(layer0[:2], layer0[2:], "mmsb", 0.1, num_clusters=8,
                              steps=600)
    # From about 27% to the budget (the penalty's equilibrium lies a hair
    # above it), on held-out rows.
    assert 0.09 <= stats["expected_density"] <= 0.1 * 1.05
    assert 0 < stats["expected_recall"] <= 1
    assert 0 <= stats["top_key_probability_p5"] <= stats["top_key_probability"] <= 1
    with pytest.raises(ValueError, match="rho"):
        fit_selector(layer0, layer0, "mmsb", 0.0)
    with pytest.raises(ValueError, match="steps"):
        fit_selector(layer0, layer0, "mmsb", 0.1, steps=0)


def test_teacher_must_be_full_attention(tmp_path):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", attention="sbm", out=tmp_path, seq_len=8)
    with pytest.raises(ValueError, match="full-attention"):
        teacher_batches(build_model(args), make_task(args, torch.Generator()), 1)


def test_command_line_writes_the_curves(tmp_path):
    from sbm_pyg.experiments.train import train
    run = tmp_path / "teacher"
    train(train_arguments(task="repeat", attention="full", out=run, seq_len=8,
                          batch_size=4, steps=2, no_progress=True, num_layers=2))
    out = tmp_path / "capacity.json"
    capacity.main([str(run), "--out", str(out), "--candidates", "mmsb", "paper",
                   "--rho", "0.1", "--steps", "3", "--batches", "1", "--batch-size", "2",
                   "--eval-batches", "1"])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["candidate"], r["layer"]) for r in rows] == [
        ("mmsb", 0), ("mmsb", 1), ("paper", 0), ("paper", 1)]
    assert all(0 <= r["sampled_accuracy"] <= 1 for r in rows)
