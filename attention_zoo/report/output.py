"""Write a report folder whole or not at all: built in a temporary folder beside the target and
swapped in only when complete, so a failed write (a full disk, a file-size limit) leaves the
previous report as it was and names what could not be written."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import ZooError


class ReportWriteError(ZooError):
    """The report could not be written; the previous one is unchanged."""


@contextmanager
def staged_folder(target: Path, *, regenerated: Sequence[str] = ()) -> Iterator[Path]:
    """A new empty folder beside `target` to build into; on a clean exit it replaces `target`.

    Files of the old folder that the build did not write are carried over, except those
    matching `regenerated` (glob patterns of files a build writes only when it has something to
    show, such as plots). Any OSError becomes a ReportWriteError naming the file and target."""
    target = Path(target)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    except OSError as err:
        raise ReportWriteError(
            f"cannot write the report beside {target}: {err.strerror or err}"
        ) from None
    try:
        try:
            yield stage
            if target.is_dir():
                _carry_over(target, stage, regenerated)
            _swap(stage, target)
        except OSError as err:
            raise _write_error(err, stage, target) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def writing(path: Path) -> Iterator[Path]:
    """Name `path` in an OSError raised while it is written (a failed write() names no file)."""
    try:
        yield path
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


def _carry_over(old: Path, new: Path, regenerated: Sequence[str]) -> None:
    dropped = {p.name for pattern in regenerated for p in old.glob(pattern)}
    for entry in old.iterdir():
        if entry.name in dropped or (new / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


def _swap(stage: Path, target: Path) -> None:
    """Rename `stage` to `target`; an old `target` is moved aside first and removed after."""
    if not target.exists():
        os.rename(stage, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / target.name)
    try:
        os.rename(stage, target)
    except OSError:
        os.rename(old / target.name, target)  # put the previous report back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _write_error(err: OSError, stage: Path, target: Path) -> ReportWriteError:
    name = ""
    if err.filename:
        path = Path(os.fsdecode(err.filename))
        name = str(target / path.relative_to(stage)) if path.is_relative_to(stage) else str(path)
    reason = err.strerror or os.strerror(err.errno or errno.EIO)
    where = f"{name}: {reason}" if name else f"{reason} (in {target})"
    return ReportWriteError(
        f"cannot write the report: {where}; the previous report in {target} is unchanged"
        if target.exists()
        else f"cannot write the report: {where}; nothing was written to {target}"
    )


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it: all of it, or the old file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        reason = err.strerror or str(err)
        raise ReportWriteError(f"cannot write {path}: {reason}; the old one is unchanged") from None
