import json

import pytest
import torch

from sbm_pyg.experiments.sharpness import main, model_sharpness, tile_profile
from sbm_pyg.experiments.tasks import RepeatTask
from sbm_pyg.models import SBMTransformer


def two_blocks():
    # Queries 0, 2 and keys 1, 3 in cluster 0, the rest in cluster 1 (one-
    # hot); within-cluster p = 1, across 0: two complete 2 x 2 blocks,
    # interleaved until the tokens are sorted by cluster.
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    return q, torch.eye(2), k


def test_two_blocks_are_two_full_cluster_pairs_and_tiles():
    row = tile_profile(*two_blocks(), tile=2, share=0.9)
    assert row == dict(density=0.5, cluster_pairs=2, cluster_pair_fraction=0.5,
                       cluster_pair_fill=1.0, tiles=2, tile_fraction=0.5,
                       tile_fill=1.0)
    # One tile of the whole sequence holds everything at the density.
    whole = tile_profile(*two_blocks(), tile=4, share=0.9)
    assert (whole["tiles"], whole["tile_fraction"], whole["tile_fill"]) == (1, 1.0, 0.5)
    # Half the mass is one block. Tiles of 3: the first (3 x 3 pairs) holds
    # one block and a corner of the other, 5 of the 8 expected edges.
    half = tile_profile(*two_blocks(), tile=3, share=0.5)
    assert (half["cluster_pairs"], half["cluster_pair_fill"]) == (1, 1.0)
    assert half["tiles"] == 1 and half["tile_fraction"] == pytest.approx(9 / 16)
    assert half["tile_fill"] == pytest.approx(5 / 9)
    # All of it: the other block's other corners lie in the three ragged
    # tiles, which count their real pairs (3 x 1, 1 x 3, 1 x 1).
    full = tile_profile(*two_blocks(), tile=3, share=1.0)
    assert full["tiles"] == 4 and full["tile_fraction"] == 1.0
    assert full["tile_fill"] == pytest.approx(0.5)


def test_mixed_memberships_spread_the_mass():
    q, block, k = two_blocks()
    soft = torch.full_like(q, 0.5)
    row = tile_profile(soft, block, soft, tile=2)
    # p = 0.5 everywhere: every cluster pair and tile equally heavy.
    assert row["density"] == 0.5 and row["tile_fill"] == 0.5
    assert row["tiles"] == 4  # 90% of four equal tiles needs all four


@pytest.mark.parametrize("change, match", [
    (dict(share=0.0), "share"), (dict(share=1.5), "share"),
    (dict(tile=0), "tile")])
def test_bad_arguments(change, match):
    args = dict(tile=2, share=0.9) | change
    with pytest.raises(ValueError, match=match):
        tile_profile(*two_blocks(), **args)
    q, block, k = two_blocks()
    with pytest.raises(ValueError, match="queries and keys"):
        tile_profile(q[:0], block, k, tile=2)


def test_model_sharpness_covers_every_layer_and_head(tmp_path):
    torch.manual_seed(0)
    model = SBMTransformer(17, 16, channels=8, heads=2, num_layers=2,
                           num_clusters=4).eval()
    task = RepeatTask(16, 3, torch.Generator().manual_seed(0))
    rows = model_sharpness(model, task, batches=2, tiles=[4, 16])
    assert [(r["layer"], r["head"], r["tile"]) for r in rows] == [
        (layer, head, tile) for layer in (0, 1) for head in (0, 1) for tile in (4, 16)]
    for r in rows:
        assert r["sequences"] == 6
        assert 0 < r["density"] < 1 and 0 < r["tile_fill"] <= 1
        if r["tile"] == 16:  # one tile of the whole sequence
            assert r["tile_fill"] == pytest.approx(r["density"])


def test_the_command_reads_runs_and_checkpoint_files(tmp_path):
    from tests.experiments.test_cli import run
    out = run(tmp_path, "r", "--steps", "1", "--heads", "2")
    table = tmp_path / "sharpness.json"
    rows = main([str(out), str(out / "checkpoint.pt"), "--out", str(table),
                 "--batches", "1", "--tiles", "4"])
    saved = json.loads(table.read_text())
    assert saved["rows"] == rows and saved["command"]["tiles"] == [4]
    assert [(r["run"], r["head"]) for r in rows] == [
        (str(out), 0), (str(out), 1), (str(out / "checkpoint.pt"), 0),
        (str(out / "checkpoint.pt"), 1)]
    assert rows[0]["task"] == "repeat" and rows[0] == rows[2] | dict(run=str(out))
