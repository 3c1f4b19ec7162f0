import math

import pytest
import torch

from sbm_pyg import SBMConv
from sbm_pyg.experiments.arguments import train_arguments
from sbm_pyg.experiments.recall import RECALL_KEYS, RecallMeter, row_recall
from sbm_pyg.experiments.runs import build_model
from sbm_pyg.experiments.tasks import make_task
from sbm_pyg.experiments.train import evaluate_model
from sbm_pyg.models import SBMTransformer
from tests.helpers import seeded


def test_row_recall_exact_values():
    # One (sequence, head) of three query rows over four keys, the last
    # key padding; degrees 1, 2, 0: the oracle's m = round(3 / 3) = 1.
    A = torch.tensor([[[0.5, 0.3, 0.2, 0.0],
                       [0.1, 0.6, 0.3, 0.0],
                       [0.2, 0.2, 0.6, 0.0]]], dtype=torch.float64)
    S = torch.tensor([[[False, True, False, False],
                       [True, True, False, False],
                       [False, False, False, False]]])
    P = torch.tensor([[[0.5, 1.0, 0.0, 0.0],
                       [0.5, 0.5, 0.5, 0.0],
                       [0.1, 0.1, 0.1, 0.0]]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, False]])
    recall, expected, top, oracle = row_recall(A, S, P, valid)[:, 0].tolist()
    assert recall == pytest.approx([0.3, 0.7, 0.0])
    assert expected == pytest.approx([0.55, 0.5, 0.1])
    assert top == [0.0, 1.0, 0.0]
    assert oracle == pytest.approx([0.5, 0.6, 0.6])
    # Degree 6 over three rows: two keys each.
    S2 = torch.tensor([[[True, True, False, False]] * 3])
    assert row_recall(A, S2, P, valid)[3, 0].tolist() == pytest.approx([0.8, 0.9, 0.8])
    # Never more keys than the sequence has: the whole row.
    S3 = torch.tensor([[[True, True, True, False]] * 3])
    S3[0, 0, 3] = True
    assert row_recall(A, S3, P, valid)[3, 0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_row_recall_bad_input():
    A = torch.rand(2, 3, 3)
    with pytest.raises(ValueError, match="one shape"):
        row_recall(A, torch.zeros(2, 3, 4, dtype=torch.bool), A, torch.ones(2, 3).bool())
    with pytest.raises(TypeError, match="sampled"):
        row_recall(A, torch.zeros(2, 3, 3), A, torch.ones(2, 3).bool())


def _reference(conv, x, lengths, graph, memb, mode):
    # Sequence by sequence, head by head, row by row: the recalls' means
    # over every (layer's) row, per head.
    H, C = conv.heads, conv.out_channels
    q = conv.lin_query(x).view(-1, H, C)
    k = conv.lin_key(x).view(-1, H, C)
    q_memb, block, k_memb = memb
    j_all, i_all = graph.edge_index
    edges = set(zip(graph.head.tolist(), i_all.tolist(), j_all.tolist()))
    sums, rows = torch.zeros(4, H, dtype=torch.float64), 0
    start = 0
    for n in lengths:
        for h in range(H):
            for i in range(start, start + n):
                keys = range(start, start + n)
                a = torch.softmax(torch.stack([q[i, h] @ k[j, h] for j in keys])
                                  / math.sqrt(C), 0).double()
                s = torch.tensor([(h, i, j) in edges for j in keys])
                p = torch.stack([q_memb[i, h] @ block[h] @ k_memb[j, h]
                                 for j in keys]).double()
                p = p.clamp(0, 1) if mode == "exact" else 1 - torch.exp(-p)
                degree = sum(1 for (hh, ii, jj) in edges
                             if hh == h and start <= ii < start + n)
                m = min(n, max(1, math.floor(degree / n + 0.5)))
                sums[:, h] += torch.tensor([
                    float((a * s).sum()), float((a * p).sum()),
                    float(s[a.argmax()]), float(a.sort(descending=True).values[:m].sum())],
                    dtype=torch.float64)
        rows += n
        start += n
    return sums / rows


@pytest.mark.parametrize("max_pairs,mode", [(2**24, "exact"), (40, "exact"),
                                            (2**24, "poisson")])
def test_recall_meter_matches_a_row_by_row_reference(max_pairs, mode):
    torch.manual_seed(0)
    lengths = [5, 3, 6]
    conv = SBMConv(8, 4, heads=2, num_clusters=3, mode=mode,
                   sbm_parametrization="mmsb").eval()
    x = torch.randn(sum(lengths), 8)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    captured = []
    conv.sbm.register_forward_hook(lambda m, i, out: captured.append(out))
    with torch.no_grad(), RecallMeter(conv, max_pairs=max_pairs) as meter:
        _, (graph, _) = conv(x, batch, return_attention_weights=True,
                             generator=seeded(1))
    # A graph neither empty nor complete, so that each recall is a test.
    assert 0 < graph.num_edges < 2 * sum(n * n for n in lengths)
    summary = meter.summary()
    with torch.no_grad():
        want = _reference(conv, x, lengths, graph, captured[0], mode)
    for k, name in enumerate(RECALL_KEYS):
        assert summary[f"{name}_per_layer_head"] == [pytest.approx(want[k].tolist())]
        assert summary[name] == pytest.approx(float(want[k].mean()))
    assert 0 < summary["recall"] < 1
    assert summary["oracle_recall"] >= summary["recall"] - 0.2  # a sanity bound only


def test_recall_meter_accumulates_and_leaves_the_forward_unchanged():
    torch.manual_seed(0)
    model = SBMTransformer(10, 8, channels=8, heads=2, num_layers=2, num_clusters=4).eval()
    tokens = torch.randint(1, 10, (3, 8))
    plain = model(tokens, generator=seeded(2)).token_logits
    with RecallMeter(model) as meter:
        measured = model(tokens, generator=seeded(2)).token_logits
        model(tokens, generator=seeded(3))
    # The same graphs; with a graph asked for, a dense-regime head is
    # attended by the sparse kernel: equal up to rounding.
    torch.testing.assert_close(plain, measured, rtol=1e-5, atol=1e-6)
    assert meter.rows == [48, 48]  # two forwards of 24 rows, per layer
    summary = meter.summary()
    assert len(summary["recall_per_layer_head"]) == 2
    assert all(len(heads) == 2 for heads in summary["recall_per_layer_head"])
    # Hooks removed on exit: nothing more is measured.
    model(tokens, generator=seeded(4))
    assert meter.rows == [48, 48]


def test_recall_meter_bad_input():
    with pytest.raises(ValueError, match="SBMConv"):
        RecallMeter(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_pairs"):
        RecallMeter(SBMConv(4, 2), max_pairs=0)
    assert RecallMeter(SBMConv(4, 2)).summary() == {}


def test_evaluation_records_the_recall(tmp_path):
    torch.manual_seed(0)
    args = train_arguments(task="repeat", out=tmp_path, seq_len=8, batch_size=4,
                           heads=2, num_clusters=4)
    task = make_task(args, seeded(0))
    model = build_model(args)
    device = torch.get_default_device()
    result = evaluate_model(model.to(device), task, device, seeded(1), "val", 2)
    for name in RECALL_KEYS:
        assert 0 <= result[name] <= 1
        assert len(result[f"{name}_per_layer_head"][0]) == 2
    args.attention = "full"
    full = build_model(args).to(device)
    assert "recall" not in evaluate_model(full, task, device, seeded(1), "val", 1)
