"""A report is written whole or not at all: a write that fails part way (a file-size limit, a
full disk) names the file and leaves the previous report as it was."""

from __future__ import annotations

import errno
import hashlib
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo.report.output import ReportWriteError, staged_folder

from .report_fixtures import make_store


def _old_report(folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    files = {"report.md": b"old", "scaling-3.png": b"old plot", "notes.txt": b"mine"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_failed_build_leaves_the_previous_report_and_names_the_file(tmp_path: Path) -> None:
    out = tmp_path / "report"
    old = _old_report(out)
    with pytest.raises(ReportWriteError) as err, staged_folder(out) as stage:
        (stage / "report.md").write_text("new")
        raise OSError(errno.EFBIG, "File too large", str(stage / "report.html"))
    assert str(err.value) == (
        f"cannot write the report: {out / 'report.html'}: File too large; "
        f"the previous report in {out} is unchanged"
    )
    assert _contents(out) == old and [p.name for p in tmp_path.iterdir()] == ["report"]


def test_a_complete_build_replaces_the_report_and_keeps_other_files(tmp_path: Path) -> None:
    out = tmp_path / "report"
    _old_report(out)
    with staged_folder(out, regenerated=("scaling-*.png",)) as stage:
        (stage / "report.md").write_text("new")
    # an old plot this build did not write is gone; a file of the user's stays
    assert _contents(out) == {"report.md": b"new", "notes.txt": b"mine"}
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.slow
@pytest.mark.long
def test_zoo_report_under_a_file_size_limit_keeps_the_previous_report(tmp_path: Path) -> None:
    """Before: plots replaced or truncated, 'File too large' naming no file."""
    store, out = make_store(tmp_path / "zoo.sqlite"), tmp_path / "report"
    zoo = [
        sys.executable,
        "-m",
        "attention_zoo",
        "report",
        "--store",
        str(store),
        "--out",
        str(out),
    ]
    subprocess.run([*zoo, "--title", "old"], check=True, capture_output=True, timeout=300)
    before = _digest(out)

    def small_files() -> None:  # the plots fit, report.html (plots embedded) does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    proc = subprocess.run(
        [*zoo, "--title", "new"], capture_output=True, text=True, preexec_fn=small_files,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{out / 'report.html'}: File too large" in proc.stderr
    assert f"the previous report in {out} is unchanged" in proc.stderr
    assert _digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "zoo.sqlite"]
