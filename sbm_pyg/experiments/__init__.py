"""Tasks and training for the paper's experiments."""
from sbm_pyg.experiments.tasks import ListOps, evaluate, generate_expression, repeat_batch, tokenize

__all__ = ["repeat_batch", "ListOps", "generate_expression", "evaluate", "tokenize"]
