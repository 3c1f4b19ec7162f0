import json

import pytest
import torch

from sbm_pyg.examples.gps import GPSNet, anchor_colour_graphs, main


def test_anchor_colour_labels():
    graphs = anchor_colour_graphs(50, 5, 9, colors=3, seed=0)
    assert graphs[0].x.shape[1] == 4
    for data in graphs:
        n = data.num_nodes
        assert 5 <= n <= 9
        assert data.x[:, :3].sum(1).eq(1).all()  # one colour per node
        (anchor,) = data.x[:, 3].nonzero().flatten().tolist()
        colour = data.x[:, :3].argmax(1)
        assert torch.equal(data.y.bool(), colour == colour[anchor])
        # A ring: every node has exactly two neighbours, both directions.
        assert torch.bincount(data.edge_index[1], minlength=n).tolist() == [2] * n
    labels = torch.cat([d.y[d.x[:, 3] == 0] for d in graphs])
    # Non-anchor labels are Bernoulli(1/3): a 4-sigma band (fixed seed).
    assert abs(labels.mean() - 1 / 3) < 4 * (2 / 9 / labels.numel()) ** 0.5
    # Colours are uniform whatever the anchor's: no local clue to the label.
    colours = torch.cat([d.x[:, :3].argmax(1) for d in graphs])
    counts = torch.bincount(colours, minlength=3).double()
    assert ((counts - counts.mean()).abs() < 4 * (colours.numel() * 2 / 9) ** 0.5).all()
    assert not torch.equal(graphs[0].x, anchor_colour_graphs(1, 5, 9, 3, seed=1)[0].x)


@pytest.mark.parametrize("attention", ["none", "multihead", "performer", "sbm"])
def test_model_forward_backward(attention):
    from torch_geometric.loader import DataLoader
    data = next(iter(DataLoader(anchor_colour_graphs(4, 6, 10, 3, 0), batch_size=4)))
    data = data.to(torch.get_default_device())
    # PyG's Performer draws its projection buffer on the CPU: the model is
    # moved, as the example's run() moves it.
    model = GPSNet(4, 8, num_layers=2, heads=2, attention=attention,
                   num_clusters=4).to(torch.get_default_device())
    logits = model(data.x, data.edge_index, data.batch)
    assert logits.shape == (data.num_nodes,)
    (logits.sum() + model.density_loss()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()
               if p.grad is not None)
    density = model.density()
    assert (density is None) == (attention != "sbm")
    if density is not None:
        assert density.shape == (2, 2)


def test_main_writes_results(tmp_path, capsys):
    out = tmp_path / "gps.json"
    assert main(["--epochs", "1", "--train", "16", "--test", "8",
                 "--min-nodes", "6", "--max-nodes", "10", "--hidden", "8",
                 "--num-clusters", "4", "--attention", "none", "sbm",
                 "--include-input-edges", "--json", str(out),
                 "--device", str(torch.get_default_device())]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["attention"] for r in results] == ["none", "sbm"]
    assert all(0 <= r["accuracy"] <= 1 for r in results)
    assert len(results[1]["density_per_layer_head"]) == 2
    assert "sbm" in capsys.readouterr().out


def test_main_pins_the_thread_count(monkeypatch):
    # The figures of docs/gps.md repeat only at the thread count they were
    # made with: the example sets it rather than taking the machine's.
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    assert main(["--epochs", "1", "--train", "4", "--test", "4",
                 "--min-nodes", "6", "--max-nodes", "8", "--hidden", "8",
                 "--attention", "none", "--threads", "3"]) == 0
    assert calls == [3]


@pytest.mark.parametrize("argv", [["--heads", "3"], ["--epochs", "0"], ["--threads", "0"],
                                  ["--min-nodes", "2"], ["--lam", "-1"],
                                  ["--attention", "dense"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
