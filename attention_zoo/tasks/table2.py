"""The Reformer's Table 2 from stored task runs: attention in training (rows) x at evaluation
(columns).

Cells are the mean over seeds of the eval accuracy, with the spread (sample standard deviation)
when there is more than one seed. Built only from tidy result rows, so it works on any store.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..measure.table import format_table
from .results import TRAINED


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
class Table2:
    """Accuracy by (training variant, evaluation variant), plus steps-to-target per training
    variant."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    accuracy: Mapping[tuple[str, str], Cell]
    steps_to_target: Mapping[str, Cell]
    steps: Mapping[str, Cell]
    target_metric: str  # e.g. "steps_to_95"
    seeds: Mapping[str, tuple[int, ...]]


def _variant_order(label: str) -> tuple[int, int, str]:
    """shared-qk first (the paper's 'Full attention' row), then lsh by hashes descending, then
    the others."""
    if label in ("shared-qk", "full"):
        return (0 if label == "shared-qk" else 1, 0, label)
    if m := re.fullmatch(r"(.*lsh)-(\d+)", label):
        return (2 if m.group(1) == "lsh" else 3, -int(m.group(2)), label)
    return (4, 0, label)


def build_table2(rows: Iterable[Mapping[str, Any]]) -> Table2:
    """Pivot tidy rows (backend, seed, metric, value, eval) of one task/preset into Table 2."""
    acc: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    steps_to: dict[str, dict[int, float | None]] = defaultdict(dict)
    steps: dict[str, dict[int, float]] = defaultdict(dict)
    target_metric = ""
    for r in rows:
        variant, seed, metric, value = r["backend"], int(r["seed"]), r["metric"], r["value"]
        evaluation = r.get("eval") or TRAINED
        if metric == "accuracy":
            acc[(variant, evaluation)][seed] = float(value)
        elif metric.startswith("steps_to_"):
            target_metric = metric
            steps_to[variant][seed] = None if value is None or _isnan(value) else float(value)
        elif metric == "steps":
            steps[variant][seed] = float(value)
    variants = sorted({v for v, _ in acc}, key=_variant_order)
    evals = {e for _, e in acc} - {TRAINED}
    columns = [TRAINED, *sorted(evals, key=lambda e: (e != "full", *_variant_order(e)[1:]))]
    seeds = {
        v: tuple(sorted({s for (vv, _), d in acc.items() if vv == v for s in d})) for v in variants
    }
    return Table2(
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


def _header(column: str) -> str:
    if column == TRAINED:
        return "as trained"
    return "Full" if column == "full" else column.upper()


def format_table2(table: Table2) -> str:
    """A plain-text matrix: rows = training attention, columns = evaluation attention."""
    if not table.rows:
        return "(no stored task runs to build Table 2 from)"
    target = table.target_metric.removeprefix("steps_to_")
    headers = [
        "train \\ eval",
        *map(_header, table.columns),
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


def _isnan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
