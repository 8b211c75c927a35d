"""The report's arithmetic as small pure functions: power-law fits, crossovers, Pareto fronts, and
the join of task accuracy with measured cost. No I/O, no formatting; unit-tested on known answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_FIT_LENGTHS = 3  # fewer measured lengths fit any line exactly: no exponent, no crossover


@dataclass(frozen=True, kw_only=True)
class PowerFit:
    """value ~ prefactor * length ** exponent, fitted by least squares on log-log points."""

    exponent: float
    prefactor: float
    r2: float  # coefficient of determination of the log-log line (1.0 = exact power law)
    points: int


def fit_exponent(lengths: Sequence[float], values: Sequence[float]) -> PowerFit | None:
    """The power law through (length, value) points; None without two distinct positive lengths."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values) if n > 0 and v and v > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for _, y in pts)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return PowerFit(exponent=slope, prefactor=math.exp(intercept), r2=r2, points=len(pts))


def linear_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of y on x (e.g. bytes per added layer); None without two distinct x."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if y is not None and y == y]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


@dataclass(frozen=True, kw_only=True)
class Crossover:
    """Where variant A starts beating (being below) variant B along the measured lengths.

    kind: "always" (A below B at every measured length), "from" (A below B from `length` on,
    interpolated log-log between the measured lengths `between`), "never" (A not below B at the
    largest measured length: not within the measured range), "tied" (A and B not told apart at
    the largest measured length).
    """

    kind: str
    length: float | None = None
    between: tuple[float, float] | None = None


def crossover(
    lengths: Sequence[float],
    a: Sequence[float],
    b: Sequence[float],
    margins: Sequence[float] | None = None,
) -> Crossover | None:
    """From which length A < B holds through the largest measured length; None with no common
    positive points. The crossing is interpolated linearly in log(length) vs log(A/B).
    margins: per length, how far apart A and B may lie and still be tied (their spreads): a tie
    counts as A not below B, and sits exactly on the crossing line."""
    margins = margins if margins is not None else [0.0] * len(lengths)
    pts = sorted(
        (float(n), 0.0 if abs(x - y) <= m else math.log(x) - math.log(y))
        for n, x, y, m in zip(lengths, a, b, margins)
        if n > 0 and x and y and x > 0 and y > 0
    )
    if not pts:
        return None
    if pts[-1][1] >= 0:
        return Crossover(kind="tied" if pts[-1][1] == 0 else "never")
    j = max((i for i, (_, d) in enumerate(pts) if d >= 0), default=None)
    if j is None:
        return Crossover(kind="always")
    (n0, d0), (n1, d1) = pts[j], pts[j + 1]
    t = d0 / (d0 - d1)  # d0 >= 0 > d1, so 0 <= t < 1
    length = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return Crossover(kind="from", length=length, between=(n0, n1))


def pareto_front(
    costs: Sequence[float], qualities: Sequence[float], *, maximize: bool = True
) -> list[bool]:
    """Which points no other point dominates (cost no higher and quality no worse, one strictly).

    Lower cost is better; higher quality when maximize (accuracy), lower otherwise (steps)."""
    sign = 1.0 if maximize else -1.0
    pts = [(float(c), sign * float(q)) for c, q in zip(costs, qualities)]
    out = []
    for i, (c, q) in enumerate(pts):
        dominated = any(
            c2 <= c and q2 >= q and (c2 < c or q2 > q) for j, (c2, q2) in enumerate(pts) if j != i
        )
        out.append(not dominated)
    return out


def join_tasks_costs(tasks: Any, costs: Any, *, on: Sequence[str] = ("model_key", "length")) -> Any:
    """Task rows (one per trained variant) with the cost rows of the same model configuration
    at the task's length: an inner join on `on`; cost columns keep their names.

    A task row without a matching cost row is left out (the report lists it as missing)."""
    if tasks.empty or costs.empty:
        return tasks.iloc[0:0].assign(**{c: [] for c in costs.columns if c not in tasks})
    return tasks.merge(costs, on=list(on), how="inner", suffixes=("", "_cost"))


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is zero."""
    if value is None or reference is None or value != value or reference != reference:
        return None
    return value / reference if reference else None
