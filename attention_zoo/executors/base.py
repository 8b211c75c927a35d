"""What every executor shares: a job (one case of a sweep), its outcome, and the function that runs
a job wherever the executor puts it (this process, or a Ray worker on another machine)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..measure.env import Environment, capture
from ..measure.runner import describe_error, is_oom
from ..plugins import ENV_VAR, child_environment, load_plugins, split_targets

MAX_RETRIES = 2  # a job whose worker dies runs at most 1 + MAX_RETRIES times


def retries_text(n: int) -> str:
    """'1 retry', '2 retries'."""
    return f"{n} retr{'y' if n == 1 else 'ies'}"


@dataclass(frozen=True, kw_only=True)
class Job:
    """One unit of a sweep: a bench case or one training run.

    fn must be a module-level function (a Ray worker imports it by name); args and kwargs must
    pickle. local_kwargs are passed only when the job runs in the driver's process (callbacks such
    as a per-step progress bar); a remote worker runs the job without them.
    """

    key: str  # the case key: what the store files the outcome under
    label: str  # what progress and messages call it
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    local_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    threads: int | None = None  # torch threads the job uses; None: the worker's default
    timed: bool = True  # its result holds timings (others sharing its cores would distort them)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a job: fn's return value, or why there is none (error text; oom when the
    failure was running out of memory), and the environment of the process that ran it."""

    key: str
    value: Any = None
    error: str | None = None
    oom: bool = False
    environment: Environment | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_job(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: str,
    device: str,
    threads: int | None,
    plugins: Sequence[str] = (),
) -> Outcome:
    """Run one job here and describe it: an exception becomes an error outcome (never raised), and
    the environment is captured in this process, so a row names the machine that measured it.
    plugins: the driver's plugin modules, loaded first in a fresh process (a Ray worker)."""
    if plugins:
        failed = _load_plugins(plugins)
        if failed:
            return Outcome(key=key, error=failed, environment=_environment(device, threads))
    try:
        value = fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return Outcome(
            key=key,
            error=describe_error(exc),
            oom=is_oom(exc),
            environment=_environment(device, threads),
        )
    return Outcome(key=key, value=value, environment=_environment(device, threads))


def run_pickled(
    payload: bytes, *, key: str, device: str, threads: int | None, plugins: Sequence[str] = ()
) -> Outcome:
    """run_job of a pickled (fn, args, kwargs), read here after the plugins are loaded (a class a
    plugin defines can be unpickled only then); one that cannot be read is an error outcome."""
    failed = _load_plugins(plugins) if plugins else None
    if failed:
        return Outcome(key=key, error=failed, environment=_environment(device, threads))
    try:
        fn, args, kwargs = pickle.loads(payload)
    except Exception as exc:
        return Outcome(
            key=key,
            error=f"its worker could not read the job: {describe_error(exc)}",
            environment=_environment(device, threads),
        )
    return run_job(fn, args, kwargs, key=key, device=device, threads=threads)


def _load_plugins(plugins: Sequence[str]) -> str | None:
    """Load the driver's plugins here (once per process); the first failure's message, if any."""
    failures = load_plugins(plugins, report=False)
    return f"on this worker: {failures[0].message()}" if failures else None


def plugin_targets() -> list[str]:
    """The plugins this process loaded that another process can import again (for its workers)."""
    return split_targets(child_environment().get(ENV_VAR, ""))


def _environment(device: str, threads: int | None) -> Environment | None:
    try:
        return capture(device, threads)
    except Exception:  # a broken device query must not lose the measurement
        return None


class ExecutorBase:
    """Context manager of every executor: `with executor:` releases what it acquired on exit,
    so several sweeps of one command share one Ray runtime."""

    def close(self) -> None:
        """Nothing to release by default."""

    def __enter__(self) -> ExecutorBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Executor(Protocol):
    """Runs jobs and yields each outcome as it finishes; the caller writes the store."""

    name: str

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Connect and check that every job can be placed; raise ZooError (before anything runs)."""

    def run(
        self, jobs: Sequence[Job], *, on_start: Callable[[Job], None] | None = None
    ) -> Iterator[Outcome]:
        """Run `jobs`; yield one Outcome per job in the order they finish."""

    def close(self) -> None:
        """Release what prepare() acquired (a Ray runtime this executor started)."""

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def describe(self) -> str:
        """One line for the command's header: where the jobs run."""
