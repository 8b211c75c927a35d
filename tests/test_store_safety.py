"""The store under stress: many processes creating or upgrading one store at once, a file cut
short by a crash (damaged, not foreign; its readable rows recovered into a new store)."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import sqlite3
from contextlib import nullcontext
from pathlib import Path

import pytest

from attention_zoo import salvage
from attention_zoo.cli import main as zoo_main
from attention_zoo.measure.env import Environment
from attention_zoo.measure.load import Load
from attention_zoo.store import SCHEMA_VERSION, ResultStore, StoreError

from .test_store_load import _v1_store

PROCESSES = 20
ENV = Environment(git_commit="abc123", torch_version="9.9", device_name="test-cpu", threads=1)
IDLE = Load(0.0, "sampled")


def _open_and_write(path: Path, barrier, results) -> None:  # in a forked process
    barrier.wait()
    try:
        with ResultStore(path) as store:
            store.start_run(kind="bench", environment=ENV, load=IDLE)
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def _all_at_once(path: Path) -> list[str]:
    """PROCESSES processes open `path` at the same moment and start a run each."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_and_write, args=(path, barrier, results)) for _ in range(20)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    return outcomes


@pytest.mark.slow
def test_twenty_processes_create_one_new_store_at_once(tmp_path: Path) -> None:
    path = tmp_path / "new" / "zoo.sqlite"
    assert _all_at_once(path) == ["ok"] * PROCESSES
    with ResultStore(path, create=False) as store:
        assert len(store.runs()) == PROCESSES
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.slow
def test_twenty_processes_upgrade_one_old_store_at_once(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _v1_store(path)
    assert _all_at_once(path) == ["ok"] * PROCESSES
    with ResultStore(path, create=False) as store:
        assert [r["value"] for r in store.rows("r1")] == [0.5]  # the old row, kept
        assert len(store.runs()) == PROCESSES + 1


def _store_with_rows(path: Path, runs: int = 3, cases: int = 40, pad: int = 200) -> int:
    """A store spanning several pages; returns its number of result rows."""
    with ResultStore(path) as store:
        for r in range(runs):
            run = store.start_run(kind="bench", environment=ENV, load=IDLE)
            for c in range(cases):
                config = {"backend": "full", "seq_len": 2**c, "run": r, "pad": "x" * pad}
                store.add_rows(run, None, config, [("time_median", c, "s"), ("peak_bytes", c, "B")])
            store.finish_run(run)
    return runs * cases * 2


@pytest.mark.parametrize(("cases", "pad"), [(40, 200), (15, 600)])  # the cut in other pages
def test_a_truncated_store_is_damaged_and_its_readable_rows_recovered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cases: int, pad: int
) -> None:
    path = tmp_path / "zoo.sqlite"
    total = _store_with_rows(path, cases=cases, pad=pad)
    os.truncate(path, path.stat().st_size * 6 // 10)  # a crash cut the file short
    cut = path.read_bytes()
    with pytest.raises(StoreError, match="is an attention-zoo results store, but it is damaged"):
        ResultStore(path)
    assert zoo_main(["results", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"'zoo results --store {path} --recover'" in err
    assert zoo_main(["results", "--store", str(path), "--recover"]) == 0
    out = capsys.readouterr().out
    dest = tmp_path / "zoo.recovered.sqlite"
    assert f"recovered into {dest}" in out and f"{path} unchanged" in out
    assert path.read_bytes() == cut  # the damaged file was only read
    with ResultStore(dest, create=False) as store:
        rows = [r for r in store.rows() if r["metric"]]
        assert len(store.runs()) == 3 and 0 < len(rows) < total
        ids = [r["id"] for r in store._db.execute("SELECT id FROM results")]
        assert len(ids) == len(set(ids)) <= total  # no row read twice, no garbage row
    shown, lost = len(rows), int(out.split("; ")[1].split()[0]) if "lost" in out else 0
    assert f"results {shown + lost})" in out  # rows whose case row was lost are counted apart
    assert zoo_main(["results", "--store", str(path), "--recover"]) == 2  # never overwrites
    assert "exists; give --recover a new file name" in capsys.readouterr().err


@pytest.mark.slow
def test_recover_says_when_its_step_budget_cut_the_reading_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "zoo.sqlite"
    total = _store_with_rows(path)
    assert zoo_main(["results", "--store", str(path), "--recover", str(tmp_path / "a.sqlite")]) == 0
    assert "budget" not in capsys.readouterr().out  # a whole read says nothing of it
    monkeypatch.setattr(salvage, "_STEP_BUDGET", 2_000)  # a whole read takes < 5,000
    assert zoo_main(["results", "--store", str(path), "--recover", str(tmp_path / "b.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "reading stopped at its budget of SQLite steps: rows further on were not read" in out
    with ResultStore(tmp_path / "b.sqlite", create=False) as store:
        assert 0 < len(store.rows()) < total


def test_a_damaged_stores_count_says_at_least_when_the_budget_cut_it_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "zoo.sqlite"
    _store_with_rows(path)
    os.truncate(path, path.stat().st_size * 6 // 10)
    with pytest.raises(StoreError) as whole:
        ResultStore(path)
    assert "at least" not in str(whole.value) and " rows can still be read (" in str(whole.value)
    monkeypatch.setattr(salvage, "_STEP_BUDGET", 0)  # stops after a few thousand steps
    with pytest.raises(StoreError) as cut:
        ResultStore(path)
    assert re.search(
        r"nothing was changed; (at least \d+ rows can still be read \(.*|no row of it was read) "
        r"before reading stopped at its budget of SQLite steps",
        str(cut.value),
    )


def test_a_store_cut_to_its_header_has_nothing_to_recover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "zoo.sqlite"
    _store_with_rows(path, runs=1, cases=2)
    os.truncate(path, 100)
    with pytest.raises(StoreError, match=r"damaged.*no row of it can be read: restore it"):
        ResultStore(path)
    assert zoo_main(["results", "--store", str(path), "--recover"]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert not (tmp_path / "zoo.recovered.sqlite").exists()


def test_a_foreign_file_is_not_called_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("my notes\n" * 50)
    with pytest.raises(StoreError, match="is not an attention-zoo results store"):
        ResultStore(path)
    assert zoo_main(["results", "--store", str(path), "--recover"]) == 2
    assert "is not an attention-zoo results store" in capsys.readouterr().err


TORN = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 1")  # the write spills into the file before its commit
db.execute("BEGIN")
db.execute("UPDATE results SET unit = 'TORN'")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _torn(path: Path) -> None:
    """A process killed in the middle of a write to the store: a journal beside it undoes it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", TORN, str(path)], check=False)
    assert Path(f"{path}-journal").stat().st_size > 0


def test_an_unfinished_write_is_undone_by_a_reader_and_by_recover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed writer's journal: --recover copies what was committed (not the torn write), the
    store left as it was; a reading command undoes the write, as SQLite's next writer would."""
    path = tmp_path / "zoo.sqlite"
    total = _store_with_rows(path, runs=1, cases=30)
    _torn(path)
    torn = path.read_bytes()
    assert zoo_main(["results", "--store", str(path), "--recover"]) == 0
    capsys.readouterr()
    assert path.read_bytes() == torn and Path(f"{path}-journal").exists()  # only read
    with ResultStore(tmp_path / "zoo.recovered.sqlite", create=False) as store:
        units = {r["unit"] for r in store.rows() if r["metric"]}
    assert units == {"s", "B"}
    assert zoo_main(["results", "--store", str(path), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "TORN" not in out and out.count("\n") == total + 1


def test_an_unfinished_write_in_a_store_that_cannot_be_written_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "zoo.sqlite"
    _store_with_rows(path, runs=1, cases=30)
    _torn(path)
    if os.geteuid() == 0:  # root writes whatever the mode says: stand in for a read-only store
        pytest.importorskip("unittest.mock")
        from unittest import mock

        real = os.access
        patch = mock.patch("os.access", lambda p, mode: mode != os.W_OK and real(p, mode))
    else:
        path.chmod(0o444)
        patch = nullcontext()
    with patch:
        assert zoo_main(["results", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "holds an unfinished write" in err
    assert "do not delete zoo.sqlite-journal" in err
    assert Path(f"{path}-journal").stat().st_size > 0
