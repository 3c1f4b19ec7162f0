r"""Graph datasets generated locally (nothing is downloaded)."""
from sbm_pyg.datasets.communities import CLUSTER_DEGREES, cluster_graph, community_task
from sbm_pyg.datasets.lfr import lfr_graph, lfr_statistics, powerlaw_sequence
from sbm_pyg.datasets.sbm_benchmark import RECIPES, SBMBenchmarkDataset, generate_sbm_graphs

__all__ = ["SBMBenchmarkDataset", "generate_sbm_graphs", "RECIPES", "lfr_graph",
           "lfr_statistics", "powerlaw_sequence", "CLUSTER_DEGREES", "cluster_graph",
           "community_task"]
