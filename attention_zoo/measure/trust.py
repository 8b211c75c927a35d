"""Times worth trusting: a case whose repeats disagree is timed again (up to RETIMES more times),
the load other processes put on the cores is read around every timing, and one rule says which
stored times are unstable or busy; the runner, the tables and the report all read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .load import SLACK, cpu_count, others_load, read_cpu
from .timing import TimeStats, time_interleaved

# Quartiles a quarter of the median apart: the median itself is uncertain by about that much, more
# than many of the differences a report ranks; an idle machine keeps CPU and CUDA steps within a
# few percent (IQR/median 0.01-0.05 over the quick preset here).
UNSTABLE_IQR = 0.25
# The fastest repeat under half the median: something outside the step (a first call's lazy
# work, another process's burst) at least doubled most repeats; a step's own variation (caches,
# the allocator) stays well within 2x.
UNSTABLE_MIN = 0.5
# Timed again at most this many times: a transient (a burst of another process, a first run after
# install) has passed by then; a case that stays unstable is marked, not measured for ever.
RETIMES = 2

UNSTABLE, BUSY = "unstable", "busy"


@dataclass(frozen=True)
class Mark:
    """Why a stored time is set aside: its kind (UNSTABLE or BUSY) and a one-line reason."""

    kind: str
    reason: str


def unstable_reason(median: float, iqr: float, minimum: float) -> str | None:
    """Why a time's repeats disagree too much to rank it, or None."""
    if median <= 0:
        return None
    if iqr > UNSTABLE_IQR * median:
        return f"IQR {iqr / median:.0%} of the median (above {UNSTABLE_IQR:.0%})"
    if minimum < UNSTABLE_MIN * median:
        return f"minimum {minimum / median:.0%} of the median (below {UNSTABLE_MIN:.0%})"
    return None


def busy_reason(free_cores: float, threads: int) -> str | None:
    """Why other processes left too few cores for the case's threads while it was timed, or None.

    The rule of measure.load.busy_at_start: busy when the others' load exceeds
    cores - threads + SLACK, i.e. fewer than threads - SLACK cores were left free."""
    if free_cores >= threads - SLACK:
        return None
    return (
        f"other processes left {max(free_cores, 0.0):.2f} cores free while it was timed, "
        f"for its {threads} thread{'s' if threads != 1 else ''}"
    )


def timing_marks(metrics: Mapping[str, Any], threads: int) -> list[Mark]:
    """The marks of a stored case's time (its metrics by name; threads it ran with)."""
    marks = []
    median, iqr, minimum = (metrics.get(k) for k in ("time_median", "time_iqr", "time_min"))
    if median is not None and iqr is not None and minimum is not None:
        if reason := unstable_reason(median, iqr, minimum):
            attempts = metrics.get("time_attempts")
            timed = f" after {attempts:.0f} timings" if attempts else ""
            marks.append(Mark(UNSTABLE, f"unstable{timed}: {reason}"))
    free = metrics.get("free_cores")
    if free is not None and median is not None and (reason := busy_reason(free, threads)):
        marks.append(Mark(BUSY, f"busy: {reason}"))
    return marks


@dataclass(frozen=True)
class TrustedTime:
    """A case's final timing, how many timings it took, and the cores others left free then."""

    stats: TimeStats
    attempts: int
    free_cores: float | None


def time_until_stable(
    fns: dict[Any, Callable[[], Any]],
    *,
    device: str,
    warmup: int,
    repeats: int,
    budget_s: float,
    max_repeats: int,
    dropped: Callable[[Any], bool] = lambda key: False,
) -> dict[Any, TrustedTime]:
    """Time `fns` round-robin (measure.timing.time_interleaved); those whose time is unstable are
    timed again, round-robin among themselves, up to RETIMES more times. The CPU counters are
    read just before and after each timing, never inside it. dropped(key): a callable that failed
    (not timed again)."""
    out: dict[Any, TrustedTime] = {}
    todo = dict(fns)
    for attempt in range(1, RETIMES + 2):
        before = read_cpu()
        stats = time_interleaved(
            todo,
            device=device,
            warmup=warmup,
            repeats=repeats,
            budget_s=budget_s,
            max_repeats=max_repeats,
        )
        others = others_load(before, read_cpu())
        free = None if others is None else round(cpu_count() - others, 2)
        for key, s in stats.items():
            out[key] = TrustedTime(s, attempt, free)
        todo = {
            key: fns[key]
            for key, s in stats.items()
            if not dropped(key) and unstable_reason(s.median, s.iqr, s.min)
        }
        if not todo:
            break
    return out
