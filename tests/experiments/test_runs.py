"""Run helpers (sbm_pyg/experiments/runs.py) not covered through the CLI."""
import pytest
import torch

from sbm_pyg.experiments.runs import PeakMemory


def test_peak_memory_counts_what_a_stretch_adds():
    # On Linux the resident set's peak beyond the start: a 64 MiB buffer
    # touched within the stretch shows, at least most of it.
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    buf = torch.ones(16 * 2**20, device="cpu")  # 64 MiB, written
    got = peak.read()
    del buf
    if got is None:
        pytest.skip("no /proc/self/status here")
    assert got >= 48 * 2**20


@pytest.mark.parametrize("ste,reaches", [("paper", True), ("none", False)])
def test_ste_none_builds_heads_without_the_estimator(tmp_path, ste, reaches):
    # --ste none: the sampled graphs' loss reaches the SBM only through the
    # straight-through estimator, so without it the SBM gets no gradient.
    from sbm_pyg import SBMConv
    from sbm_pyg.experiments.arguments import train_arguments
    from sbm_pyg.experiments.runs import build_model
    args = train_arguments(task="repeat", out=tmp_path, seq_len=16, num_clusters=4,
                           ste=ste, sbm_init="dense")
    model = build_model(args)
    convs = [m for m in model.modules() if isinstance(m, SBMConv)]
    assert convs and all(c.ste == (None if ste == "none" else ste) for c in convs)
    tokens = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(0))
    model(tokens).token_logits.square().sum().backward()
    grads = [p.grad for c in convs for p in c.sbm.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads) == reaches


def test_sink_builds_heads_with_a_learned_sink(tmp_path):
    # --sink: every SBM layer gets a logit per head, which the loss moves.
    from sbm_pyg import SBMConv
    from sbm_pyg.experiments.arguments import train_arguments
    from sbm_pyg.experiments.runs import build_model
    args = train_arguments(task="repeat", out=tmp_path, seq_len=16, num_clusters=4,
                           sink=True, sbm_init="dense")
    model = build_model(args)
    convs = [m for m in model.modules() if isinstance(m, SBMConv)]
    assert convs and all(c.sink is not None and c.sink.shape == (c.heads,)
                         for c in convs)
    tokens = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(0))
    model(tokens).token_logits.square().sum().backward()
    assert all(c.sink.grad is not None and c.sink.grad.abs().sum() > 0 for c in convs)
    plain = build_model(train_arguments(task="repeat", out=tmp_path, seq_len=16,
                                        num_clusters=4))
    assert all(m.sink is None for m in plain.modules() if isinstance(m, SBMConv))
    with pytest.raises(ValueError, match="--sink"):
        train_arguments(task="repeat", out=tmp_path, seq_len=16, attention="full",
                        sink=True)
