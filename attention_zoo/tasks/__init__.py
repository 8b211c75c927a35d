"""Synthetic long-range tasks, their training recipe and declarative suites (`zoo task`).

from attention_zoo.tasks import load_task_preset, plan_runs, run_one
preset = load_task_preset("duplication", "cpu")      # the built-in suite, preset cpu
runs, skipped = plan_runs(preset, backends=["shared-qk"], eval_hashes=[8, 1])
outcome = run_one(runs[0])                           # train from the seed, evaluate overrides
outcome.result.steps_to_target, outcome.test.accuracy, outcome.evals["lsh-1"].accuracy
"""

from . import (  # noqa: F401  (registers the built-in tasks)
    associative_recall,
    duplication,
    forgetting_mqar,
    listops,
    niah,
    selective_copying,
    state_tracking,
)
from .associative_recall import AssociativeRecallTask
from .base import TASKS, Batch, TaskConfig, TaskData, get_task, make_task, register_task
from .duplication import DuplicationTask
from .forgetting_mqar import ForgettingMQARTask
from .listops import ListOpsTask
from .niah import NeedleTask
from .runner import (
    EvalVariant,
    RunOutcome,
    RunSpec,
    TrainVariant,
    build_model,
    outcome_rows,
    plan_runs,
    run_one,
    with_attention,
)
from .selective_copying import SelectiveCopyingTask
from .state_tracking import StateTrackingTask
from .suite import TaskGrid, TaskPreset, load_task_preset
from .tabulate import MatrixTable, SplitMatrix, TrainEvalMatrix, build_matrix, format_matrix
from .trainer import EvalResult, TrainConfig, TrainResult, evaluate, train

__all__ = [
    "TASKS",
    "AssociativeRecallTask",
    "Batch",
    "DuplicationTask",
    "EvalResult",
    "EvalVariant",
    "ForgettingMQARTask",
    "ListOpsTask",
    "MatrixTable",
    "NeedleTask",
    "RunOutcome",
    "RunSpec",
    "SelectiveCopyingTask",
    "SplitMatrix",
    "StateTrackingTask",
    "TaskConfig",
    "TaskData",
    "TaskGrid",
    "TaskPreset",
    "TrainConfig",
    "TrainEvalMatrix",
    "TrainResult",
    "TrainVariant",
    "build_matrix",
    "build_model",
    "evaluate",
    "format_matrix",
    "get_task",
    "load_task_preset",
    "make_task",
    "outcome_rows",
    "plan_runs",
    "register_task",
    "run_one",
    "train",
    "with_attention",
]
