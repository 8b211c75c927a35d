"""Train a reproduction's task presets into the store with the task engine (resumable: a run the
store already holds is not trained again unless `fresh`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..executors import Executor
from ..executors.local import LocalExecutor
from ..tasks.driver import train_runs
from ..tasks.results import TaskResults
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
