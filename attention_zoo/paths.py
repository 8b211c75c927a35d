"""Paths a user gives: a folder that must already exist, named with what would work; and how a
recorded command names its results store so that a published report shows no machine's folders."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import UsageError, did_you_mean


def require_folder(folder: Path, what: str) -> None:
    """UsageError unless `folder` exists ('' is the current folder), with a close sibling's name
    when the path looks mistyped."""
    folder = folder if str(folder) else Path(".")
    if folder.is_dir():
        return
    parent = folder.parent if folder.parent.is_dir() else None
    siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent else []
    raise UsageError(
        f"{what}: folder {folder} does not exist; create it first or fix the path"
        + did_you_mean(folder.name, siblings)
    )


def require_writable(folder: Path, what: str) -> None:
    """UsageError unless a file can be created in `folder`: a nameless temporary file is made and
    dropped (os.access says yes to root, even where it cannot)."""
    try:
        with tempfile.TemporaryFile(dir=folder if str(folder) else "."):
            pass
    except OSError as err:
        raise UsageError(
            f"{what}: cannot write in {folder} ({err.strerror}); give a path in a folder you can "
            "write"
        ) from None


STORE_FLAGS = ("--store",)  # flags whose value is a results store


def portable_words(words: Sequence[str]) -> list[str]:
    """Command words with each store given by an absolute path (a folder of the machine that ran
    it, outside the folder it ran in) named by its file name: what a reader can type again."""
    out: list[str] = []
    for word in words:
        flag, eq, value = word.partition("=")
        if out and out[-1] in STORE_FLAGS and os.path.isabs(word):
            word = Path(word).name
        elif eq and flag in STORE_FLAGS and os.path.isabs(value):
            word = f"{flag}={Path(value).name}"
        out.append(word)
    return out


def portable_command(command: str) -> str:
    """A recorded command line with portable_words' stores (unchanged if it cannot be split)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    portable = portable_words(words)
    return command if portable == words else shlex.join(portable)
