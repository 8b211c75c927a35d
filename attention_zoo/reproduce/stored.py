"""Stored rows as cases, for a reproduction's claims: the latest stored version of each case, its
config, status and metric values, and the `run/case` reference a claim cites."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..measure.metrics import is_measured
from ..measure.status import OK
from ..tasks.results import KIND as TASK_KIND
from ..tasks.runner import trained_as_defined
from ..tasks.suite import TaskPreset


@dataclass(frozen=True)
class StoredCase:
    """One stored case (its latest run): key, config, status and metric values."""

    key: str
    run_id: str
    status: str
    config: dict[str, Any]
    metrics: dict[str, float]

    @property
    def ref(self) -> str:
        """How a claim cites it (its `rows used`)."""
        return f"{self.run_id}/{self.key}"

    def memory(self) -> tuple[float | None, str]:
        """Total peak bytes of one step and how it was obtained (measured, else predicted)."""
        if self.status == OK and self.metrics.get("peak_total_bytes") is not None:
            return self.metrics["peak_total_bytes"], "measured"
        if self.metrics.get("predicted_total_bytes") is not None:
            return self.metrics["predicted_total_bytes"], "predicted"
        return None, self.status


def stored_cases(rows: Any) -> list[StoredCase]:
    """The latest stored version of every case in a `ResultStore.to_dataframe()` frame."""
    if rows is None or not len(rows):
        return []
    latest: dict[str, StoredCase] = {}
    order = rows.sort_values("created_at", kind="stable") if "created_at" in rows else rows
    for (run_id, key), part in order.groupby(["run_id", "case_key"], sort=False):
        first = part.iloc[0]
        config = first["config"]
        config = json.loads(config) if isinstance(config, str) else dict(config)
        metrics = {
            str(m): float(v)
            for m, v in zip(part["metric"], part["value"])
            if isinstance(m, str) and is_measured(v)
        }
        latest[key] = StoredCase(key, str(run_id), str(first["status"]), config, metrics)
    return list(latest.values())


def task_cases(rows: Any, task: str, presets: Sequence[TaskPreset]) -> list[StoredCase]:
    """The finished (ok) training runs of `task` among stored rows, those of `presets` as each is
    defined now (`as_defined`); config holds the identity (task, preset, backend, length, seed)
    and metrics `accuracy`, `accuracy@<eval>`, ..."""
    return [
        c
        for c in stored_cases(rows)
        if c.config.get("kind") == TASK_KIND
        and c.config.get("task") == task
        and c.status == OK
        and as_defined(c.config, presets)
    ]


def as_defined(config: Any, presets: Sequence[TaskPreset]) -> bool:
    """Whether a stored task case (its config) may be read by a reproduction of `presets`: a run
    of another preset name, or one whose stored spec agrees with its preset as defined now (a
    run trained before the preset was edited is not averaged with the runs trained after)."""
    config = json.loads(config) if isinstance(config, str) else config
    if not isinstance(config, Mapping) or not isinstance(spec := config.get("spec"), Mapping):
        return True
    named = [
        p for p in presets if (p.task.name, p.name) == (config.get("task"), config.get("preset"))
    ]
    # one name may stand for several presets (a sweep's lengths): any of them may have trained it
    return not named or any(trained_as_defined(spec, p) for p in named)


__all__ = ["StoredCase", "as_defined", "stored_cases", "task_cases"]
