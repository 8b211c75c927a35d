"""Machine load around a run: recorded with every run, warned about, and marked in reports.

Timings are only comparable on an idle machine: another process competing for the cores inflated
ratios many-fold with tight IQRs, so the load is sampled when a run starts and ends, while
the run's own threads are not working: the cores busy over a short sample of the kernel's CPU
counters (Linux; the run's meta says `"load": "sampled"`), else the 1-minute load average (which
also holds the tail of whatever ran just before, this run's own work included). The counters are
those of the cores this process may run on (its CPU affinity: taskset, cpusets), the same cores
`cpu_count` counts, so a load and the free cores beside it describe one set of cores. A run is
busy when the load leaves fewer free cores than its threads (`too_few_free`), at its start, and at
its end for a sampled load; a load average at the end includes the run's own threads, so there the
rule is load > cores + SLACK. Every case's timing is bracketed by two `CpuReading`s too (read
outside the timed calls, so they cost the case nothing): the cores the other processes left free
during it, this process's own CPU time subtracted (measure/trust.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass

SLACK = 0.5  # load above the free cores tolerated: short-lived noise, a shell, sampling
SAMPLE_S = 0.25  # seconds the CPU counters are sampled over
SAMPLED = "sampled"  # a run's meta["load"] when its loads come from the CPU counters
LOAD_AVERAGE = "load-average"  # ... when they are 1-minute load averages


@dataclass(frozen=True)
class Load:
    """The machine's load at one moment: cores busy (None: unknown) and how it was measured."""

    cores_busy: float | None
    kind: str  # SAMPLED or LOAD_AVERAGE


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity); every CPU where the system has none."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def cpu_count() -> int:
    """Cores this process may run on."""
    return len(allowed_cpus())


def cpu_times(stat: str, cpus: Collection[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies since boot summed over the `cpuN` lines of /proc/stat text for the
    CPUs in `cpus` (not its all-CPU `cpu` line: the host's other cores are not ours to use)."""
    busy = total = 0
    seen = False
    for line in stat.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        try:
            fields = [int(x) for x in values[:8]]
        except ValueError:
            return None
        idle = fields[3] + fields[4]  # idle, iowait
        busy, total, seen = busy + sum(fields) - idle, total + sum(fields), True
    return (busy, total) if seen else None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of the allowed CPUs since boot; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return cpu_times(stat, allowed_cpus())


def machine_load(sample_s: float | None = None) -> Load:
    """Cores busy now (all processes): the CPU counters over `sample_s` seconds (default
    SAMPLE_S); else the 1-minute load average; unknown where the system reports neither."""
    before = _cpu_times()
    if before is not None:
        time.sleep(SAMPLE_S if sample_s is None else sample_s)
        after = _cpu_times()
        if after is not None and after[1] > before[1]:
            share = (after[0] - before[0]) / (after[1] - before[1])
            return Load(round(share * cpu_count(), 2), SAMPLED)
    try:
        return Load(os.getloadavg()[0], LOAD_AVERAGE)
    except (OSError, AttributeError):
        return Load(None, LOAD_AVERAGE)


# Below this many seconds between two readings the counters' 10 ms ticks make the load coarser
# than SLACK; a timing lasts at least this long wherever the counters can be read
# (trust.time_until_stable).
MIN_WINDOW_S = 0.1


@dataclass(frozen=True)
class CpuReading:
    """The CPU counters at one moment: all CPUs' busy and total jiffies, this process's CPU
    seconds (all its threads), and the wall clock."""

    busy: int
    total: int
    own_s: float
    wall_s: float


def read_cpu() -> CpuReading | None:
    """The counters now (two small reads, no sleep); None where the system has no /proc/stat."""
    times = _cpu_times()
    if times is None:
        return None
    # all of this process's threads, to the nanosecond (os.times() counts 10 ms ticks)
    return CpuReading(times[0], times[1], time.process_time(), time.perf_counter())


def others_load(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """Cores kept busy by other processes between two readings: the busy share of the allowed
    CPUs times their count, less this process's CPU seconds per wall second; None when unknown or
    too short."""
    if before is None or after is None:
        return None
    wall, total = after.wall_s - before.wall_s, after.total - before.total
    if wall < MIN_WINDOW_S or total <= 0:
        return None
    machine = (after.busy - before.busy) / total * cpu_count()
    return round(max(0.0, machine - (after.own_s - before.own_s) / wall), 2)


def free_cores(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """Cores the other processes left free between two readings (None: unknown)."""
    others = others_load(before, after)
    return None if others is None else round(cpu_count() - others, 2)


def too_few_free(free: float, threads: int) -> bool:
    """The busy rule, the one everything applies: fewer cores free than the threads that need
    them, less SLACK."""
    return free < threads - SLACK


def busy_at_start(load: float, cores: int, threads: int) -> bool:
    return too_few_free(cores - load, threads)


def busy_at_end(load: float, cores: int, threads: int, *, sampled: bool) -> bool:
    """A sampled load excludes the run's own (finished) threads; a load average includes them."""
    return busy_at_start(load, cores, threads) if sampled else load > cores + SLACK


def busy_warning(sample: Load, cores: int, threads: int, *, at_end: bool = False) -> str:
    """A warning saying what was seen and why it matters, or '' when the machine looks idle."""
    load = sample.cores_busy
    if load is None:
        return ""
    if at_end:
        if not busy_at_end(load, cores, threads, sampled=sample.kind == SAMPLED):
            return ""
        seen = f"the load was {load:.2f} at the end of the run on {cores} cores"
    else:
        if not busy_at_start(load, cores, threads):
            return ""
        free = max(cores - load, 0)
        seen = (
            f"the load is {load:.2f} on {cores} cores, leaving about {free:.1f} free "
            f"for this run's {threads} thread{'s' if threads != 1 else ''}"
        )
    return (
        f"warning: the machine is busy: {seen}. Other processes compete for the cores, so times "
        "(and time ratios) can be inflated many times over, with tight IQRs that hide it; memory "
        "and FLOPs are unaffected. The report marks these timings; rerun on an idle machine "
        "for timings worth publishing."
    )
