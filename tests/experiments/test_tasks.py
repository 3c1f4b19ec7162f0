import math
import random

import pytest
import torch

from sbm_pyg.experiments.batches import held_out_generator
from sbm_pyg.experiments.tasks import (
    MQAR_POWER,
    OPERATORS,
    VOCAB,
    ListOps,
    ListOpsTask,
    MQARTask,
    RepeatTask,
    evaluate_expression,
    generate_expression,
    mqar_batch,
    repeat_accuracy_bound,
    repeat_batch,
    tokenize,
)
from tests.helpers import seeded, z_bound


def reference_eval(text: str) -> int:
    """Independent stack evaluator over the token string (no tree)."""
    stack = []
    for token in text.split():
        if token == "]":
            args = []
            while not isinstance(stack[-1], str):
                args.append(stack.pop())
            op = stack.pop()
            args.sort()
            if op == "[MIN":
                stack.append(args[0])
            elif op == "[MAX":
                stack.append(args[-1])
            elif op == "[MED":
                mid = len(args) // 2
                stack.append(args[mid] if len(args) % 2 else (args[mid - 1] + args[mid]) // 2)
            else:
                stack.append(sum(args) % 10)
        else:
            stack.append(token if token.startswith("[") else int(token))
    assert len(stack) == 1
    return stack[0]


@pytest.mark.parametrize("text,value", [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MIN 3 [MAX 5 1 ] 8 ]", 3),
    ("[MED 1 8 3 4 ]", 3),          # median 3.5 truncated
    ("[MED 2 9 5 ]", 5),
    ("[SM 7 8 9 ]", 4),
    ("[SM [MAX 9 9 ] [MED 0 1 ] 5 ]", 4),  # 9 + int(0.5) + 5 = 14 -> 4
])
def test_hand_written_expressions(text, value):
    assert reference_eval(text) == value


def parse(text: str):
    tokens = text.split()

    def node(i):
        if tokens[i] in OPERATORS:
            op, args, i = tokens[i], [], i + 1
            while tokens[i] != "]":
                arg, i = node(i)
                args.append(arg)
            return (op, args), i + 1
        return int(tokens[i]), i + 1
    return node(0)[0]


@pytest.mark.parametrize("text", [
    "[MAX 2 9 [MIN 4 7 ] 0 ]", "[MED 1 8 3 4 ]", "[SM [MAX 9 9 ] [MED 0 1 ] 5 ]",
])
def test_evaluate_matches_reference_on_hand_written(text):
    tree = parse(text)
    assert " ".join(tokenize(tree)) == text
    assert evaluate_expression(tree) == reference_eval(text)


def test_generated_labels_match_reference_evaluator():
    rng = random.Random(0)
    for _ in range(300):
        tree = generate_expression(rng, max_depth=6, max_args=5)
        assert evaluate_expression(tree) == reference_eval(" ".join(tokenize(tree)))


def test_generator_rules():
    rng = random.Random(1)
    trees = [generate_expression(rng, max_depth=10, max_args=10) for _ in range(4000)]
    # The root is a value with probability 0.75 (binomial bound, z < 4.5).
    values = sum(isinstance(t, int) for t in trees)
    assert abs(values - 3000) < 4.5 * (4000 * 0.75 * 0.25) ** 0.5
    for tree in trees:
        if not isinstance(tree, int):
            assert tree[0] in OPERATORS and 2 <= len(tree[1]) <= 10
    deep = generate_expression(random.Random(2), max_depth=1)
    assert isinstance(deep, int)  # at max_depth always a value


def test_listops_dataset_cached_disjoint_and_bounded(tmp_path):
    data = ListOps(tmp_path, sizes=(60, 20, 20), min_length=10, max_length=40, seed=3)
    seqs = {}
    for name, (tokens, lengths, labels) in data.splits.items():
        assert tokens.shape[1] == 39
        assert bool(((lengths > 10) & (lengths < 40)).all())
        assert bool(((labels >= 0) & (labels <= 9)).all())
        for row, n, label in zip(tokens, lengths, labels):
            text = " ".join(VOCAB[t] for t in row[:n].tolist())
            assert bool((row[n:] == 0).all())
            assert reference_eval(text) == int(label)
            seqs.setdefault(name, set()).add(text)
    assert not (seqs["train"] & seqs["val"]) and not (seqs["train"] & seqs["test"])
    assert not (seqs["val"] & seqs["test"])
    assert len(list(tmp_path.glob("listops-*.pt"))) == 1
    again = ListOps(tmp_path, sizes=(60, 20, 20), min_length=10, max_length=40, seed=3)
    assert torch.equal(again.splits["test"][0], data.splits["test"][0])
    other = ListOps(tmp_path, sizes=(60, 20, 20), min_length=10, max_length=40, seed=4)
    assert not torch.equal(other.splits["test"][0], data.splits["test"][0])


def test_listops_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="min_length"):
        ListOps(tmp_path, min_length=50, max_length=40)
    with pytest.raises(ValueError, match="sizes"):
        ListOps(tmp_path, sizes=(1, 2))


def test_repeat_batch_labels():
    tokens, labels = repeat_batch(64, 16, seeded(0))
    assert tokens.shape == labels.shape == (64, 16)
    assert int(tokens.min()) >= 1 and int(tokens.max()) <= 16
    for row, lab in zip(tokens.tolist(), labels.tolist()):
        assert lab == [float(row.count(t) > 1) for t in row]
    with pytest.raises(ValueError, match="length"):
        repeat_batch(2, 1)


@pytest.mark.parametrize("length,edge_prob", [(8, 0.5), (32, 0.6358), (64, 0.9)])
def test_repeat_accuracy_bound_is_met_by_the_best_rule(length, edge_prob):
    # Monte Carlo of the rule the bound assumes: say "repeated" iff a copy is
    # among the sampled keys, or, seeing none, the likelier label.
    g = seeded(0)
    tokens, labels = repeat_batch(4000, length, g)
    same = tokens[:, :, None] == tokens[:, None, :]
    same &= ~torch.eye(length, dtype=torch.bool, device=same.device)
    seen = same & (torch.rand(same.shape, generator=g, device=same.device) < edge_prob)
    seen = seen.any(-1)
    unseen = ~seen
    guess = (labels[unseen].mean() > 0.5).float()
    correct = (seen.float() == labels)[seen].sum() + (labels[unseen] == guess).sum()
    n = labels.numel()
    acc = float(correct) / n
    bound = repeat_accuracy_bound(length, edge_prob)
    # Tokens of one sequence are dependent; 5 binomial sigmas over sequences
    # (not tokens) is a loose but valid bound.
    sigma = (bound * (1 - bound) / 4000) ** 0.5
    assert abs(acc - bound) < 5 * sigma
    # The rule is right on every token it sees a copy of.
    assert bool((labels[seen] == 1).all())


def test_repeat_accuracy_bound_values_and_errors():
    assert repeat_accuracy_bound(256, 1.0) == pytest.approx(1.0)
    # Nothing seen: the majority class, "repeated", 1 - P(no copy).
    assert repeat_accuracy_bound(256, 0.0) == pytest.approx(1 - (255 / 256) ** 255)
    # The poisson mode's ceiling 1 - e^-1.01 caps it near 84%.
    assert 0.83 < repeat_accuracy_bound(256, 1 - math.exp(-1.01)) < 0.845
    bounds = [repeat_accuracy_bound(64, q / 10) for q in range(11)]
    assert bounds == sorted(bounds)
    with pytest.raises(ValueError, match="length"):
        repeat_accuracy_bound(1, 0.5)
    with pytest.raises(ValueError, match="edge_prob"):
        repeat_accuracy_bound(8, 1.5)


def test_mqar_batch_follows_the_recipe():
    B, N, P, V = 64, 64, 8, 100
    tokens, targets = mqar_batch(B, N, P, V, seeded(0))
    assert tokens.shape == targets.shape == (B, N)
    assert tokens.dtype == targets.dtype == torch.long
    assert int(tokens.min()) >= 0 and int(tokens.max()) < V
    keys, values = tokens[:, 0:2 * P:2], tokens[:, 1:2 * P:2]
    assert bool(((keys >= 1) & (keys < V // 2)).all())
    assert bool(((values >= V // 2) & (values < V)).all())
    for row in range(B):
        assert len(set(keys[row].tolist())) == P  # distinct keys and values
        assert len(set(values[row].tolist())) == P
        asked = (targets[row] != -100).nonzero().flatten()
        # Each key is asked once, after the pairs, at an even offset, and
        # its target is its value.
        assert asked.numel() == P
        assert bool(((asked >= 2 * P) & ((asked - 2 * P) % 2 == 0)).all())
        lookup = dict(zip(keys[row].tolist(), values[row].tolist()))
        asked_keys = tokens[row, asked].tolist()
        assert sorted(asked_keys) == sorted(lookup)
        assert targets[row, asked].tolist() == [lookup[k] for k in asked_keys]
    # The same generator state gives the same batch.
    again = mqar_batch(B, N, P, V, seeded(0))
    assert torch.equal(again[0], tokens) and torch.equal(again[1], targets)


def test_mqar_queries_follow_the_power_law():
    # The gaps g (0-based) are drawn with weights (g + 1)^(a - 1) without
    # replacement: the nearest gap is asked with its exact inclusion
    # probability in two draws, p_0 + sum_j p_j p_0 / (1 - p_j).
    B, N, P, V = 4000, 256, 2, 64
    tokens, targets = mqar_batch(B, N, P, V, seeded(1))
    asked = (targets != -100)
    gap0 = asked[:, 2 * P].double()  # the position right after the pairs
    space = (N - 2 * P) // 2
    w = torch.arange(1, space + 1, dtype=torch.float64) ** (MQAR_POWER - 1)
    p_first = float(w[0] / w.sum())
    pj = w / w.sum()
    p_incl = p_first + float((pj[1:] * p_first / (1 - pj[1:])).sum())
    mean = float(gap0.mean())
    sd = math.sqrt(p_incl * (1 - p_incl) / B)
    assert abs(mean - p_incl) < z_bound(1) * sd
    # Far gaps are drawn too (a < 1 has a heavy tail).
    far = asked[:, N // 2:].any(1).double().mean()
    assert float(far) > 0.2


@pytest.mark.parametrize("args,match", [
    ((2, 15, 4, 64), "length must be at least 4 \\* num_pairs"),
    ((2, 64, 4, 8), "vocab_size must give num_pairs distinct keys"),
    ((0, 64, 4, 64), "batch must be a positive int"),
    ((2, 64, 0, 64), "num_pairs must be a positive int"),
])
def test_mqar_bad_sizes_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        mqar_batch(*args)


def test_mqar_loss_from_the_asked_positions_only():
    # The model's token head at the asked positions gives the loss and the
    # recalls of the head at every position.
    from types import SimpleNamespace

    from sbm_pyg.experiments.tasks import MQARTask, task_forward
    from sbm_pyg.models import SBMTransformer
    task = MQARTask(32, 4, 64, batch_size=3, generator=seeded(0))
    batch = task.batch()
    asked = task.positions(batch[2])  # 4 positions a sequence, in order
    assert asked.shape == (3, 4) and torch.all(asked.diff(dim=1) > 0)
    assert torch.all(batch[2].gather(1, asked) != -100)
    torch.manual_seed(0)
    model = SBMTransformer(64, 32, channels=16, attention="full", token_classes=64)
    out = task_forward(model, task, batch, torch.device("cpu"))
    assert out.token_logits.shape == (12, 64)
    full = model(batch[0], batch[1], output="token").token_logits
    want = MQARTask.loss_and_correct(SimpleNamespace(token_logits=full), batch[1],
                                     batch[2])
    got = MQARTask.loss_and_correct(out, batch[1], batch[2])
    torch.testing.assert_close(got[0], want[0])
    assert int(got[1]) == int(want[1]) and got[2] == want[2] == 12


def test_held_out_batches_are_the_same_at_every_call_and_leave_training_alone(tmp_path):
    data = ListOps(tmp_path, sizes=(60, 20, 20), min_length=10, max_length=40, seed=3)
    tasks = [RepeatTask(8, 4, seeded(0)), MQARTask(32, 4, 40, 4, seeded(0)),
             ListOpsTask(data, 4, seeded(0))]
    for task in tasks:
        state = task.generator.get_state()
        first, again = (list(task.eval_batches("val", 2)) for _ in range(2))
        assert all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
        # Two batches of one call differ; the training stream is untouched.
        assert not torch.equal(first[0][0], first[1][0])
        assert torch.equal(task.generator.get_state(), state)
        assert not torch.equal(task.batch()[0], first[0][0])
    # A split's graphs start from other numbers than its batches.
    draws = [torch.rand(4, generator=held_out_generator("val", graphs=g)) for g in (False, True)]
    assert not torch.equal(*draws)
    with pytest.raises(ValueError, match="split must be one of"):
        held_out_generator("train")
