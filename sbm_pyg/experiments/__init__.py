"""Tasks and training for the paper's experiments."""
from sbm_pyg.experiments.tasks import (
    ListOps,
    evaluate,
    generate_expression,
    repeat_accuracy_bound,
    repeat_batch,
    tokenize,
)
from sbm_pyg.experiments.train import build_model, load_run

__all__ = ["repeat_batch", "repeat_accuracy_bound", "ListOps", "generate_expression",
           "evaluate", "tokenize", "build_model", "load_run"]
