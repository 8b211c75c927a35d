"""How a task's stored runs are tabulated: a task declares its tabulation (`TaskConfig.tabulation`)
and the report and `zoo task --table2` render whatever the store holds with it.

`TrainEvalMatrix`: rows are the attention a model was trained with, columns the attention it was
evaluated with (weights unchanged; `trained` = as trained), a cell is one metric over seeds
(mean, and the sample standard deviation when there is more than one seed). Built only from tidy
result rows, so it works on any store. `SplitMatrix`: the same, its columns the task's evaluation
splits (lengths, depths, position ranges) in their natural order.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..measure.metrics import is_measured
from ..measure.table import format_table
from .results import TRAINED, decode_metric

T = TypeVar("T")


def variant_order(label: str) -> tuple[int, int, str]:
    """`trained` first, then shared-QK full attention, full, then `<mix>-<hashes>` by hashes
    down, then the others (by name)."""
    if label == TRAINED:
        return (-1, 0, label)
    if label in ("shared-qk", "full"):
        return (0, 0 if label == "shared-qk" else 1, label)
    if m := re.fullmatch(r"(.*)-(\d+)", label):
        return (1, -int(m.group(2)), m.group(1))
    return (2, 0, label)


@dataclass(frozen=True, kw_only=True)
class TrainEvalMatrix:
    """A task's results as a train x eval matrix of one metric (stored as `metric` as trained,
    `metric@<eval>` evaluated with another attention)."""

    metric: str = "accuracy"

    def place(self, backend: str, metric: str, evaluation: str = TRAINED) -> tuple[str, str] | None:
        """The cell (trained with, evaluated with) of one stored value, None when the value is not
        this matrix's metric; `metric` may carry its evaluation ("accuracy@lsh-8")."""
        name, at = decode_metric(metric)
        if name != self.metric:
            return None
        return backend, at if at != TRAINED else evaluation

    def cells(
        self, runs: Iterable[tuple[str, Iterable[str], T]]
    ) -> dict[tuple[str, str], list[tuple[str, T]]]:
        """(trained with, evaluated with) -> [(stored metric name, item)] from runs given as
        (backend, stored metric names, item), e.g. one report row per run."""
        out: dict[tuple[str, str], list[tuple[str, T]]] = {}
        for backend, metrics, item in runs:
            for metric in metrics:
                if (cell := self.place(backend, metric)) is not None:
                    out.setdefault(cell, []).append((metric, item))
        return out

    def axes(self, cells: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
        """The rows and columns of these cells, in `variant_order`."""
        cells = list(cells)
        rows = sorted({t for t, _ in cells}, key=variant_order)
        return rows, sorted({e for _, e in cells}, key=variant_order)

    def title(self, column: str) -> str:
        """A column's header in a plain-text table."""
        if column == TRAINED:
            return "as trained"
        return "Full" if column == "full" else column.upper()


@dataclass(frozen=True, kw_only=True)
class SplitMatrix(TrainEvalMatrix):
    """Rows: the attention trained; columns: `trained` (the held-out test set), then the task's
    evaluation splits ("n512-d50", "pos40-79") with their numbers in increasing order."""

    def axes(self, cells: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
        cells = list(cells)
        rows = sorted({t for t, _ in cells}, key=variant_order)
        return rows, sorted({e for _, e in cells}, key=natural_order)

    def title(self, column: str) -> str:
        return "test set" if column == TRAINED else column


def natural_order(label: str) -> tuple[bool, list[tuple[int, str]]]:
    """`trained` first, then labels by their text with numbers read as numbers ("n64" < "n512")."""
    parts = re.split(r"([0-9]+)", label)
    return label != TRAINED, [
        (int(p), "") if p.isascii() and p.isdigit() else (-1, p) for p in parts if p
    ]


@dataclass(frozen=True)
class Cell:
    """Mean and spread of one metric over seeds; `missing` counts runs without a value."""

    values: tuple[float, ...]
    missing: int = 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def spread(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class MatrixTable:
    """A task's matrix as `zoo task --table2` prints it: the metric by (training variant,
    evaluation variant), plus steps-to-target per training variant."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    accuracy: Mapping[tuple[str, str], Cell]
    steps_to_target: Mapping[str, Cell]
    steps: Mapping[str, Cell]
    target_metric: str  # e.g. "steps_to_95"
    seeds: Mapping[str, tuple[int, ...]]
    titles: Mapping[str, str] = field(default_factory=dict)  # column -> header (default: itself)


def build_matrix(
    rows: Iterable[Mapping[str, Any]], tabulation: TrainEvalMatrix = TrainEvalMatrix()
) -> MatrixTable:
    """Pivot tidy rows (backend, seed, metric, value, eval) of one task/preset into its matrix."""
    acc: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    steps_to: dict[str, dict[int, float | None]] = defaultdict(dict)
    steps: dict[str, dict[int, float]] = defaultdict(dict)
    target_metric = ""
    for r in rows:
        variant, seed, metric, value = r["backend"], int(r["seed"]), r["metric"], r["value"]
        cell = tabulation.place(variant, metric, r.get("eval") or TRAINED)
        if cell is not None:
            if is_measured(value):
                acc[cell][seed] = float(value)
        elif metric.startswith("steps_to_"):
            target_metric = metric
            steps_to[variant][seed] = float(value) if is_measured(value) else None
        elif metric == "steps" and is_measured(value):
            steps[variant][seed] = float(value)
    variants, columns = tabulation.axes(acc)
    seeds = {
        v: tuple(sorted({s for (vv, _), d in acc.items() if vv == v for s in d})) for v in variants
    }
    return MatrixTable(
        rows=tuple(variants),
        columns=tuple(columns),
        accuracy={k: Cell(tuple(d.values())) for k, d in acc.items()},
        steps_to_target={
            v: Cell(
                tuple(x for x in d.values() if x is not None), sum(x is None for x in d.values())
            )
            for v, d in steps_to.items()
        },
        steps={v: Cell(tuple(d.values())) for v, d in steps.items()},
        target_metric=target_metric,
        seeds=seeds,
        titles={c: tabulation.title(c) for c in columns},
    )


def format_accuracy(cell: Cell | None) -> str:
    if cell is None or not cell.values:
        return "-"
    text = f"{100 * cell.mean:.1f}%"
    return text + (f" ± {100 * cell.spread:.1f}" if len(cell.values) > 1 else "")


def format_steps(reached: Cell | None, total: Cell | None) -> str:
    if reached is None:
        return "-"
    text = f"{reached.mean:.0f}" if reached.values else "not reached"
    if len(reached.values) > 1:
        text += f" ± {reached.spread:.0f}"
    cap = f"cap {total.mean:.0f}" if total is not None and total.values else ""
    if reached.missing and not reached.values:
        return f"{text} ({cap})" if cap else text
    if reached.missing:
        seeds = len(reached.values) + reached.missing
        text += f" ({reached.missing} of {seeds} seeds not reached{', ' + cap if cap else ''})"
    return text


def format_matrix(table: MatrixTable) -> str:
    """A plain-text matrix: rows = training attention, columns = evaluation attention."""
    if not table.rows:
        return "(no stored task runs to tabulate)"
    target = table.target_metric.removeprefix("steps_to_")
    headers = [
        "train \\ eval",
        *(table.titles.get(c) or TrainEvalMatrix().title(c) for c in table.columns),
        f"steps to {target}%" if target else "steps",
        "seeds",
    ]
    body = []
    for variant in table.rows:
        cells = [format_accuracy(table.accuracy.get((variant, c))) for c in table.columns]
        steps = format_steps(table.steps_to_target.get(variant), table.steps.get(variant))
        body.append([variant, *cells, steps, ",".join(map(str, table.seeds.get(variant, ())))])
    legend = (
        "'-': not applicable (only lsh/shared-qk layers can be swapped) or not run; "
        "mean ± sample std over seeds"
    )
    return f"{format_table(headers, body)}\n{legend}"
