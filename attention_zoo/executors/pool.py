"""The processes executor: jobs side by side in worker processes on this machine (`--workers N`),
for work whose results do not depend on what else runs: training runs (steps and accuracies;
their wall time is information only). Timed jobs (bench cases) run one at a time after them, in
a worker of their own, since jobs sharing cores or a GPU distort each other's timings.

Workers start by spawning (not forking a process that holds threads) and load the driver's
plugins; a worker that dies (killed, out of memory) takes its pool with it, so the jobs that had
not finished run again in a fresh pool, each at most 1 + MAX_RETRIES times.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

import torch

from .base import MAX_RETRIES, ExecutorBase, Job, Outcome, plugin_targets, retries_text, run_job


def default_workers(threads: int | None) -> int:
    """As many workers as this machine's cores hold at `threads` torch threads each."""
    return max(1, (os.cpu_count() or 1) // max(1, threads or 1))


def _start_worker(threads: int) -> None:
    """A worker's torch threads (a job that names its own sets them again)."""
    torch.set_num_threads(threads)


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
        threads = max(1, (os.cpu_count() or 1) // workers)
        tries = {job.key: 0 for job in jobs}
        todo = list(jobs)
        while todo:
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(threads,),
            )
            try:
                futures: dict[Future[Outcome], Job] = {
                    pool.submit(
                        run_job, job.fn, job.args, job.kwargs, key=job.key, device=job.device,
                        threads=job.threads, plugins=plugins,
                    ): job
                    for job in todo
                }  # fmt: skip
                todo = []
                for future in as_completed(futures):
                    job = futures[future]
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        tries[job.key] += 1
                        if tries[job.key] <= self.max_retries:
                            todo.append(job)
                            continue
                        outcome = self._died(job)
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
