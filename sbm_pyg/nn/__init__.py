"""Neural network modules: the SBM, the SBM attention function and its
SBMConv layer, padded-batch attention, the GPS layers and what GraphGPS puts around
them (GatedGCN, Laplacian positional encodings)."""
from sbm_pyg.nn import functional
from sbm_pyg.nn._sbm_attention import SBMAttention, sbm_attention
from sbm_pyg.nn.attention import SBMMultiheadAttention
from sbm_pyg.nn.baselines import FullAttention, LinearAttention
from sbm_pyg.nn.bigbird import BigBirdAttention, bigbird_graph, bigbird_sizes
from sbm_pyg.nn.block_model import StochasticBlockModel
from sbm_pyg.nn.conv import SBMConv
from sbm_pyg.nn.distillation import attention_distillation, edge_fit, recall_fit
from sbm_pyg.nn.gated_gcn import GatedGCNConv
from sbm_pyg.nn.gps import EdgeGPSConv, SBMGPSConv
from sbm_pyg.nn.losses import DensityBudget, density_loss, distillation_loss
from sbm_pyg.nn.options import SBMAttentionOptions
from sbm_pyg.nn.positional import AddLaplacianPE, LapPEEncoder
from sbm_pyg.nn.recorder import GraphRecorder
from sbm_pyg.nn.tiled_attention import tiled_attention, tiled_sbm_attention

__all__ = ["StochasticBlockModel", "SBMConv", "SBMMultiheadAttention",
           "SBMGPSConv", "GraphRecorder", "FullAttention",
           "LinearAttention", "density_loss", "DensityBudget", "functional", "sbm_attention",
           "SBMAttention", "SBMAttentionOptions", "EdgeGPSConv", "GatedGCNConv", "AddLaplacianPE",
           "LapPEEncoder", "attention_distillation", "distillation_loss", "edge_fit",
           "recall_fit", "tiled_attention", "tiled_sbm_attention",
           "BigBirdAttention", "bigbird_graph", "bigbird_sizes"]
