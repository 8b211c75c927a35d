"""What every report section reads: the selected rows, the ledger, and helpers that print a stored
value (or a case's status when it has none) through the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..measure.labels import DEFAULT_REFERENCE
from ..measure.status import OK, STATUS_TEXT
from ..measure.trust import BUSY, UNSTABLE, time_trusted
from .document import Heading, Para
from .ledger import Ledger, Ref, config_value

BUSY_MARK = "†"  # a timing taken while the machine was busy
UNSTABLE_MARK = "‡"  # a timing whose repeats disagreed (measure/trust.py)
TIME = "time_median"


@dataclass
class Context:
    """The report's inputs after selection (see frame.SELECTION_RULE)."""

    cases: Any  # every selected case (frame.case_frame rows)
    bench: Any  # selected bench cases (frame.bench_frame)
    tasks: Any  # selected task runs (frame.task_frame)
    runs: list[dict[str, Any]]
    out_dir: Path
    reference: str = DEFAULT_REFERENCE
    earlier_runs: dict[str, int] = field(default_factory=dict)  # identity -> older runs not shown
    ledger: Ledger = field(default_factory=Ledger)
    plots: list[Path] = field(default_factory=list)
    rows: Any = None  # the stored rows used (rows.csv): what claims are judged on
    reproductions: Sequence[Any] = ()  # report.claims.ClaimsSource: whose claims to add
    held_equal: str = ""  # what --equal kept, one sentence ('' without --equal)

    def ref(self, row: Any, what: str) -> Ref:
        return [row["run_id"], row["case_key"], what]

    def metric(self, row: Any, metric: str, kind: str = "", *, mark_time: bool = False) -> str:
        """A stored metric of a case through the ledger (shown as the metric catalogue says), or
        its status when it has none; mark_time: with the marks of a time set aside."""
        value = row["metrics"].get(metric)
        if value is None:
            return STATUS_TEXT.get(row["status"], "-") if row["status"] != OK else "-"
        text = self.ledger.value(kind or metric, value, self.ref(row, metric))
        return text + time_marks(row) if mark_time else text

    def set_aside(self) -> str:
        """How many shown times are set aside and why ('' when none)."""
        if self.bench.empty:
            return ""
        timed = [r for _, r in self.bench.iterrows() if r["status"] == OK and TIME in r["metrics"]]
        busy = [r for r in timed if flag(r, "busy")]
        unstable = [r for r in timed if flag(r, "unstable")]
        aside = [r for r in timed if not trusted(r, TIME)]
        if not aside:
            return ""

        def count(rows: list[Any]) -> str:
            return self.ledger.derive("count", "count", [self.input(r, TIME) for r in rows])[1]

        return (
            f"{count(aside)} of {count(timed)} times set aside ({count(busy)} taken while the "
            f"machine was busy, {BUSY_MARK}; {count(unstable)} unstable, {UNSTABLE_MARK}: repeats "
            "that still disagreed after being timed again): shown, but never named fastest, "
            "never in a time ratio, an exponent or a crossover."
        )

    def config(self, row: Any, path: str, kind: str = "length") -> str:
        what = path if path.startswith("config.") else f"config.{path}"
        return self.ledger.value(kind, config_value(row["config"], what), self.ref(row, what))

    def input(self, row: Any, metric: str) -> tuple[Ref, dict[str, Any], float]:
        return (self.ref(row, metric), row["config"], row["metrics"][metric])


def trusted(row: Any, metric: str) -> bool:
    """Whether a case's `metric` may be ranked, fitted or divided: a number of a case that ran
    (status ok); a time only when neither busy nor unstable. Memory and FLOPs ignore the load."""
    if row["status"] != OK or metric not in row["metrics"]:
        return False
    kinds = [kind for kind in (BUSY, UNSTABLE) if flag(row, kind)]  # the frame's flag columns
    return metric != TIME or time_trusted(row["status"], kinds)


def time_marks(row: Any) -> str:
    """The marks of a case's time set aside ('' when it is trusted): what a number made from that
    time carries too."""
    return (BUSY_MARK if flag(row, "busy") else "") + (
        UNSTABLE_MARK if flag(row, "unstable") else ""
    )


def flag(row: Any, name: str) -> bool:
    """A row's yes/no column; missing, None and NaN (pandas' unknown) read as no."""
    value = row.get(name)
    return value is not None and value == value and bool(value)


def opening(title: str, *paras: str | None) -> list[Any]:
    """A section's heading and its opening paragraphs (None: a paragraph it has not here)."""
    return [Heading(1, title), *(Para(p) for p in paras if p)]


def empty_section(title: str, command: str) -> list[Any]:
    return opening(title, f"No rows for this section; run `{command}` to fill it.")
