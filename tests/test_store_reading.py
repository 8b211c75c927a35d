"""Stores read as they are: read commands never change a store (an older schema is read through a
copy, a read-only store is readable), writing upgrades an older store with a notice and a backup
beside it, a newer store is refused naming its version; what a case ran as (`facts`) round-trips."""

from __future__ import annotations

import csv
import io
import json
import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from attention_zoo.cli import main as zoo_main
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.env import Environment
from attention_zoo.store import SCHEMA_VERSION, ResultStore, StoreError, open_store

from .test_store_load import V1_SCHEMA, _v1_store

ENV = Environment(git_commit="abc123", torch_version="9.9", device_name="test-cpu", threads=1)
BENCH = json.dumps({"backend": "full", "seq_len": 8, "mode": "forward", "target": "attention"})


def _v1_bench_store(path: Path) -> Path:
    """A store as attention-zoo wrote it at schema version 1: one run, one bench case."""
    _v1_store(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE cases SET config = ?", (BENCH,))
    db.execute("UPDATE results SET config = ?", (BENCH,))
    db.commit()
    db.close()
    return path


def _state(path: Path) -> tuple[bytes, int, list[str]]:
    """The store's bytes, its mtime and the files named after it (journal, backups)."""
    beside = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.stem))
    return path.read_bytes(), path.stat().st_mtime_ns, beside


def test_reading_a_v1_store_leaves_its_bytes_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `zoo results` migrated it to the current schema in place, silently."""
    path = _v1_bench_store(tmp_path / "old.sqlite")
    before = _state(path)
    for argv in (["results"], ["results", "--format", "csv"], ["results", "--runs"]):
        assert zoo_main([*argv, "--store", str(path)]) == 0
    assert "0.5" in capsys.readouterr().out
    with open_store(path, write=False) as store:
        assert [r["value"] for r in store.rows()] == [0.5]
        assert store.rows()[0]["facts"] == {}  # stored before facts: none, not invented
        assert store.runs()[0]["load_start"] is None
    assert _state(path) == before


@pytest.mark.slow
def test_zoo_report_of_a_v1_store_leaves_its_bytes_unchanged(tmp_path: Path) -> None:
    path = _v1_bench_store(tmp_path / "old.sqlite")
    before = _state(path)
    out = tmp_path / "report"
    assert zoo_main(["report", "--store", str(path), "--out", str(out)]) == 0
    assert (out / "report.md").is_file()
    assert _state(path) == before


def test_a_reader_cannot_write_to_the_store(tmp_path: Path) -> None:
    path = tmp_path / "zoo.sqlite"
    ResultStore(path).close()
    with ResultStore(path, write=False) as store, pytest.raises(sqlite3.OperationalError):
        store._db.execute("DELETE FROM runs")


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder whose files and itself nobody can change, root included (as on read-only media)."""
    folder = tmp_path / "media"
    folder.mkdir()
    _v1_bench_store(folder / "old.sqlite")
    ResultStore(folder / "new.sqlite").close()
    targets = [str(p) for p in folder.iterdir()] + [str(folder)]
    try:
        subprocess.run(["chattr", "+i", *targets], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("chattr +i is not available here (needs root on ext4-like file systems)")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", *targets], check=True, capture_output=True)


def test_stores_on_read_only_media_are_readable(
    read_only_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an older store there could not be read at all (its upgrade failed)."""
    for name in ("old.sqlite", "new.sqlite"):
        assert zoo_main(["results", "--store", str(read_only_folder / name), "--runs"]) == 0
    capsys.readouterr()
    assert zoo_main(["bench", "--store", str(read_only_folder / "new.sqlite"), "--dry-run"]) == 0
    code = zoo_main(["bench", "--backends", "full", "--lengths", "8", "--metrics", "flops",
                     "--store", str(read_only_folder / "new.sqlite"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "cannot write to the results store" in err


def test_writing_to_a_v1_store_upgrades_it_with_a_notice_and_a_backup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _v1_bench_store(tmp_path / "old.sqlite")
    original = path.read_bytes()
    with caplog.at_level(logging.WARNING), open_store(path, write=True) as store:
        run = store.start_run(environment=ENV)
        store.add_rows(run, "k2", json.loads(BENCH), [("time_median", 0.25, "s")])
    backup = tmp_path / "old.v1-backup.sqlite"
    (notice,) = [r.getMessage() for r in caplog.records]
    assert len(notice.splitlines()) == 1
    assert f"upgraded the results store {path} from schema version 1 to {SCHEMA_VERSION}" in notice
    assert f"kept as {backup}" in notice
    db = sqlite3.connect(backup)  # the old version's file, as it was
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert db.execute("SELECT value FROM results").fetchall() == [(0.5,)]
    db.close()
    assert len(backup.read_bytes()) == len(original)
    with open_store(path, write=False) as store:
        assert sorted(r["value"] for r in store.rows()) == [0.25, 0.5]
    caplog.clear()
    with caplog.at_level(logging.WARNING), open_store(path, write=True):
        pass  # already upgraded: no notice, no second backup
    assert not caplog.records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.sqlite", "old.v1-backup.sqlite"]


@pytest.mark.slow
def test_a_store_of_a_newer_version_is_refused_naming_its_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "zoo.sqlite"
    ResultStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = path.read_bytes()
    for argv in (["results"], ["bench", "--backends", "full", "--lengths", "8"]):
        assert zoo_main([*argv, "--store", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert f"schema version {SCHEMA_VERSION + 1}, written by a newer attention-zoo" in err
    assert path.read_bytes() == before


def test_a_schema_without_migration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "zero.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("PRAGMA application_id = 1515147057")
    db.commit()
    db.close()  # user_version 0: no migration starts there
    with pytest.raises(StoreError, match="schema version 0, which this attention-zoo"):
        ResultStore(path, write=False)


def test_facts_round_trip_through_rows_frames_and_csv(tmp_path: Path) -> None:
    facts = {
        "capabilities": {"mine": {"kind": "approximate", "exact": False}},
        "kernels": {"mine": "fused"},  # any key a writer adds comes back
    }
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        run = store.start_run(environment=ENV)
        store.add_rows(run, "a", json.loads(BENCH), [("time_median", 1.0, "s")], facts=facts)
        store.add_rows(run, "b", json.loads(BENCH), [("time_median", 2.0, "s")])
        rows = {r["case_key"]: r["facts"] for r in store.rows()}
        frame = store.to_dataframe()
        buf = io.StringIO()
        store.export_csv(buf)
    assert rows == {"a": facts, "b": {}}
    assert dict(zip(frame["case_key"], frame["facts"])) == rows
    exported = {
        r["case_key"]: json.loads(r["facts"]) for r in csv.DictReader(io.StringIO(buf.getvalue()))
    }
    assert exported == rows


def _two_runs(path: Path, peers: bool = False) -> None:
    """Runs A and B of full and sdpa (or lsh and its hf peer), B ten times A's times."""
    names = ("lsh", "hf:lsh") if peers else ("full", "sdpa")
    cases = [BenchCase(target="attention", backend=b, seq_len=256) for b in names]
    with ResultStore(path) as store:
        for run_id, seconds in (("runA", 1.0), ("runB", 10.0)):
            store.start_run(run_id=run_id)
            for case in cases:
                rows = [("time_median", seconds, "s"), ("time_iqr", 0.0, "s")]
                store.add_rows(run_id, case.key(), case.to_dict(), rows)
            store.finish_run(run_id)


def test_results_of_several_runs_compare_each_case_within_its_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "zoo.sqlite"
    _two_runs(path)
    assert zoo_main(["results", "--store", str(path), "--run-id", "all"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("attention")]
    assert len(lines) == 4 and all(ln.split()[-2] == "1.00x" for ln in lines), lines


def test_results_take_a_peer_family_as_reference_as_bench_does(tmp_path: Path, capsys) -> None:
    path = tmp_path / "zoo.sqlite"
    _two_runs(path, peers=True)
    assert zoo_main(["results", "--store", str(path), "--reference", "hf"]) == 0
    out = capsys.readouterr().out
    assert "time x hf" in out and "1.00x" in out
