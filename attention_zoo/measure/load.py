"""Machine load around a run: recorded with every run, warned about, and marked in reports.

Timings are only comparable on an idle machine: another process competing for the cores inflated
ratios up to 100x here with tight IQRs, so the load is sampled when a run starts and ends.
A run is busy at its start when the 1-minute load average leaves fewer free cores than the run's
threads (load > cores - threads + SLACK), and at its end when the load exceeds the cores
(load > cores + SLACK; the run's own threads are part of that load).
"""

from __future__ import annotations

import os

SLACK = (
    0.5  # load above the free cores tolerated: short-lived noise, a shell, the load average's tail
)


def load_average() -> float | None:
    """The 1-minute load average, or None where the system does not report one."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def busy_at_start(load: float, cores: int, threads: int) -> bool:
    return load > cores - threads + SLACK


def busy_at_end(load: float, cores: int) -> bool:
    return load > cores + SLACK


def busy_warning(load: float | None, cores: int, threads: int, *, at_end: bool = False) -> str:
    """A warning saying what was seen and why it matters, or '' when the machine looks idle."""
    if load is None:
        return ""
    if at_end:
        if not busy_at_end(load, cores):
            return ""
        seen = f"the load average was {load:.2f} at the end of the run on {cores} cores"
    else:
        if not busy_at_start(load, cores, threads):
            return ""
        free = max(cores - load, 0)
        seen = (
            f"the load average is {load:.2f} on {cores} cores, leaving about {free:.1f} free "
            f"for this run's {threads} thread{'s' if threads != 1 else ''}"
        )
    return (
        f"warning: the machine is busy: {seen}. Other processes compete for the cores, so times "
        "(and time ratios) can be inflated many times over, with tight IQRs that hide it; memory "
        "and FLOPs are unaffected. The report marks these timings; rerun on an idle machine "
        "for timings worth publishing."
    )
