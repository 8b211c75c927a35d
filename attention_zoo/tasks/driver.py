"""Train a task preset's runs as jobs of the run engine (engine.run_plan): this process, or one Ray
task per run. This process stores each run as it finishes, so an interrupted invocation loses only
the runs in flight and the next one trains only what is missing (engine.RUN_RULE)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..engine import Plan, RunInterrupted, RunPolicy, Stored, failed_status, run_plan
from ..errors import Interrupted
from ..executors import Executor, Job, LocalExecutor, Outcome
from ..measure.cases import case_key
from ..measure.runner import MeasureSettings
from ..measure.status import OK, SKIPPED
from ..progress import progress
from ..store import ResultStore, open_store, preview_store
from ..sweep import run_sweep
from .cost import cost_cases
from .results import KIND, case_config, save_failed, save_trained
from .runner import RunOutcome, RunSpec, Skipped, identity, outcome_rows, plan_runs, train_job
from .runner import skipped_key as skipped_spec_key
from .suite import TaskPreset, load_task_preset


def run_key(spec: RunSpec) -> str:
    """The store's case key of a training run."""
    return case_key(case_config(identity(spec.preset, spec.variant.label, spec.seed), spec.key()))


def skipped_key(preset: TaskPreset, label: str, seed: int) -> str:
    """The store's case key of a grid entry that cannot run here."""
    return case_key(
        case_config(identity(preset, label, seed), skipped_spec_key(preset, label, seed))
    )


class StepProgress:
    """A bar over one run's training steps, as an on_step callback; opened at the first step
    (so only a run that is training shows one), closed when the run is stored."""

    def __init__(self, desc: str, total: int, *, enabled: bool) -> None:
        self.desc, self.total, self.enabled = desc, total, enabled
        self.bar: Any = None
        self.acc = float("nan")

    def __call__(self, step: int, info: dict[str, float]) -> None:
        if self.bar is None:  # a tqdm bar on a terminal, a plain line now and then in a log
            self.bar = progress(
                self.total, desc=self.desc, unit="steps", enabled=self.enabled, leave=False
            )
        self.acc = info.get("accuracy", self.acc)
        self.bar.update(step - self.bar.n)
        if step % 10 == 0 or "accuracy" in info:
            self.bar.set_postfix(
                loss=f"{info['loss']:.3f}", acc=f"{100 * self.acc:.1f}%", refresh=False
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


Say = Callable[[str], None]  # where a task's lines go (the CLI prints them)


def print_line(line: str) -> None:
    """The default Say: each line printed as it happens (a log shows it before the next run)."""
    print(line, flush=True)


class TrainPlan(Plan):
    """Training runs as engine units (one job each), and the grid entries that cannot run here
    (stored as skipped, with the reason, without a job)."""

    kind = KIND
    desc = "task"
    reuse_stored = True  # the same spec and seed train the same model (engine.RUN_RULE)

    def __init__(
        self,
        preset: TaskPreset,
        runs: Sequence[RunSpec],
        skipped: Sequence[Skipped] = (),
        *,
        seeds: Sequence[int] = (),
        device: str = "cpu",
        threads: int | None = None,
        progress: bool = True,
        say: Say | None = None,
    ) -> None:
        self.preset, self.device, self.threads = preset, device, threads
        self.progress, self.say = progress, say or (lambda line: None)
        self.runs = {run_key(spec): spec for spec in runs}
        self.unavailable = {
            skipped_key(preset, s.label, seed): (s, seed) for s in skipped for seed in seeds
        }
        self.steps: dict[str, StepProgress] = {}
        self.todo_runs = 0  # training runs this invocation has to do
        self.finished = 0  # ... and has stored

    def keys(self) -> list[str]:
        return [*self.runs, *self.unavailable]

    def reused(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key in self.runs:
                self.say(f"{self.label(key)}: already in the store (use --force to train again)")

    def label(self, key: str) -> str:
        if spec := self.runs.get(key):
            return f"{spec.variant.label} seed {spec.seed}"
        skipped, seed = self.unavailable[key]
        return f"{skipped.label} seed {seed}: stored as skipped, not run ({skipped.reason})"

    def jobs(self, todo: Sequence[str]) -> list[Job]:
        out = []
        for key in todo:
            if (spec := self.runs.get(key)) is None:
                continue
            label = self.label(key)
            steps = StepProgress(label, spec.preset.train.max_steps, enabled=self.progress)
            self.steps[key] = steps
            out.append(
                Job(
                    key=key,
                    label=label,
                    fn=train_job,
                    args=(spec,),
                    kwargs={"device": self.device, "threads": self.threads},
                    local_kwargs={"on_step": steps},
                    device=self.device,
                    threads=self.threads,
                    timed=False,  # steps and accuracies: wall time is information only
                )
            )
        self.todo_runs = len(out)
        return out

    def begin(self, store: ResultStore, run_id: str, todo: set[str]) -> list[Stored]:
        out = []
        for key, (entry, seed) in self.unavailable.items():
            if key in todo:
                ident = identity(self.preset, entry.label, seed)
                spec_key = skipped_spec_key(self.preset, entry.label, seed)
                save_failed(store, run_id, ident, spec_key, status=SKIPPED, error=entry.reason)
                out.append(Stored(key, f"{entry.label} seed {seed}", SKIPPED))
        return out

    def save(self, store: ResultStore, run_id: str, outcome: Outcome) -> list[Stored]:
        spec = self.runs[outcome.key]
        self.steps.pop(outcome.key).close()
        if outcome.ok:
            run = outcome.value
            curves = {"loss": run.result.loss_curve, "eval_accuracy": run.result.eval_curve}
            save_trained(
                store,
                run_id,
                spec.key(),
                outcome_rows(run),
                curves,
                environment=outcome.environment,
            )
            status, text = OK, summary(run)
        else:
            status = failed_status(outcome)
            save_failed(
                store,
                run_id,
                identity(spec.preset, spec.variant.label, spec.seed),
                spec.key(),
                status=status,
                error=outcome.error or "",
                environment=outcome.environment,
            )
            text = f"{status} (stored): {outcome.error}"
        self.finished += 1
        label = self.label(outcome.key)
        self.say(f"[{self.finished}/{self.todo_runs}] {label}: {text}")
        return [Stored(outcome.key, label, status)]


@dataclass(frozen=True, kw_only=True)
class TaskRequest:
    """One `zoo task RUN_SPEC` invocation's training: a suite (file or task name), its preset, and
    the grid fields overridden (None: the preset's)."""

    run_spec: str  # a suite file (.toml) or a task name
    preset: str = "cpu"
    backends: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    train_hashes: tuple[int, ...] | None = None
    eval_hashes: tuple[int, ...] | None = None
    max_steps: int | None = None
    device: str = "cpu"
    threads: int | None = None  # torch threads of each training (None: torch's choice)
    cost: bool = False  # also measure one training step of each model (bench rows)


def train_task(
    request: TaskRequest,
    store: ResultStore | str | Path | None,
    *,
    preset: TaskPreset | None = None,
    executor: Executor | None = None,
    policy: RunPolicy | None = None,
    progress: bool = True,
    say: Say = print_line,
    meta: dict[str, Any] | None = None,
) -> TaskPreset:
    """Train (and evaluate) a task preset's runs into `store` under `policy` (engine.RUN_RULE),
    telling `say` what happens line by line; returns the preset. Ctrl-C: what finished is
    stored, Interrupted says how many and how to go on. The caller holds the executor open.

    store: an open store, or a path (None: the default) opened for writing once the suite,
    preset and grid are known to be good, so bad input leaves no store behind (a dry run's
    policy: read, store.preview_store).
    preset: one built in code (a reproduction's sweep point), trained in place of the suite's.
    """
    if preset is None:
        preset = load_task_preset(request.run_spec, request.preset)
    if request.max_steps:
        preset = dataclasses.replace(
            preset, train=dataclasses.replace(preset.train, max_steps=request.max_steps)
        )
    runs, skipped = plan_runs(
        preset,
        backends=request.backends,
        seeds=request.seeds,
        train_hashes=request.train_hashes,
        eval_hashes=request.eval_hashes,
        device=request.device,
    )
    dry_run = bool(policy and policy.dry_run)
    with (
        nullcontext(store)
        if isinstance(store, ResultStore)
        else preview_store(store)
        if dry_run
        else open_store(store, write=True, resume=bool(policy and policy.resume_required)) as db
    ):
        return _train(
            preset,
            runs,
            skipped,
            request,
            db,
            executor or LocalExecutor(),
            policy,
            progress,
            say,
            meta,
        )


def _train(
    preset: TaskPreset,
    runs: list[RunSpec],
    skipped: list[Skipped],
    request: TaskRequest,
    store: ResultStore,
    executor: Executor,
    policy: RunPolicy | None,
    progress: bool,
    say: Say,
    meta: dict[str, Any] | None,
) -> TaskPreset:
    """train_task once its input is checked and its store open."""
    say(f"{preset.task.name} / preset {preset.name}: {preset.description}")
    dry_run = bool(policy and policy.dry_run)
    where = executor.name if dry_run else executor.describe()  # describe() connects a cluster
    say(
        f"{preset.task}; threads {request.threads or torch.get_num_threads()}; store "
        f"{store.path}; executor {where}"
    )
    for s in skipped:
        say(f"skipped {s.label}: {s.reason}")
    plan = TrainPlan(
        preset,
        runs,
        skipped,
        seeds=request.seeds if request.seeds is not None else preset.grid.seeds,
        device=request.device,
        threads=request.threads,
        progress=progress,
        say=say,
    )
    meta = {"suite": preset.suite, "preset": preset.name, **(meta or {})}
    try:
        run_plan(
            plan,
            store,
            policy=policy or RunPolicy(),
            executor=executor,
            device=request.device,
            meta=meta,
            progress=progress,
        )
    except RunInterrupted:
        raise Interrupted(
            f"interrupted: {plan.finished} of {plan.todo_runs} training run(s) finished and "
            f"stored in {store.path} (run marked interrupted); rerun the same command to train "
            "only the missing ones"
            if plan.finished
            else "interrupted before any training run finished; nothing new was stored"
        ) from None
    if request.cost and runs:
        cases = cost_cases(runs, device=request.device)
        settings = MeasureSettings(metrics=("time", "memory"), threads=torch.get_num_threads())
        doing = "would measure" if dry_run else "measuring"
        say(f"{doing} the training-step cost of {len(cases)} model(s)")
        run_sweep(
            cases,
            store,
            settings=settings,
            policy=RunPolicy(dry_run=dry_run),
            progress=progress,
            meta=meta,
            executor=executor,
        )
    return preset


def summary(outcome: RunOutcome) -> str:
    """One line on a finished run: when it reached its target (on the evaluation set), its
    accuracy on the held-out test set and each evaluation's."""
    r = outcome.result
    target = round(outcome.spec.preset.train.target_accuracy * 100)
    reached = (
        f"{target}% at step {r.steps_to_target}" if r.steps_to_target else f"{target}% not reached"
    )
    evals = ", ".join(f"{k} {100 * v.accuracy:.1f}%" for k, v in outcome.evals.items())
    text = (
        f"{reached}; test set {100 * outcome.test.accuracy:.1f}% after {r.steps} steps "
        f"({r.wall_time_s:.0f} s)"
    )
    return text + (f"; eval {evals}" if evals else "")
