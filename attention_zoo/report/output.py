"""Write a report folder whole or not at all, and only where it owns the files: built in a
temporary folder beside the target and swapped in only when complete, so a failed write (a full
disk, a file-size limit) leaves the previous report as it was and names what could not be written.

The target is a new folder, an empty one, or one a previous `zoo report` wrote (its report.json,
META_FILE, says so); any other folder is refused, never emptied. One writer at a time: a second
`zoo report` into the same folder is refused while the first runs. Folders and files get the
modes the user's umask gives (a folder replaced keeps its mode).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ZooError

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows: no advisory locks; one writer is the user's care)
    fcntl = None  # type: ignore[assignment]

META_FILE = "report.json"  # what produced a report folder: its marker, read by the reports index
GENERATOR = "zoo report"  # report.json's "generator" (older folders: their command starts so)


class ReportWriteError(ZooError):
    """The report could not be written; the previous one is unchanged."""


def report_meta(folder: Path) -> dict[str, Any] | None:
    """report.json of a folder `zoo report` wrote (its generator says so), else None."""
    try:
        meta = json.loads((Path(folder) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    ours = meta.get("generator") == GENERATOR or str(meta.get("command", "")).startswith(GENERATOR)
    return meta if ours else None


def check_report_target(target: Path, what: str = "") -> None:
    """ReportWriteError unless a report may be written to `target`: a new folder, an empty one or
    one zoo report wrote, that is neither the current folder, one above it, nor a mount point
    (the build replaces the folder whole). what: how messages name it (default: the path)."""
    target = Path(target)
    what = what or str(target)
    here, resolved = Path.cwd().resolve(), target.resolve()
    where = (
        "the current folder or one above it"
        if resolved == here or resolved in here.parents
        else "a mount point"
        if os.path.ismount(resolved)
        else ""
    )
    if where:
        raise ReportWriteError(
            f"{what} is {where}: a report replaces its folder whole, so it needs a folder of "
            f"its own, e.g. {target / 'report'}; nothing was written"
        )
    if not target.is_dir():
        return
    entries = sorted(p.name for p in target.iterdir())
    if entries and report_meta(target) is None:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ReportWriteError(
            f"{what} holds files zoo report did not write ({shown}; no {META_FILE} of a "
            "report): nothing was changed; give a new or empty folder, or one zoo report wrote"
        )


@contextmanager
def staged_folder(target: Path, *, regenerated: Sequence[str] = ()) -> Iterator[Path]:
    """A new empty folder beside `target` to build into; on a clean exit it replaces `target`
    (check_report_target: refused where it may not).

    Files of the old folder that the build did not write are carried over, except those
    matching `regenerated` (glob patterns of files a build writes only when it has something to
    show, such as plots). Any OSError becomes a ReportWriteError naming the file and target."""
    target = Path(target)
    if target.is_symlink():  # the folder it names is replaced, the link kept
        target = target.resolve()
    with _one_writer(target):
        _tidy_after_a_killed_writer(target)
        check_report_target(target)
        mode = stat.S_IMODE(target.stat().st_mode) if target.is_dir() else _default_mode(0o777)
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
                os.chmod(stage, mode)
                _swap(stage, target)
            except OSError as err:
                raise _write_error(err, stage, target) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _one_writer(target: Path) -> Iterator[None]:
    """Hold an exclusive lock named after `target` beside it (removed after); ReportWriteError
    while another process holds it. A lock file removed by its holder while this one waited to
    lock it is not the lock any more: it is opened again."""
    if fcntl is None:
        yield
        return
    lock = target.parent / f".{target.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise ReportWriteError(
                f"cannot write the report beside {target}: {err.strerror or err}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ReportWriteError(
                f"another zoo report is writing {target} now; nothing was written: run this "
                "again when it has finished, or give another folder"
            ) from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        finally:
            os.close(fd)


def _default_mode(full: int) -> int:
    """`full` (0o777 for a folder, 0o666 for a file) less this process's umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return full & ~umask


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
    """The old folder's files that the new build did not write, copied into it, but for the old
    build's own files matching `regenerated` (by its report.json's list; a folder without one:
    every match)."""
    built = (report_meta(old) or {}).get("files")
    dropped = {
        p.name
        for pattern in regenerated
        for p in old.glob(pattern)
        if not isinstance(built, list) or p.name in built
    }
    for entry in old.iterdir():
        if entry.name in dropped or (new / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


def _tidy_after_a_killed_writer(target: Path) -> None:
    """What a writer killed part way left beside `target`, tidied while this one holds the lock:
    its half-built folders go; the report it had moved aside is put back where `target` is missing
    (or an empty folder), and removed only once `target` is a finished report."""
    if fcntl is None:  # no lock here: another writer's folders may be at work
        return
    left = re.compile(rf"\.{re.escape(target.name)}\.(old|new)-[a-z0-9_]{{8}}")  # mkdtemp's names
    try:
        leftovers = [
            e
            for e in target.parent.iterdir()
            if left.fullmatch(e.name) and e.is_dir() and not e.is_symlink()
        ]
        leftovers.sort(key=lambda e: e.stat().st_mtime, reverse=True)  # the newest aside first
    except OSError:
        return  # nothing can be tidied; the write itself says what is wrong
    for entry in leftovers:
        aside = entry / target.name
        if ".old-" in entry.name and aside.is_dir() and not aside.is_symlink():
            with contextlib.suppress(OSError):
                if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
                    target.rmdir()
                if not target.exists():
                    os.rename(aside, target)
            if aside.exists() and report_meta(target) is None:
                continue  # the only finished copy: kept until a report stands in its place
        shutil.rmtree(entry, ignore_errors=True)


def _swap(stage: Path, target: Path) -> None:
    """Rename `stage` to `target`; an old `target` is moved aside first and removed after."""
    if not target.exists():
        os.rename(stage, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    try:
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
    """Write `text` to `path` through a temporary file beside it: all of it, or the old file
    (whose mode it keeps; a new file gets the umask's)."""
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _default_mode(0o666)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        reason = err.strerror or str(err)
        raise ReportWriteError(f"cannot write {path}: {reason}; the old one is unchanged") from None
