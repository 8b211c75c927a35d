"""Checks on paths a user gives: a folder that must already exist, named with what would work."""

from __future__ import annotations

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
