"""How long a case is expected to run, from its FLOP count and its rate on this machine
(rate.py), and the step wrapper that reports progress inside a long case and stops one after the
step that crosses its timeout."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cases import BenchCase
from .memory import rss_taken
from .rate import CALIBRATION_LENGTH, Rate, case_rate, probe_case

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 30.0  # a long case says how far it is at most this often
LONG_CASE_S = 30.0  # cases expected to run longer say how far they are


class CaseTimedOut(Exception):
    """A case stopped at a step boundary past its timeout."""


@dataclass(frozen=True)
class Expected:
    """A case's predicted duration: its step's FLOPs at its rate here, times its steps."""

    step_s: float
    steps: int
    rate: Rate

    @property
    def seconds(self) -> float:
        return self.step_s * self.steps

    def describe(self) -> str:
        """'6.2 h (5 steps of 1.2 h at 51.3 GFLOP/s, its rate timed here at 1024 tokens)'."""
        return (
            f"{format_duration(self.seconds)} ({self.steps} steps of "
            f"{format_duration(self.step_s)} at {self.rate.describe()}, its rate timed here at "
            f"{CALIBRATION_LENGTH} tokens)"
        )


def format_duration(seconds: float) -> str:
    """'6.2 h', '4.1 min', '12 s', '0.25 s'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def step_count(case: BenchCase, metrics: Sequence[str], *, warmup: int, min_repeats: int) -> int:
    """Steps a case runs at least: the output check, a warm-up (not for a forward), one per
    memory reading (RSS: the CPU's, beside a measured peak), the timing's warm-up and repeats."""
    steps = 1 + (case.mode != "forward")
    crosscheck = "crosscheck" in metrics
    steps += ("memory" in metrics) + crosscheck * (1 + rss_taken(case.device, metrics))
    if "time" in metrics:
        steps += max(0, warmup - 1) + min_repeats
    return steps


def expected_duration(
    case: BenchCase,
    flops: float,
    metrics: Sequence[str],
    *,
    warmup: int,
    min_repeats: int,
    probe_flops: int | None = None,
) -> Expected:
    """The case's expected duration on this machine (its rate measured once, then cached);
    `probe_flops`: its rate probe's FLOPs where already predicted (`flops` if it is the probe)."""
    if probe_flops is None and probe_case(case) == case:
        probe_flops = int(flops)
    rate = case_rate(case, probe_flops)
    steps = step_count(case, metrics, warmup=warmup, min_repeats=min_repeats)
    return Expected(rate.seconds(flops), steps, rate)


def over_limit(
    expected: Expected, time_limit_s: float | None, timeout_s: float | None
) -> str | None:
    """Why a case expected to take `expected` is not run (one line), or None within the limits:
    past --time-limit, or past --timeout (it would be stopped anyway)."""
    limits = [t for t in (time_limit_s, timeout_s) if t is not None]
    if not limits or expected.seconds <= min(limits):
        return None
    flag = "--time-limit" if min(limits) == time_limit_s else "--timeout"
    return (
        f"not run: predicted {expected.describe()} > {flag} {min(limits):g} s; "
        f"raise {flag} to run it"
    )


def past_timeout(start: float, timeout_s: float | None, done: str) -> str | None:
    """Why a case started at `start` (perf_counter) stops after `done`, or None within time."""
    elapsed = time.perf_counter() - start
    if timeout_s is None or elapsed <= timeout_s:
        return None
    return (
        f"stopped after {format_duration(elapsed)}, past --timeout {format_duration(timeout_s)} "
        f"(after {done})"
    )


class WatchedStep:
    """A case's step that logs progress every PROGRESS_EVERY_S when the case is expected to be
    long, and raises CaseTimedOut after the step that ends past `timeout_s` (from `start`)."""

    def __init__(
        self,
        step: Callable[[], None],
        name: str,
        *,
        start: float,
        expected: Expected | None,
        timeout_s: float | None,
    ) -> None:
        self.step, self.name, self.start = step, name, start
        self.expected, self.timeout_s = expected, timeout_s
        self.steps = 0
        self.last = time.perf_counter()

    def __call__(self) -> None:
        self.step()
        self.steps += 1
        now = time.perf_counter()
        elapsed = now - self.start
        steps = f"{self.steps} step{'s' if self.steps > 1 else ''}"
        if over := past_timeout(self.start, self.timeout_s, steps):
            raise CaseTimedOut(over)
        if self.expected is not None and now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            log.warning(
                "%s: %d of about %d steps, %s of about %s",
                self.name,
                self.steps,
                self.expected.steps,
                format_duration(elapsed),
                format_duration(self.expected.seconds),
            )
