"""A report is written whole or not at all: a write that fails part way (a file-size limit, a
full disk) names the file and leaves the previous report as it was."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attention_zoo.cli import main as zoo_main
from attention_zoo.commands.recording import recorded_command
from attention_zoo.report.index import BEGIN, END, HEADER, write_index
from attention_zoo.report.output import ReportWriteError, _one_writer, staged_folder
from attention_zoo.store import ResultStore

from .report_fixtures import block_case, make_store

OLD_META = b'{"command": "zoo report --out report", "built": "2026-01-01 00:00 UTC"}'


def _old_report(folder: Path) -> dict[str, bytes]:
    """A folder an earlier zoo report wrote (its report.json says so), with a file of the user's."""
    folder.mkdir()
    files = {
        "report.md": b"old",
        "scaling-3.png": b"old plot",
        "notes.txt": b"mine",
        "report.json": OLD_META,
    }
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
    assert _contents(out) == {"report.md": b"new", "notes.txt": b"mine", "report.json": OLD_META}
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


@pytest.mark.parametrize("left", ["missing", "emptied", "swapped"])
def test_what_a_killed_writer_left_is_tidied_and_the_previous_report_put_back(
    tmp_path: Path, left: str
) -> None:
    """A writer killed between moving the old report aside and renaming its build into place
    (--out then missing, or made again empty), or while removing the old one after the swap
    (swapped), left hidden folders."""
    out = tmp_path / "report"
    _old_report(out)
    aside = Path(tempfile.mkdtemp(prefix=".report.old-", dir=tmp_path))
    half_built = Path(tempfile.mkdtemp(prefix=".report.new-", dir=tmp_path))
    (half_built / "report.md").write_text("half")
    swapped = left == "swapped"
    if swapped:
        shutil.copytree(out, aside / "report")
        (out / "notes.txt").write_bytes(b"mine, kept")
    else:
        os.rename(out, aside / "report")
        if left == "emptied":
            out.mkdir()
    neighbour = tmp_path / ".report.old-of-mine"  # not a name the writer gives its folders
    neighbour.mkdir()
    with staged_folder(out, regenerated=("scaling-*.png",)) as stage:
        (stage / "report.md").write_text("new")
    notes = b"mine, kept" if swapped else b"mine"  # the report in place wins; else the one aside
    assert _contents(out) == {"report.md": b"new", "notes.txt": notes, "report.json": OLD_META}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.old-of-mine", "report"]


def test_a_report_moved_aside_is_kept_while_out_holds_other_files(tmp_path: Path) -> None:
    """A killed writer moved the report aside, then --out was made again with files of the
    user's: the write is refused, and the report aside is not the tidy-up's to remove."""
    out = tmp_path / "report"
    old = _old_report(out)
    aside = Path(tempfile.mkdtemp(prefix=".report.old-", dir=tmp_path))
    os.rename(out, aside / "report")
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    with pytest.raises(ReportWriteError, match="nothing was changed"), staged_folder(out):
        pass
    assert _contents(aside / "report") == old and (out / "mine.txt").read_text() == "mine"


def test_a_rebuild_drops_only_the_plots_the_last_build_wrote(tmp_path: Path) -> None:
    """A user's file named like a plot stays: report.json lists what the last build wrote."""
    out = tmp_path / "report"
    _old_report(out)
    meta = {"generator": "zoo report", "files": ["report.md", "scaling-3.png", "report.json"]}
    (out / "report.json").write_text(json.dumps(meta))
    (out / "scaling-mine.png").write_bytes(b"my plot")
    with staged_folder(out, regenerated=("scaling-*.png",)) as stage:
        (stage / "report.md").write_text("new")
    assert sorted(_contents(out)) == ["notes.txt", "report.json", "report.md", "scaling-mine.png"]


def test_a_report_folder_named_by_a_link_is_replaced_behind_the_link(tmp_path: Path) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    _old_report(real)
    link.symlink_to(real)
    with staged_folder(link, regenerated=("scaling-*.png",)) as stage:
        (stage / "report.md").write_text("new")
    assert link.is_symlink() and (link / "report.md").read_text() == "new"
    assert (real / "notes.txt").read_bytes() == b"mine"


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


# ---- what zoo report may write: its own folders and its marked index section, nothing else ------


def _tiny_store(path: Path) -> Path:
    """One run, two bench cases: a report of it builds in about a second."""
    with ResultStore(path) as store:
        run = store.start_run(kind="bench", device="cpu")
        for backend, seconds in (("sdpa", 1e-3), ("full", 2e-3)):
            rows = [("time_median", seconds, "s"), ("peak_bytes", 1e6, "bytes")]
            store.add_rows(run, None, block_case(backend, 256).to_dict(), rows)
        store.finish_run(run)
    return path


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` (and the folder itself) with its mode."""
    files = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*")}
    shot = {
        name: (p.read_bytes() if p.is_file() else b"", p.stat().st_mode)
        for name, p in files.items()
    }
    return {**shot, ".": (b"", folder.stat().st_mode)}


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *words: str) -> None:
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err


@pytest.mark.slow
def test_a_folder_zoo_report_did_not_write_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the user's scaling-9.png (a plot's name) was deleted and the folder made 0700."""
    store, mine = _tiny_store(tmp_path / "s.sqlite"), tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "scaling-9.png").write_bytes(b"my plot")
    (mine / "notes.txt").write_text("mine")
    before = _snapshot(mine)
    code = zoo_main(["report", "--store", str(store), "--out", str(mine)])
    _one_line_error(capsys, code, f"--out {mine} holds files zoo report did not write", "notes.txt")
    assert _snapshot(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "s.sqlite"]  # nothing beside it
    empty = tmp_path / "empty"
    empty.mkdir()
    assert zoo_main(["report", "--store", str(store), "--out", str(empty)]) == 0  # nothing to lose


@pytest.mark.slow
def test_report_folders_and_files_keep_the_users_umask(tmp_path: Path) -> None:
    """Before: a freshly published folder was 0700 (a temporary folder's mode)."""
    store, out = _tiny_store(tmp_path / "s.sqlite"), tmp_path / "report"
    old = os.umask(0o022)
    try:
        assert zoo_main(["report", "--store", str(store), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}
    os.chmod(out, 0o750)  # a mode the user chose for a report folder: kept when it is rebuilt
    assert zoo_main(["report", "--store", str(store), "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o750


@pytest.mark.parametrize("where", [".", ".."])
def test_the_current_folder_is_refused_leaving_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Before: `--out .` failed with EBUSY and left a stray `..old-XXXX` folder."""
    store, here = _tiny_store(tmp_path / "s.sqlite"), tmp_path / "work"
    here.mkdir()
    monkeypatch.chdir(here)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = zoo_main(["report", "--store", str(store), "--out", where])
    _one_line_error(capsys, code, f"--out {where} is the current folder or one above it")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_a_second_writer_to_one_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: two `zoo report --out SAME` at once both said ok; one silently replaced the other."""
    store, out = _tiny_store(tmp_path / "s.sqlite"), tmp_path / "report"
    assert zoo_main(["report", "--store", str(store), "--out", str(out), "--title", "first"]) == 0
    before = _snapshot(out)
    with _one_writer(out):  # another zoo report, still writing
        building = Path(tempfile.mkdtemp(prefix=".report.new-", dir=tmp_path))  # its build
        code = zoo_main(["report", "--store", str(store), "--out", str(out), "--title", "second"])
    _one_line_error(capsys, code, f"another zoo report is writing {out} now; nothing was written")
    assert _snapshot(out) == before and building.is_dir()  # the other's build left alone
    building.rmdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "s.sqlite"]  # lock removed


@pytest.mark.slow
def test_index_edits_only_its_marked_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--index README.md` replaced a 595-line README with a 14-line index."""
    store, reports = _tiny_store(tmp_path / "s.sqlite"), tmp_path / "reports"
    reports.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("# My project\n\nMy words.\n")
    out = str(reports / "cpu")
    code = zoo_main(["report", "--store", str(store), "--out", out, "--index", str(readme)])
    _one_line_error(capsys, code, f"--index {readme} has no generated index section", BEGIN, END)
    assert readme.read_text() == "# My project\n\nMy words.\n" and not (reports / "cpu").exists()
    mine = reports / "README.md"
    mine.write_text(f"# Our reports\n\nBefore.\n\n{BEGIN}\nstale\n{END}\n\nAfter.\n")
    assert zoo_main(["report", "--store", str(store), "--out", out, "--index", str(mine)]) == 0
    text = mine.read_text()
    assert text.startswith("# Our reports\n\nBefore.\n\n" + BEGIN) and text.endswith(
        END + "\n\nAfter.\n"
    )
    assert "stale" not in text and "[cpu](cpu/report.md)" in text


def test_an_index_an_older_zoo_report_wrote_whole_is_regenerated(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Published reports\n\nGenerated by `zoo report --out ...` (not by hand).\n")
    write_index(readme)
    text = readme.read_text()
    assert text.startswith(f"{HEADER}\n{BEGIN}\n") and "--out ...`" not in text


@pytest.mark.slow
def test_the_index_records_commands_quoted_relative_and_with_their_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: commands unquoted, with absolute paths, without --import; a folder name with a
    space gave a broken link."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_attention.py").write_text('"""A plugin that registers nothing."""\n')
    monkeypatch.setenv("ZOO_IMPORT", str(tmp_path / "my_attention.py"))
    (tmp_path / "my results").mkdir()
    store = _tiny_store(tmp_path / "my results" / "zoo.sqlite")
    with ResultStore(store) as s:  # as zoo bench records its command line now
        meta = {"command": recorded_command(["bench", "--store", str(store)])}
        s._db.execute("UPDATE runs SET meta = ?", (json.dumps(meta),))
        s._db.commit()
    (tmp_path / "reports").mkdir()
    out, index = str(tmp_path / "reports" / "cpu run"), str(tmp_path / "reports" / "README.md")
    assert zoo_main(["report", "--store", str(store), "--out", out, "--index", index]) == 0
    text = (tmp_path / "reports" / "README.md").read_text()
    assert "[cpu run](cpu%20run/report.md)" in text
    assert "`zoo bench --store 'my results/zoo.sqlite' --import my_attention.py`" in text
    report = (
        "zoo report --store 'my results/zoo.sqlite' --out 'reports/cpu run' "
        "--index reports/README.md --import my_attention.py"
    )
    assert f"| `{report}` |" in text
    assert shlex.split(report)[3] == "my results/zoo.sqlite"  # a shell takes it back whole


@pytest.mark.slow
def test_a_store_outside_the_folder_a_command_ran_in_is_recorded_by_its_file_name(tmp_path):
    """A published report shows no machine's folders: a store elsewhere is its file name, one
    under the folder its path from there; an older run's recorded command is made so when a
    report is built from it (its runs.json, report.json and the index)."""
    here = tmp_path / "repo"
    here.mkdir()
    elsewhere = "/root/out/gpu-check.sqlite"
    assert recorded_command(["bench", "--store", elsewhere], cwd=here) == (
        "zoo bench --store gpu-check.sqlite"
    )
    assert recorded_command([f"--store={elsewhere}"], cwd=here) == "zoo --store=gpu-check.sqlite"
    inside = str(here / "results" / "a.sqlite")
    assert recorded_command(["bench", "--store", inside], cwd=here) == (
        "zoo bench --store results/a.sqlite"
    )
    store = make_store(tmp_path / "s.sqlite")
    with ResultStore(store) as s:
        meta = {"command": f"zoo bench --preset quick --store {elsewhere}"}
        s._db.execute("UPDATE runs SET meta = ?", (json.dumps(meta),))
        s._db.commit()
    out, index = tmp_path / "reports" / "run", tmp_path / "reports" / "README.md"
    out.parent.mkdir()
    assert (
        zoo_main(["report", "--store", str(store), "--out", str(out), "--index", str(index)]) == 0
    )
    for text in (
        index.read_text(),
        (out / "runs.json").read_text(),
        (out / "report.json").read_text(),
    ):
        assert "/root/out" not in text and "--store gpu-check.sqlite" in text
