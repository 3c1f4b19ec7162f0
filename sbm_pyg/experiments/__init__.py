"""Tasks and training for the paper's experiments."""
from sbm_pyg.experiments.arguments import PRESETS, train_arguments
from sbm_pyg.experiments.runs import build_model, load_checkpoint, load_run
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
from sbm_pyg.experiments.text import ByteCorpus, MaskedBytesTask
from sbm_pyg.experiments.train import evaluate_model, train

__all__ = ["repeat_batch", "repeat_accuracy_bound", "ListOps", "generate_expression",
           "evaluate_expression", "tokenize", "RepeatTask", "ListOpsTask",
           "ByteCorpus", "MaskedBytesTask",
           "make_task", "build_model", "load_run", "load_checkpoint",
           "PRESETS", "train_arguments", "train", "evaluate_model"]

