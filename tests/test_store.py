"""The SQLite results store: rows with their environment, replace-not-duplicate, export, bad
files."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from attention_zoo.measure.env import Environment
from attention_zoo.store import SCHEMA_VERSION, ResultStore, StoreError, case_key

ENV = Environment(git_commit="abc123", torch_version="9.9", device_name="test-cpu", threads=3)
CONFIG = {"backend": "full", "seq_len": 128, "mode": "forward"}


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    with ResultStore(tmp_path / "sub" / "zoo.sqlite") as s:  # the folder is created
        yield s


def test_rows_carry_environment_and_config(store: ResultStore) -> None:
    run = store.start_run(kind="task", environment=ENV, meta={"command": "test"})
    key = store.add_rows(
        run, None, CONFIG, [("accuracy", 0.97, "fraction"), ("steps", 420, "steps")]
    )
    assert key == case_key(CONFIG)
    rows = store.rows(run)
    assert [(r["metric"], r["value"], r["unit"]) for r in rows] == [
        ("accuracy", 0.97, "fraction"),
        ("steps", 420.0, "steps"),
    ]
    for r in rows:
        assert (
            r["run_id"],
            r["git_commit"],
            r["torch_version"],
            r["device_name"],
            r["threads"],
        ) == (run, "abc123", "9.9", "test-cpu", 3)
        assert json.loads(r["config"]) == CONFIG and r["status"] == "ok"
    assert store.run(run)["meta"]["command"] == "test"


def test_rewriting_a_case_replaces_its_rows(store: ResultStore) -> None:
    run = store.start_run(environment=ENV)
    store.add_rows(run, "k1", CONFIG, [("peak_bytes", 1, "bytes")])
    store.add_rows(run, "k1", CONFIG, [("peak_bytes", 2, "bytes")])
    assert [r["value"] for r in store.rows(run)] == [2.0]
    store.add_rows(run, "k1", CONFIG, [("time_median", 0.5, "s")], replace=False)
    assert sorted(r["metric"] for r in store.rows(run)) == ["peak_bytes", "time_median"]
    assert store.completed_cases(run) == {"k1"}


def test_failed_case_is_listed_with_status_and_error(store: ResultStore) -> None:
    run = store.start_run(environment=ENV)
    store.add_rows(run, "k", CONFIG, [], status="oom", error="predicted 9 GiB > 8 GiB")
    (row,) = store.rows(run)
    assert (row["status"], row["metric"], row["error"]) == ("oom", None, "predicted 9 GiB > 8 GiB")
    with pytest.raises(StoreError, match="status 'broken' is not one of: ok, oom, error, skipped"):
        store.add_rows(run, "k", CONFIG, [], status="broken")
    with pytest.raises(StoreError, match=r"no run 'nope'.*start_run"):
        store.add_rows("nope", "k", CONFIG, [])


def test_export_csv_and_dataframe(store: ResultStore, tmp_path: Path) -> None:
    run = store.start_run(environment=ENV)
    store.add_rows(run, None, CONFIG, [("flops", 1e9, "flop")])
    n = store.export_csv(tmp_path / "out.csv")
    with open(tmp_path / "out.csv") as f:
        rows = list(csv.DictReader(f))
    assert n == 1 and rows[0]["metric"] == "flops" and float(rows[0]["value"]) == 1e9
    assert next(iter(csv.DictReader(io.StringIO(store.to_csv_text()))))["device_name"] == "test-cpu"
    df = store.to_dataframe()
    assert (
        df.loc[0, "cfg.backend"] == "full"
        and df.loc[0, "cfg.seq_len"] == 128
        and df.loc[0, "value"] == 1e9
    )


def test_reopen_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "zoo.sqlite"
    with ResultStore(path) as s:
        run = s.start_run(environment=ENV)
        s.add_rows(run, "k", CONFIG, [("x", 1, "u")])
    with ResultStore(path, create=False) as s:
        assert [r["metric"] for r in s.rows()] == ["x"] and s.latest_run() == run


def test_missing_store_without_create(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"no results store at .*zoo bench"):
        ResultStore(tmp_path / "missing.sqlite", create=False)


def test_text_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(StoreError, match="is not an attention-zoo results store"):
        ResultStore(path)
    assert path.read_text().startswith("these are my notes")  # untouched


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE customers (name TEXT)")
    db.commit()
    db.close()
    with pytest.raises(
        StoreError, match=r"SQLite database but not an attention-zoo results store.*customers"
    ):
        ResultStore(path)


def test_corrupt_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "zoo.sqlite"
    with ResultStore(path) as s:
        run = s.start_run(environment=ENV)
        s.add_rows(run, "k", CONFIG, [("x", 1, "u")])
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # keep the header, destroy every page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="results store, but it is damaged"):
        ResultStore(path)


WORKER = Environment(
    git_commit="abc123",
    torch_version="9.9",
    device_name="NVIDIA H100",
    threads=8,
    host="node-b",
    cuda_version="12.8",
    driver_version="570.1",
)


def test_case_keeps_the_environment_of_the_worker_that_measured_it(store: ResultStore) -> None:
    run = store.start_run(environment=ENV)  # the driver's
    store.add_rows(run, "remote", CONFIG, [("x", 1, "u")], environment=WORKER)
    store.add_rows(run, "failed", CONFIG, [], status="error", error="boom", environment=WORKER)
    store.add_rows(run, "driver", CONFIG, [("x", 2, "u")])  # no environment: the run's
    rows = {r["case_key"]: r for r in store.rows(run)}
    for key in ("remote", "failed"):
        assert (rows[key]["host"], rows[key]["device_name"]) == ("node-b", "NVIDIA H100")
        assert json.loads(rows[key]["environment"]) == WORKER.to_dict()
    assert rows["driver"]["device_name"] == "test-cpu"
    assert rows["driver"]["host"] == ENV.host == json.loads(rows["driver"]["environment"])["host"]


def test_store_of_schema_2_is_upgraded_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with ResultStore(path) as s:
        run = s.start_run(environment=ENV)
        s.add_rows(run, "k", CONFIG, [("x", 1, "u"), ("y", 2, "u")])
    db = sqlite3.connect(path)  # make it a version-2 store: no per-case environment, no facts
    db.execute("ALTER TABLE cases DROP COLUMN environment")
    db.execute("ALTER TABLE cases DROP COLUMN facts")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    with ResultStore(path) as s:
        rows = s.rows()
        s.add_rows(run, "k2", CONFIG, [("x", 3, "u")], environment=WORKER)
        hosts = {r["case_key"]: r["host"] for r in s.rows()}
    assert [(r["metric"], r["value"], r["device_name"]) for r in rows] == [
        ("x", 1.0, "test-cpu"),
        ("y", 2.0, "test-cpu"),
    ]
    assert hosts == {"k": ENV.host, "k2": "node-b"}
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_every_row_records_the_package_version_beside_the_commit(tmp_path: Path) -> None:
    import attention_zoo
    from attention_zoo.measure.env import capture

    with ResultStore(tmp_path / "s.sqlite") as s:
        run = s.start_run()  # the environment of this process
        s.add_rows(run, "here", CONFIG, [("x", 1, "u")])
        s.add_rows(run, "worker", CONFIG, [("x", 2, "u")], environment=capture())
        old = s.start_run(environment=ENV, meta={})
        s._db.execute("UPDATE runs SET meta = '{}' WHERE run_id = ?", (old,))  # an older run
        s.add_rows(old, "old", CONFIG, [("x", 3, "u")])
        envs = {r["case_key"]: json.loads(r["environment"]) for r in s.rows()}
    assert envs["here"]["zoo_version"] == envs["worker"]["zoo_version"] == attention_zoo.__version__
    assert "zoo_version" not in envs["old"]  # not recorded then: not invented
