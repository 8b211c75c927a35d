"""Train a reproduction's task presets into the store with the task engine (resumable: a run the
store already holds is not trained again unless forced), and read their tidy rows back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store import ResultStore
from ..sweep import SweepResult
from ..tasks.driver import TaskRequest, train_task
from ..tasks.results import decode_metric, tidy_rows
from ..tasks.suite import TaskPreset
from .base import Reproduction, RunOptions
from .stored import as_defined


def model_and_budget(preset: TaskPreset) -> str:
    """'2 layers d 64, 400 steps x 32': a preset's model and training budget, for scale lines."""
    model, train = preset.model, preset.train
    return (
        f"{model['num_hidden_layers']} layers d {model['hidden_size']}, {train.max_steps} steps "
        f"x {train.batch_size}"
    )


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


def task_rows(frame: Any, presets: Sequence[TaskPreset]) -> list[dict[str, Any]]:
    """Tidy task rows (task, preset, backend, length, seed, metric, value, eval, ref "run/case")
    of the claims' input, a `ResultStore.to_dataframe()` frame; a run of one of `presets` is read
    only as the preset defines it now (`as_defined`)."""
    if frame is None or not len(frame):
        return []
    records = frame.to_dict("records")  # one per stored metric
    configs = {r["case_key"]: r["config"] for r in records}  # each case judged once
    readable = {key for key, config in configs.items() if as_defined(config, presets)}
    return tidy_rows([r for r in records if r["case_key"] in readable], with_ref=True)


def report_rows(tasks: Any, presets: Sequence[TaskPreset]) -> list[dict[str, Any]]:
    """Tidy task rows of the report's selected task runs (`Context.tasks`), those of `presets`
    as `task_rows` reads them."""
    rows = []
    for _, r in tasks.iterrows() if len(tasks) else ():
        if not as_defined(r["config"], presets):
            continue
        identity = {k: r[k] for k in ("task", "preset", "backend", "length", "seed")}
        identity["ref"] = f"{r['run_id']}/{r['case_key']}"  # where the report's ledger finds it
        for name, value in r["metrics"].items():
            metric, evaluation = decode_metric(name)
            rows.append({**identity, "metric": metric, "value": value, "eval": evaluation})
    return rows


class TaskReproduction(Reproduction):
    """A reproduction whose experiments are task presets: `run` trains `trained_presets(size)`
    through the task engine, and its claims read them back (`task_rows`, `report_rows`)."""

    def run(self, size: str, store: ResultStore, options: RunOptions) -> list[SweepResult]:
        train_presets(self.trained_presets(size), store, options, reproduce=self.name, size=size)
        return []
