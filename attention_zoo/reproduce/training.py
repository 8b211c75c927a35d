"""Train a reproduction's task presets into the store with the task engine (resumable: a run the
store already holds is not trained again unless forced), and read their tidy rows back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store import ResultStore
from ..tasks.driver import TaskRequest, train_task
from ..tasks.results import decode_metric, tidy_rows
from ..tasks.suite import TaskPreset
from .base import RunOptions


def train_presets(
    presets: Sequence[TaskPreset], store: ResultStore, options: RunOptions, **meta: Any
) -> None:
    """Train every preset's grid as `options` say, through the task engine as `zoo task` does
    (the same rule: a run the store holds is not trained again unless forced); `meta` is
    recorded with each run beside options.meta."""
    for preset in presets:
        request = TaskRequest(
            run_spec=preset.task.name,
            preset=preset.name,
            device=options.device,
            threads=options.threads,
        )
        train_task(
            request,
            store,
            preset=preset,
            executor=options.executor,
            policy=options.task_policy,
            progress=options.progress,
            meta={**options.meta, **meta},
        )


def task_rows(frame: Any) -> list[dict[str, Any]]:
    """Tidy task rows (task, preset, backend, length, seed, metric, value, eval, ref "run/case")
    of the claims' input, a `ResultStore.to_dataframe()` frame."""
    if frame is None or not len(frame):
        return []
    return tidy_rows(frame.to_dict("records"), with_ref=True)


def report_rows(tasks: Any) -> list[dict[str, Any]]:
    """Tidy task rows of the report's selected task runs (`Context.tasks`)."""
    rows = []
    for _, r in tasks.iterrows() if len(tasks) else ():
        identity = {k: r[k] for k in ("task", "preset", "backend", "length", "seed")}
        identity["ref"] = f"{r['run_id']}/{r['case_key']}"  # where the report's ledger finds it
        for name, value in r["metrics"].items():
            metric, evaluation = decode_metric(name)
            rows.append({**identity, "metric": metric, "value": value, "eval": evaluation})
    return rows
