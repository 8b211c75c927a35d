"""How a command line is recorded with what it produced (a run's metadata, a report's report.json,
the reports index): as a shell takes it back, each word quoted, paths under the folder it ran in
made relative to it, a store elsewhere by its file name (no machine's folders in a published
report), and an `--import` for every plugin module it loaded that its words do not name
(ZOO_IMPORT), so the command runs again as it is written."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from ..paths import portable_words
from ..plugins import ENV_VAR, split_targets


def recorded_command(words: Sequence[str], *, cwd: str | Path | None = None) -> str:
    """`zoo WORDS` quoted, with paths under `cwd` (default: the current folder) relative to it,
    a store outside it by its file name, and `--import` for each ZOO_IMPORT module the words
    leave out."""
    here = Path(cwd or os.getcwd()).resolve()
    out = ["zoo", *portable_words([_relative(w, here) for w in words])]
    named = {_relative(w, here) for w in words}
    for target in split_targets(os.environ.get(ENV_VAR, "")):
        target = _relative(target, here)
        if target not in named:
            out += ["--import", target]
    return shlex.join(out)


def _relative(word: str, here: Path) -> str:
    """An absolute path under `here` (alone, or as the value of --flag=PATH) made relative."""
    flag, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
    if not os.path.isabs(value):
        return word
    path = Path(value).resolve()
    if path != here and here not in path.parents:
        return word
    return f"{flag}{eq}{path.relative_to(here)}"
