"""The default executor: every job in this process, one after another (a bench case may still
start its own subprocess: `--isolate`). Nothing to install."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from .base import ExecutorBase, Job, Outcome, run_job


class LocalExecutor(ExecutorBase):
    """Runs each job in the driver's process, in order."""

    name = "local"

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Nothing to connect to."""

    def run(
        self, jobs: Sequence[Job], *, on_start: Callable[[Job], None] | None = None
    ) -> Iterator[Outcome]:
        for job in jobs:
            if on_start is not None:
                on_start(job)
            yield run_job(
                job.fn,
                job.args,
                {**job.kwargs, **job.local_kwargs},
                key=job.key,
                device=job.device,
                threads=job.threads,
            )

    def describe(self) -> str:
        return "local (this process)"
