"""Times worth trusting: a group whose repeats disagree is timed again, all its cases together (up
to RETIMES more times), the cores other processes left free are read around every timing, and one
rule says which stored times are unstable or busy; the runner, the tables and the report read it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .load import MIN_WINDOW_S, SLACK, free_cores, read_cpu, too_few_free
from .status import OK
from .timing import WALL, TimeStats, clock_reader, time_interleaved

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
# No retry after an attempt that took more than this many time budgets per case: an attempt
# normally spends about one budget a case, so beyond this its steps are slow enough that the
# minimum repeats, not the budget, set its length (a 16k-token case, a long training step), and
# a retry would cost minutes to re-measure what a few long repeats already average out.
RETRY_MAX_BUDGETS = 3.0

UNSTABLE, BUSY = "unstable", "busy"
CPU_TIMED = "cpu_clock"  # the metric that says a time is the process's CPU time (never busy)
CPU_TIME_NOTE = (
    "times: the process's CPU time per step at one thread (--clock cpu), what the step costs; "
    "other processes cannot inflate it by taking the core (they can still slow it a little "
    "through shared caches and memory), so no such time is set aside as busy"
)
# What each kind of mark means, in one line (the tables' notes; a case's numbers are its rows).
MARK_RULES = {
    UNSTABLE: (
        f"repeats that still disagreed after being timed again (IQR above {UNSTABLE_IQR:.0%} of "
        f"the median, or the fastest repeat below {UNSTABLE_MIN:.0%} of it)"
    ),
    BUSY: (
        f"other processes left fewer free cores than its threads less {SLACK} while it was timed "
        "(on CUDA: than the one launching thread)"
    ),
}


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


def busy_threads(device: str, threads: int) -> int:
    """The threads a timing needs cores for: on CUDA the one that launches the kernels (the
    device does the work; torch's CPU threads idle), else torch's threads."""
    return 1 if torch.device(device).type == "cuda" else threads


def busy_reason(free: float, threads: int, device: str) -> str | None:
    """Why other processes left too few cores for the timing's threads, or None (the rule of
    measure.load.too_few_free, with busy_threads)."""
    needed = busy_threads(device, threads)
    if not too_few_free(free, needed):
        return None
    return (
        f"other processes left {max(free, 0.0):.2f} cores free while it was timed, "
        f"for its {needed} thread{'s' if needed != 1 else ''}"
    )


def timing_marks(
    metrics: Mapping[str, Any], *, threads: int, device: str, run_busy: str | None = None
) -> list[Mark]:
    """The marks of a stored case's time: its metrics by name, the threads stored with it, its
    device. run_busy: why the run's load at its ends was busy (None: it was not, or unknown),
    which marks the case only when it has no reading of its own (free_cores): the case's reading,
    taken around its own timing, is the finer fact."""
    median, iqr, minimum = (metrics.get(k) for k in ("time_median", "time_iqr", "time_min"))
    if median is None:
        return []
    if metrics.get(CPU_TIMED):  # the process's CPU time: other processes cannot inflate it
        run_busy = None
    marks = []
    spread = None if iqr is None or minimum is None else unstable_reason(median, iqr, minimum)
    if reason := spread:
        attempts = metrics.get("time_attempts")
        timed = f" after {attempts:.0f} timing{'s' if attempts != 1 else ''}" if attempts else ""
        marks.append(Mark(UNSTABLE, f"unstable{timed}: {reason}"))
    free = None if metrics.get(CPU_TIMED) else metrics.get("free_cores")
    if free is not None:
        if reason := busy_reason(free, threads, device):
            marks.append(Mark(BUSY, f"busy: {reason}"))
    elif run_busy:
        marks.append(Mark(BUSY, f"busy: {run_busy}"))
    return marks


def time_trusted(status: str, kinds: Collection[str]) -> bool:
    """Whether a stored time may be ranked, divided or fitted: its case ran (ok) and no mark
    (of these kinds) sets it aside. The one rule of the tables and the report."""
    return status == OK and not ({BUSY, UNSTABLE} & set(kinds))


@dataclass(frozen=True)
class TrustedTime:
    """A case's kept timing, how many timings its group took, and the cores others left free
    during the kept one."""

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
    clock: str = WALL,
) -> dict[Any, TrustedTime]:
    """Time `fns` round-robin (measure.timing.time_interleaved). While any of them is unstable,
    all of them are timed again together (up to RETIMES more times), so every stored time comes
    from one attempt and their ratios from one interleaved run. Not retried: an attempt during
    which other processes kept the cores busy (the retry would measure the load again), or one
    longer than RETRY_MAX_BUDGETS budgets per case. Kept: the first attempt with every case
    stable, else the one whose worst IQR/median is the smallest (the tightest the group got).
    The CPU counters are read just before and after each timing, never inside it, and a timing
    with a budget lasts at least MIN_WINDOW_S where they can be read (more rounds than
    max_repeats for a fast step), so every such case has a reading of its own (budget 0: exactly
    `repeats` rounds, as asked). dropped(key):
    a callable that failed (left out of the retries and of the choice). clock: CPU_CLOCK times
    the process's CPU time, which other processes do not inflate: no load is read for it."""
    kept: dict[Any, TrustedTime] = {}
    kept_spread = float("inf")
    todo = dict(fns)
    attempt = 0
    # an attempt's length by the clock it is timed with: load does not make a CPU-time one long
    now = clock_reader(clock if torch.device(device).type == "cpu" else WALL)
    while todo:
        attempt += 1
        before = read_cpu() if clock == WALL else None
        start = now()
        stats = time_interleaved(
            todo,
            device=device,
            warmup=warmup,
            repeats=repeats,
            budget_s=budget_s,
            max_repeats=max_repeats,
            # a budgeted timing lasts long enough to read the load during it: a fast case would
            # otherwise have no reading, judged by the run's start and end samples instead
            min_wall_s=MIN_WINDOW_S if before is not None and budget_s > 0 else 0.0,
            clock=clock,
        )
        elapsed = now() - start
        free = free_cores(before, read_cpu()) if before is not None else None
        live = {key: s for key, s in stats.items() if not dropped(key)}
        spread = max((s.iqr / s.median for s in live.values() if s.median > 0), default=0.0)
        unstable = any(unstable_reason(s.median, s.iqr, s.min) for s in live.values())
        if not kept or not unstable or spread < kept_spread:
            kept = {key: TrustedTime(s, attempt, free) for key, s in stats.items()}
            kept_spread = spread
        threads = next(iter(stats.values())).threads
        busy = free is not None and busy_reason(free, threads, device) is not None
        too_long = elapsed > RETRY_MAX_BUDGETS * budget_s * len(todo)
        if not unstable or busy or too_long or attempt > RETIMES:
            break
        todo = {key: fns[key] for key in live}
    return {key: TrustedTime(t.stats, attempt, t.free_cores) for key, t in kept.items()}
