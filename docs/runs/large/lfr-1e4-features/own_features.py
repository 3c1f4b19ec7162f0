"""What a node's own community features tell, on the graphs of the runs in
this folder: the test nodes' accuracy when each is given the community
whose centre (its members' mean features, over every node of the graph:
an oracle's knowledge, which the task's models must learn) is nearest
its features. ``python
docs/runs/large/lfr-1e4-features/own_features.py`` → ``own_features.json``."""
import argparse
import json
from pathlib import Path

import torch

from sbm_pyg.experiments.large import add_large_arguments, large_graph

HERE = Path(__file__).parent


def main():
    results = {}
    for name, mu, noise in (("mu0.7-noise3", "0.7", "3"), ("mu0.8-noise2", "0.8", "2")):
        parser = argparse.ArgumentParser()
        add_large_arguments(parser)
        args = parser.parse_args(["--out", "unused", "--graph", "lfr", "--nodes", "10000",
                                  "--mu", mu, "--features", "32", "--feature-noise", noise])
        data = large_graph(args, torch.Generator().manual_seed(0))  # the runs' seed 0
        classes = int(data.y.max()) + 1
        f = data.x[:, classes + 1:].double()
        counts = torch.bincount(data.y, minlength=classes).double()
        # The centres as drawn are not kept; with 50-1000 nodes a community
        # the features' mean stands for them (its error: noise / sqrt(size)).
        centre = torch.zeros(classes, f.size(1), dtype=torch.float64).index_add_(
            0, data.y, f) / counts[:, None]
        pred = torch.cdist(f, centre).argmin(1)
        test = data.test_mask
        results[name] = dict(
            own_features_accuracy=float((pred[test] == data.y[test]).double().mean()),
            classes=classes, test_nodes=int(test.sum()))
    (HERE / "own_features.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
