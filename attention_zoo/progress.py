"""Progress of long commands: a tqdm bar on a terminal; in a log (stderr not a terminal) a plain
line at most every `every_s` seconds instead of a flood of carriage returns."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm


def progress(
    total: int,
    *,
    desc: str,
    unit: str = "it",
    initial: int = 0,
    enabled: bool = True,
    leave: bool = True,
    stream: TextIO | None = None,
    every_s: float = 30.0,
) -> Any:
    """A tqdm-like bar (update, set_postfix_str, set_postfix, close, n) suited to `stream`."""
    stream = stream or sys.stderr
    if not enabled:
        return tqdm(total=total, disable=True)
    counting = {"total": total, "initial": initial, "desc": desc, "unit": unit}
    if _is_terminal(stream):
        return tqdm(**counting, leave=leave, file=stream, dynamic_ncols=True)
    return PlainProgress(**counting, stream=stream, every_s=every_s)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PlainProgress:
    """Progress as whole lines ('bench: 3/10 cases, 41 s (attention full ...)'), rate-limited."""

    def __init__(
        self, *, total: int, desc: str, unit: str, initial: int, stream: TextIO, every_s: float
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.stream, self.every_s = stream, every_s
        self.start = self.last = time.monotonic()
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            tail = f" ({self.postfix})" if self.postfix else ""
            print(
                f"{self.desc}: {self.n}/{self.total} {self.unit}, {now - self.start:.0f} s{tail}",
                file=self.stream,
                flush=True,
            )

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        pass
