"""Train a plan's runs through an executor (this process, or one Ray task per run). This process
stores each run as it finishes, so an interrupted invocation loses only the runs in flight and the
next one trains only what is missing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

from ..executors import Executor, Job, Outcome
from ..executors.progress import CaseProgress
from ..measure.cases import case_key
from ..measure.status import ERROR, OK, OOM
from ..progress import progress
from .results import TaskResults, case_config
from .runner import RunSpec, identity, outcome_rows, train_job


def run_key(spec: RunSpec) -> str:
    """The store's case key of a training run."""
    return case_key(case_config(identity(spec.preset, spec.variant.label, spec.seed), spec.key()))


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


def train_runs(
    runs: Sequence[RunSpec],
    results: TaskResults,
    executor: Executor,
    *,
    device: str = "cpu",
    threads: int | None = None,
    progress: bool = True,
    on_done: Callable[[RunSpec, Outcome], None] | None = None,
) -> None:
    """Train `runs` with `executor`, storing each as it finishes: its rows and curves with the
    environment of the process that trained it, or its failure (error/oom) with the reason."""
    if not runs:
        return
    jobs, by_key = [], {}
    for spec in runs:
        label = f"{spec.variant.label} seed {spec.seed}"
        steps = StepProgress(label, spec.preset.train.max_steps, enabled=progress)
        job = Job(
            key=run_key(spec),
            label=label,
            fn=train_job,
            args=(spec,),
            kwargs={"device": device, "threads": threads},
            local_kwargs={"on_step": steps},
            device=device,
            threads=threads,
        )
        jobs.append(job)
        by_key[job.key] = (spec, steps)
    executor.prepare(jobs)
    bar = CaseProgress(len(jobs), 0, desc="task", enabled=progress)
    try:
        with closing(executor.run(jobs, on_start=bar.started)) as outcomes:
            for outcome in outcomes:  # in the order they finish
                spec, steps = by_key[outcome.key]
                steps.close()
                status = _store(spec, outcome, results)
                bar.finished(status, f"{spec.variant.label} seed {spec.seed}")
                if on_done is not None:
                    on_done(spec, outcome)
    finally:
        bar.close()


def _store(spec: RunSpec, outcome: Outcome, results: TaskResults) -> str:
    if outcome.ok:
        run = outcome.value
        curves = {"loss": run.result.loss_curve, "eval_accuracy": run.result.eval_curve}
        results.save(spec.key(), outcome_rows(run), curves, environment=outcome.environment)
        return OK
    status = OOM if outcome.oom else ERROR
    results.save_failed(
        identity(spec.preset, spec.variant.label, spec.seed),
        spec.key(),
        status=status,
        error=outcome.error or "",
        environment=outcome.environment,
    )
    return status
