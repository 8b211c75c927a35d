"""Timing of a callable: warm-up, repeats until a time budget, robust statistics.

On CUDA each repeat is timed with CUDA events and the device is synchronised around it, so the
time is the kernels' time, not the launch time. On the CPU a repeat is wall time, or with the
CPU clock the process's CPU time (at one thread: what the step costs, which other processes
cannot inflate by taking the core). The torch thread count is recorded with every result because
CPU timings mean nothing without it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, kw_only=True)
class TimeStats:
    """Seconds per call over `repeats` timed calls (after `warmup` untimed ones)."""

    median: float
    iqr: float  # interquartile range (q75 - q25): the spread, robust to one slow outlier
    min: float
    mean: float
    repeats: int
    warmup: int
    threads: int  # torch.get_num_threads() while timing
    device: str
    samples: tuple[float, ...]


def synchronize(device: str | torch.device) -> None:
    """Wait for queued kernels on `device` (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def summarize(samples: Sequence[float], *, warmup: int, device: str) -> TimeStats:
    """Median, IQR, min and mean of per-call seconds."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    xs = sorted(samples)
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return TimeStats(
        median=statistics.median(xs),
        iqr=q3 - q1,
        min=xs[0],
        mean=statistics.fmean(xs),
        repeats=len(xs),
        warmup=warmup,
        threads=torch.get_num_threads(),
        device=str(device),
        samples=tuple(samples),
    )


WALL, CPU_CLOCK = "wall", "cpu"  # what a CPU repeat is timed by
CLOCKS = (WALL, CPU_CLOCK)


def clock_reader(clock: str) -> Callable[[], float]:
    """The seconds counter a CPU timing by `clock` reads: the process's CPU time or the wall."""
    return time.process_time if clock == CPU_CLOCK else time.perf_counter


def time_once(fn: Callable[[], Any], device: str, clock: str = WALL) -> float:
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    now = clock_reader(clock)
    t0 = now()
    fn()
    return now() - t0


def time_interleaved(
    fns: dict[Any, Callable[[], Any]],
    *,
    device: str = "cpu",
    warmup: int = 1,
    repeats: int = 5,
    budget_s: float = 0.0,
    max_repeats: int | None = None,
    min_wall_s: float = 0.0,
    clock: str = WALL,
) -> dict[Any, TimeStats]:
    """Time several callables round-robin (a, b, c, a, b, c, ...) so slow drift of the machine's
    load hits all of them alike; used where ratios between them are the result.

    At least `repeats` rounds; more rounds while the time spent is below `budget_s` per callable
    on average, up to `max_repeats` rounds; and more, past `max_repeats`, until the rounds have
    lasted `min_wall_s` (the load during a timing can only be read over a long enough window).
    clock: WALL or CPU_CLOCK (CPU only).
    """
    max_repeats = max(repeats, max_repeats or repeats)
    if repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    samples: dict[Any, list[float]] = {name: [] for name in fns}
    spent, rounds, start = 0.0, 0, time.perf_counter()
    while (rounds < max_repeats and (rounds < repeats or spent < budget_s * len(fns))) or (
        time.perf_counter() - start < min_wall_s
    ):
        for name, fn in fns.items():
            dt = time_once(fn, device, clock)
            samples[name].append(dt)
            spent += dt
        rounds += 1
    return {name: summarize(xs, warmup=warmup, device=device) for name, xs in samples.items()}


class fixed_threads:
    """Context manager: run with exactly `n` torch intra-op threads (None: leave as is)."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.old = torch.get_num_threads()

    def __enter__(self) -> int:
        if self.n is not None:
            if self.n < 1:
                raise ValueError(f"threads must be >= 1, got {self.n}")
            torch.set_num_threads(self.n)
        return torch.get_num_threads()

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.old)
