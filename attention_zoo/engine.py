"""The one run pipeline: bench cases and training runs are jobs of a plan, run by one executor
interface into one store run, case by case, under one resume rule (RUN_RULE).

A plan (sweep.BenchPlan, tasks.driver.TrainPlan) names its units by case key, turns the units
still to do into executor jobs, and stores each outcome; `run_plan` does the rest for every plan:
which run to continue, what not to run again, progress, finishing the run, and Ctrl-C.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .errors import Interrupted, UsageError
from .executors import Executor, Job, LocalExecutor, Outcome
from .executors.progress import CaseProgress
from .interrupts import GRACE_S, stop_when_stuck
from .measure.env import Environment
from .measure.load import Load
from .measure.status import ERROR, OOM, STATUSES, TIMEOUT
from .store import ResultStore, StoreError

RUN_RULE = (
    "Each invocation writes one run of the store. A job (a bench case, a training run) is not "
    "run again when the run it continues holds it: --run-id ID continues run ID (or starts it "
    "under that name), --resume the latest run of the same jobs. A training run is also not "
    "trained again when any earlier run stored it (same model, same seed); a bench case is "
    "measured anew unless its run is continued (a time belongs to the machine's state now). "
    "A job stored as error, oom or timeout is run again; --force runs every job again; "
    "--dry-run prints the jobs that would run, and runs and writes nothing."
)
RETRIED = frozenset({ERROR, OOM, TIMEOUT})  # a failure that may not recur: run again
DONE = frozenset(STATUSES) - RETRIED  # what a job did is known: not run again


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    """Which run an invocation continues and what it runs again (RUN_RULE); the same flags on
    every command that runs jobs."""

    run_id: str | None = None  # continue (or name) this run
    resume: bool = False  # continue the latest run of the same jobs
    force: bool = False  # run every job again
    # --resume asked for by the user: no earlier run of the same jobs is an error, not a new run
    resume_required: bool = False
    dry_run: bool = False  # print what would run; run nothing, store nothing

    def __post_init__(self) -> None:
        if self.resume and self.run_id is not None:
            raise UsageError(
                "--resume and --run-id cannot be combined: --resume continues the latest run of "
                "the same jobs, --run-id the run it names"
            )
        if self.resume and self.force:
            raise UsageError(
                "--resume and --force cannot be combined: --resume runs only the missing jobs, "
                "--force every job again"
            )


class Stored(NamedTuple):
    """One unit a plan stored: its case key, what progress calls it, its status."""

    key: str
    label: str
    status: str


class Plan:
    """What `run_plan` runs: units named by case key, the executor jobs for those still to do,
    and how an outcome is stored. Subclasses set `kind` (the store run's kind), `desc` (the
    progress bar's name) and `reuse_stored` (RUN_RULE: True when a unit stored by any earlier
    run of the kind is as good as one run now)."""

    kind: str = ""
    desc: str = ""
    reuse_stored: bool = False

    def keys(self) -> list[str]:
        """Every unit's case key, in order."""
        raise NotImplementedError

    def jobs(self, todo: Sequence[str]) -> list[Job]:
        """Executor jobs running the units of `todo` that run (a job may run several units; its
        key is the first one's); units stored by `begin` have none."""
        raise NotImplementedError

    def save(self, store: ResultStore, run_id: str, outcome: Outcome) -> list[Stored]:
        """Store a finished job's units (a failed job: each as error, or oom)."""
        raise NotImplementedError

    def reused(self, keys: Sequence[str]) -> None:
        """Told which units are not run again (RUN_RULE), before anything runs."""

    def label(self, key: str) -> str:
        """What a dry run calls the unit `key`."""
        return key

    def begin(self, store: ResultStore, run_id: str, todo: set[str]) -> list[Stored]:
        """Store the units of `todo` known without running (e.g. a variant unavailable here).
        Called once the run is known, before any job runs."""
        return []


def fingerprint(keys: Iterable[str]) -> str:
    """Identity of a set of units (order-independent): --resume looks runs up by it."""
    return hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()[:16]


@dataclass
class RunResult:
    """What one `run_plan` call did."""

    run_id: str | None  # None: nothing to do and no run continued, so no run was started
    statuses: dict[str, str] = field(default_factory=dict)  # case key -> status, stored now
    skipped: list[str] = field(default_factory=list)  # keys not run again (RUN_RULE)
    total: int = 0
    load_end: Load | None = None  # the machine's load when the run finished (None: not now)


class RunInterrupted(Interrupted):
    """Ctrl-C while a plan ran: what finished is stored, the run marked interrupted."""

    def __init__(self, run_id: str, stored: int) -> None:
        super().__init__(f"interrupted: {stored} cases stored in run {run_id}")
        self.run_id, self.stored = run_id, stored  # the plan's units the run holds


def continued_run(
    store: ResultStore, kind: str, keys: Sequence[str], policy: RunPolicy
) -> str | None:
    """The run an invocation continues (RUN_RULE): --run-id's, or with --resume the latest run of
    the same jobs; None: a new run. A required resume with no such run is a UsageError (checked
    by commands before they start, and by run_plan)."""
    if not policy.resume:
        return policy.run_id
    run_id = store.latest_run(kind=kind, fingerprint=fingerprint(keys))
    if run_id is None and policy.resume_required:
        raise UsageError(
            f"--resume: {store.path} holds no earlier run of these {len(keys)} {kind} jobs to "
            "continue (a run of other jobs, e.g. another grid, is not one); drop --resume to "
            "start a new run, or continue a run by name with --run-id"
        )
    return run_id


# the settings that change what a stored time means: a run is continued only under its own
# (which metrics a case measures may differ: each is a row of its own)
SETTINGS_OF_A_RUN = ("threads", "clock", "cuda_graphs", "interleave")


def _check_same_settings(run: dict[str, Any], meta: dict[str, Any] | None) -> None:
    """Refuse to add cases to `run` measured under other settings than its own (UsageError)."""
    was = run["meta"].get("settings") or {}
    now = json.loads(json.dumps((meta or {}).get("settings") or {}))  # as the store keeps it
    differ = [
        f"{name} {was[name]!r}, now {now[name]!r}"
        for name in SETTINGS_OF_A_RUN
        if name in was and name in now and was[name] != now[name]
    ]
    if differ:
        raise UsageError(
            f"run {run['run_id']} was measured with other settings ({'; '.join(differ)}): cases "
            "added to it would not compare; continue it with its own settings, or start a new "
            "run (leave out --resume, or give another --run-id)"
        )


def run_plan(
    plan: Plan,
    store: ResultStore,
    *,
    policy: RunPolicy = RunPolicy(),
    executor: Executor | None = None,
    device: str = "cpu",
    environment: Environment | None = None,
    meta: dict[str, Any] | None = None,
    load_start: Load | None = None,
    progress: bool = True,
) -> RunResult:
    """Run `plan`'s units that RUN_RULE does not skip, through `executor` (default: this
    process; the caller closes it), storing each outcome as it finishes: only this process
    writes the store. The run is finished once every unit is stored; Ctrl-C marks it
    interrupted and raises RunInterrupted. policy.dry_run: print what would run, touch nothing."""
    executor = executor or LocalExecutor()
    keys = plan.keys()
    if not policy.dry_run:
        executor.prepare(plan.jobs(keys))  # a bad cluster fails here, before the store is touched
    identity = fingerprint(keys)
    run_id = continued_run(store, plan.kind, keys, policy)
    if (
        not policy.resume
        and run_id is not None
        and (run := store.run(run_id))
        and run["kind"] != plan.kind
    ):
        raise UsageError(
            f"--run-id {run_id}: that run holds {run['kind']} jobs, not {plan.kind} jobs; "
            "give another name, or leave --run-id out for a new run"
        )
    skip: set[str] = set()
    if not policy.force:
        if run_id is not None:
            skip |= store.held_cases(statuses=DONE, run_id=run_id)
        if plan.reuse_stored:
            skip |= store.held_cases(statuses=DONE, kind=plan.kind)
    todo = [k for k in keys if k not in skip]
    skipped = [k for k in keys if k in skip]
    if todo and run_id is not None and (run := store.run(run_id)) is not None:
        _check_same_settings(run, meta)
    plan.reused(skipped)
    if policy.dry_run:
        print(_preview(plan, todo, len(keys)))
        return RunResult(run_id=None, skipped=skipped, total=len(keys))
    if not todo and run_id is None:
        return RunResult(run_id=None, skipped=skipped, total=len(keys))
    run_id = store.start_run(
        kind=plan.kind,
        run_id=run_id,
        fingerprint=identity,
        device=device,
        environment=environment,
        meta={**(meta or {}), "executor": executor.name},
        load=load_start,
    )
    finished = store.run(run_id)["finished_at"] is not None
    result = RunResult(run_id=run_id, skipped=skipped, total=len(keys))
    bar = CaseProgress(len(keys), len(skipped), desc=plan.desc, enabled=progress)
    last_words = functools.partial(_stopped_inside_a_job, plan, store.path, run_id, keys)
    with stop_when_stuck(last_words) as taken:  # Ctrl-C inside one long operation, too
        try:
            known = plan.begin(store, run_id, set(todo))
            for unit in known:
                bar.finished(unit.status, unit.label)
            with closing(executor.run(plan.jobs(todo), on_start=bar.started)) as outcomes:
                for outcome in outcomes:  # in the order they finish
                    for unit in plan.save(store, run_id, outcome):
                        result.statuses[unit.key] = unit.status
                        bar.finished(unit.status, unit.label)
            bar.close()
            for unit in known:
                result.statuses[unit.key] = unit.status
            complete = set(todo) <= store.completed_cases(run_id)
            if complete and (todo or not finished):  # a finished run that ran nothing keeps it
                result.load_end = store.finish_run(run_id)  # Ctrl-C here: interrupted
        except KeyboardInterrupt:
            taken()
            store.mark_interrupted(run_id)
            raise RunInterrupted(run_id, _stored(store, run_id, keys)) from None
        except sqlite3.OperationalError as err:  # locked past its timeout, a full disk
            raise StoreError(_unwritable(store, run_id, keys, err)) from None
        finally:
            bar.close()
    return result


def _preview(plan: Plan, todo: Sequence[str], total: int) -> str:
    """A dry run's account: how many of the plan's units are still to do (run, or stored as
    unavailable), then each by name."""
    held = total - len(todo)
    head = f"dry run, {plan.desc}: {len(todo)} of {total} to do" + (
        f" ({held} already stored)" if held else ""
    )
    return "\n".join([head, *(f"  {plan.label(key)}" for key in todo)])


def _stored(store: ResultStore, run_id: str, keys: Sequence[str]) -> int:
    """How many of this run's cases `keys` the store holds as done: what a stopped run kept."""
    return len(store.completed_cases(run_id) & set(keys))


def _stopped_inside_a_job(plan: Plan, path: Path, run_id: str, keys: Sequence[str]) -> str:
    """Ctrl-C that a job stuck in one long operation did not take: the run marked interrupted
    (from the watcher thread, on a connection of its own); the line that says so."""
    with ResultStore(path) as store:
        store.mark_interrupted(run_id)
        stored = _stored(store, run_id, keys)
    return (
        f"zoo {plan.desc}: interrupted inside a job that did not stop within {GRACE_S:g} s (one "
        f"long operation; it was ended): {stored} of {len(keys)} cases are stored in run {run_id} "
        f"(marked interrupted); rerun the same command with --resume (or --run-id {run_id}) to "
        "run only the missing ones"
    )


def _unwritable(store: ResultStore, run_id: str, keys: Sequence[str], err: Exception) -> str:
    """The line a run stopped by a write the store refused says: what is kept, how to go on."""
    try:
        stored = f"{_stored(store, run_id, keys)} of {len(keys)}"
    except sqlite3.Error:  # not readable either, now
        stored = f"the finished ones of the {len(keys)}"
    return (
        f"writing {store.path} failed (SQLite says: {err}); {stored} cases are "
        f"stored in run {run_id}; once the store can be written, rerun the same command with "
        f"--resume (or --run-id {run_id}) to run only the missing ones"
    )


def failed_status(outcome: Outcome) -> str:
    """The status of a job that failed outside its own error handling (its worker died)."""
    return OOM if outcome.oom else ERROR
