"""Tasks and training for the paper's experiments."""
from sbm_pyg.experiments.runs import build_model, load_run
from sbm_pyg.experiments.tasks import (
    ListOps,
    ListOpsTask,
    RepeatTask,
    evaluate_expression,
    generate_expression,
    make_task,
    repeat_accuracy_bound,
    repeat_batch,
    tokenize,
)

__all__ = ["repeat_batch", "repeat_accuracy_bound", "ListOps", "generate_expression",
           "evaluate_expression", "tokenize", "RepeatTask", "ListOpsTask",
           "make_task", "build_model", "load_run"]
