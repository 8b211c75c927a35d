"""The driver's progress over a sweep's cases, whichever executor runs them: finished of total with
an ETA, how many failed (error, oom or invalid), and the case running (local) or last finished
(ray)."""

from __future__ import annotations

from typing import Any

from ..measure.status import ERROR, INVALID, OOM
from ..progress import progress
from .base import Job

FAILED = (ERROR, OOM, INVALID)


class CaseProgress:
    """A bar over cases (plain lines when stderr is not a terminal); a no-op when disabled."""

    def __init__(self, total: int, initial: int, *, desc: str, enabled: bool) -> None:
        # a tqdm bar on a terminal, a plain line now and then in a log
        self.bar: Any = progress(total, initial=initial, unit="cases", desc=desc, enabled=enabled)
        self.failed = 0
        self.current = ""

    def started(self, job: Job) -> None:
        """A job starts in this process (local executor): show which."""
        self.current = job.label
        self._postfix()

    def finished(self, status: str, label: str = "") -> None:
        """One case stored with `status`."""
        self.failed += status in FAILED
        if label:
            self.current = f"done {label}"
        self.bar.update(1)
        self._postfix()

    def _postfix(self) -> None:
        left = self.bar.total - self.bar.n
        parts = [f"{self.failed} failed"] if self.failed else []
        parts += [f"{left} left"] if left else []
        parts += [self.current] if self.current else []
        self.bar.set_postfix_str(", ".join(parts), refresh=True)

    def close(self) -> None:
        self.bar.close()
