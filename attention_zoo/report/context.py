"""What every report section reads: the selected rows, the ledger, and helpers that print a stored
value (or a case's status when it has none) through the ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..measure.status import OK, STATUS_TEXT
from .document import Heading, Para
from .ledger import Ledger, Ref

BUSY_MARK = "†"  # a timing from a run whose machine was busy


@dataclass
class Context:
    """The report's inputs after selection (see frame.SELECTION_RULE)."""

    cases: Any  # every selected case (frame.case_frame rows)
    bench: Any  # selected bench cases (frame.bench_frame)
    tasks: Any  # selected task runs (frame.task_frame)
    runs: list[dict[str, Any]]
    out_dir: Path
    reference: str = "sdpa"
    earlier_runs: dict[str, int] = field(default_factory=dict)  # identity -> older runs not shown
    ledger: Ledger = field(default_factory=Ledger)
    plots: list[Path] = field(default_factory=list)

    def ref(self, row: Any, what: str) -> Ref:
        return [row["run_id"], row["case_key"], what]

    def metric(self, row: Any, metric: str, kind: str = "", *, mark_busy: bool = False) -> str:
        """A stored metric of a case through the ledger (shown as the metric catalogue says), or
        its status when it has none."""
        value = row["metrics"].get(metric)
        if value is None:
            return STATUS_TEXT.get(row["status"], "-") if row["status"] != OK else "-"
        text = self.ledger.value(kind or metric, value, self.ref(row, metric))
        return text + BUSY_MARK if mark_busy and row.get("busy") else text

    def config(self, row: Any, path: str, kind: str = "length") -> str:
        from .ledger import config_value

        what = path if path.startswith("config.") else f"config.{path}"
        return self.ledger.value(kind, config_value(row["config"], what), self.ref(row, what))

    def input(self, row: Any, metric: str) -> tuple[Ref, dict[str, Any], float]:
        return (self.ref(row, metric), row["config"], row["metrics"][metric])


def empty_section(title: str, command: str) -> list[Any]:
    return [Heading(1, title), Para(f"No rows for this section; run `{command}` to fill it.")]
