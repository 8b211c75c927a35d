"""Train a reproduction's task presets into the store with the task engine (resumable: a run the
store already holds is not trained again unless `fresh`), and read their tidy rows back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..executors import Executor
from ..executors.local import LocalExecutor
from ..tasks.driver import train_runs
from ..tasks.results import TaskResults, tidy_rows
from ..tasks.runner import identity, plan_runs, skipped_key
from ..tasks.suite import TaskPreset


@dataclass
class Trained:
    """What `train_presets` did: runs trained now, runs found in the store, grid entries skipped."""

    trained: int = 0
    stored: int = 0
    skipped: list[str] = field(default_factory=list)  # "label: reason", once per label


def train_presets(
    presets: Sequence[TaskPreset],
    store: str | Path,
    *,
    device: str = "cpu",
    threads: int | None = None,
    fresh: bool = False,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> Trained:
    """Plan every preset's grid on `device`, store the skipped entries with their reason, and
    train the runs the store does not hold yet, as `zoo task` does."""
    done = Trained()
    todo = []
    with TaskResults(store, meta=meta, device=device) as results:
        for preset in presets:
            runs, skipped = plan_runs(preset, device=device)
            for s in skipped:
                for seed in preset.grid.seeds:
                    results.save_skipped(
                        identity(preset, s.label, seed),
                        skipped_key(preset, s.label, seed),
                        s.reason,
                    )
                line = f"{s.label}: {s.reason}"
                if line not in done.skipped:
                    done.skipped.append(line)
            for spec in runs:
                key = identity(preset, spec.variant.label, spec.seed)
                if not fresh and results.has_run(spec.key(), key):
                    done.stored += 1
                else:
                    todo.append(spec)
        train_runs(
            todo,
            results,
            executor or LocalExecutor(),
            device=device,
            threads=threads,
            progress=progress,
        )
    done.trained = len(todo)
    return done


def task_rows(frame: Any) -> list[dict[str, Any]]:
    """Tidy task rows (task, preset, backend, length, seed, metric, value, eval, ref "run/case")
    of the claims' input, a `ResultStore.to_dataframe()` frame."""
    if frame is None or not len(frame):
        return []
    return tidy_rows(frame.to_dict("records"), with_ref=True)


def report_rows(tasks: Any) -> list[dict[str, Any]]:
    """Tidy task rows of the report's selected task runs (`Context.tasks`)."""
    from ..tasks.results import decode_metric

    rows = []
    for _, r in tasks.iterrows() if len(tasks) else ():
        identity = {k: r[k] for k in ("task", "preset", "backend", "length", "seed")}
        identity["ref"] = f"{r['run_id']}/{r['case_key']}"  # where the report's ledger finds it
        for name, value in r["metrics"].items():
            metric, evaluation = decode_metric(name)
            rows.append({**identity, "metric": metric, "value": value, "eval": evaluation})
    return rows
