"""The figures docs/gps.md gives without a training run: the generated
training splits' sizes (seed 0) and the models' parameter counts per preset
and attention. Writes stats.json beside this file and prints it.

    python docs/runs/gps/gps-benchmarks/stats.py
"""
import argparse
import json
from pathlib import Path

from sbm_pyg.datasets import generate_sbm_graphs
from sbm_pyg.experiments.gps import (
    GPS_PRESETS,
    add_gps_arguments,
    build_gps_model,
    validate_gps_arguments,
)

HERE = Path(__file__).resolve().parent
FEATURES = {"PATTERN": (3, 2), "CLUSTER": (7, 6)}  # node features, classes


def parameters(preset: str, dataset: str, attention: str) -> int:
    """Parameters of the model `python -m sbm_pyg gps --preset PRESET` builds."""
    parser = argparse.ArgumentParser()
    add_gps_arguments(parser)
    parser.set_defaults(**GPS_PRESETS[preset])
    args = parser.parse_args(["--dataset", dataset, "--attention", attention,
                              "--out", str(HERE / "unused")])
    validate_gps_arguments(args)
    model = build_gps_model(args, *FEATURES[dataset])
    return sum(p.numel() for p in model.parameters())


def main() -> dict:
    stats = {"datasets": {}, "parameters": {}}
    for name in ("PATTERN", "CLUSTER"):
        graphs = generate_sbm_graphs(name, "train", seed=0)
        stats["datasets"][name] = dict(
            graphs=len(graphs),
            nodes_per_graph=sum(g.num_nodes for g in graphs) / len(graphs),
            edges_per_graph=sum(g.num_edges for g in graphs) / len(graphs))
    runs = [("graphgps-pattern", "PATTERN"), ("graphgps-cluster", "CLUSTER"),
            ("graphgps-cpu", "PATTERN"), ("graphgps-cpu", "CLUSTER")]
    for preset, dataset in runs:
        stats["parameters"][f"{preset}/{dataset}"] = {
            attention: parameters(preset, dataset, attention)
            for attention in ("none", "multihead", "performer", "sbm")}
    (HERE / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
