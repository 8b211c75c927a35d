"""The processes executor: jobs side by side in worker processes on this machine (`--workers N`),
for work whose results do not depend on what else runs: training runs (steps and accuracies;
their wall time is information only). Timed jobs (bench cases) run after them one at a time, in
one worker, since jobs sharing cores or a GPU distort each other's timings.

Workers start by spawning (not forking a process that holds threads; about as long as importing
torch) and load the driver's plugins before they read a job. A worker that dies (killed, out of
memory) takes its pool down: the jobs that had not started run again in a fresh pool, and those
that had started run again alone, one at a time, so that the next death is charged to its own
job; each job runs at most 1 + MAX_RETRIES times.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from ..measure.runner import describe_error
from .base import (
    MAX_RETRIES,
    ExecutorBase,
    Job,
    Outcome,
    plugin_targets,
    retries_text,
    run_pickled,
)


def default_workers(threads: int | None) -> int:
    """As many workers as this machine's cores hold at `threads` torch threads each."""
    return max(1, (os.cpu_count() or 1) // max(1, threads or 1))


PARENT_POLL_S = 1.0  # how often a worker checks that the process that started it still runs


def _start_worker(threads: int, parent: int) -> None:
    """A worker's torch threads (a job that names its own sets them again), and a watch that ends
    it when its parent is gone (killed without the chance to end its pool: SIGTERM, SIGKILL)."""
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    """End this process once `parent` is no longer its parent (orphans are re-parented)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _work(marker: str, payload: bytes, **job: object) -> Outcome:
    """A job in a worker: it marks that it started (a pool that breaks charges only the jobs
    that had), then runs."""
    Path(marker).touch()
    return run_pickled(payload, **job)  # type: ignore[arg-type]


class PoolExecutor(ExecutorBase):
    """Runs jobs in `workers` processes of this machine, yielding outcomes as they finish."""

    name = "processes"

    def __init__(self, *, workers: int | None = None, max_retries: int = MAX_RETRIES) -> None:
        self.workers = workers
        self.max_retries = max_retries

    def _count(self, jobs: Sequence[Job]) -> int:
        threads = max((j.threads or 1 for j in jobs), default=1)
        return max(1, min(self.workers or default_workers(threads), len(jobs)))

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Nothing to connect to."""

    def run(
        self, jobs: Sequence[Job], *, on_start: Callable[[Job], None] | None = None
    ) -> Iterator[Outcome]:
        """Yield each job's outcome as it finishes: the untimed jobs side by side, then the
        timed ones one at a time. Stopping early (Ctrl-C, an error while storing) ends the
        workers and the jobs they were running."""
        side_by_side = [j for j in jobs if not j.timed]
        yield from self._pooled(side_by_side, self._count(side_by_side))
        yield from self._pooled([j for j in jobs if j.timed], 1)

    def _pooled(self, jobs: Sequence[Job], workers: int) -> Iterator[Outcome]:
        plugins = plugin_targets()
        payloads: dict[str, bytes] = {}
        todo: list[Job] = []
        for job in jobs:
            try:  # what cannot be sent to a worker is this job's error, not the sweep's
                payloads[job.key] = pickle.dumps((job.fn, job.args, job.kwargs))
                todo.append(job)
            except Exception as exc:
                yield Outcome(key=job.key, error=f"cannot go to a worker: {describe_error(exc)}")
        tries = {job.key: 0 for job in todo}
        suspects: list[Job] = []  # started when a pool broke: run again alone
        while todo or suspects:
            if suspects:
                batch = [suspects.pop(0)]
            else:
                batch, todo = todo, []
            broken: list[tuple[Job, bool]] = []  # (job, whether it had started)
            yield from self._round(batch, min(workers, len(batch)), plugins, payloads, broken)
            if not any(started for _, started in broken):  # a pool that never ran a job died:
                broken = [(job, True) for job, _ in broken]  # each of them pays, no endless loop
            for job, started in broken:
                if not started:
                    todo.append(job)
                    continue
                tries[job.key] += 1
                if tries[job.key] > self.max_retries:
                    yield self._died(job)
                else:
                    suspects.append(job)

    def _round(
        self,
        jobs: Sequence[Job],
        workers: int,
        plugins: Sequence[str],
        payloads: dict[str, bytes],
        broken: list[tuple[Job, bool]],
    ) -> Iterator[Outcome]:
        """One pool over `jobs`: their outcomes, and in `broken` those a dying worker took."""
        threads = max(1, (os.cpu_count() or 1) // workers)
        with tempfile.TemporaryDirectory(prefix="zoo-pool-") as marks:
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(threads, os.getpid()),
            )
            try:
                futures: dict[Future[Outcome], tuple[Job, Path]] = {}
                for i, job in enumerate(jobs):
                    marker = Path(marks) / str(i)
                    future = pool.submit(
                        _work, str(marker), payloads[job.key], key=job.key, device=job.device,
                        threads=job.threads, plugins=plugins,
                    )  # fmt: skip
                    futures[future] = (job, marker)
                for future in as_completed(futures):
                    job, marker = futures[future]
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        broken.append((job, marker.exists()))
                        continue
                    except Exception as exc:  # e.g. a result that cannot come back
                        outcome = Outcome(key=job.key, error=describe_error(exc))
                    yield outcome
            finally:
                _end(pool)

    def _died(self, job: Job) -> Outcome:
        return Outcome(
            key=job.key,
            error=(
                "its worker process died (killed, or out of memory) while it ran, "
                f"{retries_text(self.max_retries)} too"
            ),
        )

    def describe(self) -> str:
        if self.workers is None:
            return "processes (one worker per core of this machine, or per --threads cores)"
        return f"processes ({self.workers} worker{'s' if self.workers != 1 else ''} here)"


def _end(pool: ProcessPoolExecutor) -> None:
    """Stop `pool` now: pending jobs cancelled, running ones ended with their workers (shutdown
    alone would wait for each running job to finish)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()
