"""Machine load around runs: recorded in the store, warned about by `zoo bench`; stores of the
previous schema are upgraded in place without losing a row."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from attention_zoo.cli import main as zoo_main
from attention_zoo.measure import load
from attention_zoo.store import APPLICATION_ID, SCHEMA_VERSION, ResultStore

V1_SCHEMA = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, fingerprint TEXT,
    started_at REAL NOT NULL, finished_at REAL, git_commit TEXT NOT NULL,
    torch_version TEXT NOT NULL, device_name TEXT NOT NULL, threads INTEGER NOT NULL,
    meta TEXT NOT NULL);
CREATE TABLE cases (run_id TEXT NOT NULL REFERENCES runs(run_id), case_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT, config TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (run_id, case_key));
CREATE TABLE results (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, case_key TEXT NOT NULL,
    metric TEXT NOT NULL, value REAL, unit TEXT NOT NULL, git_commit TEXT NOT NULL,
    torch_version TEXT NOT NULL, device_name TEXT NOT NULL, threads INTEGER NOT NULL,
    config TEXT NOT NULL, created_at REAL NOT NULL,
    FOREIGN KEY (run_id, case_key) REFERENCES cases(run_id, case_key));
"""


def _v1_store(path):
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("PRAGMA user_version = 1")
    db.execute(
        "INSERT INTO runs VALUES ('r1', 'bench', NULL, 1.0, 2.0, 'abc', '2.13', 'cpu', 2, '{}')"
    )
    db.execute("INSERT INTO cases VALUES ('r1', 'k1', 'ok', NULL, '{\"seq_len\": 8}', 1.5)")
    db.execute(
        "INSERT INTO results VALUES (1, 'r1', 'k1', 'time_median', 0.5, 's', 'abc', '2.13', "
        "'cpu', 2, '{\"seq_len\": 8}', 1.5)"
    )
    db.commit()
    db.close()


def test_a_v1_store_is_upgraded_in_place_and_keeps_every_row(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_store(path)
    with ResultStore(path, create=False) as store:
        assert [r["value"] for r in store.rows()] == [0.5]
        (run,) = store.runs()
        assert run["load_start"] is None and run["finished_at"] == 2.0  # unknown, not invented
        new = store.start_run(kind="bench")
        store.finish_run(new)
        assert store.run(new)["cpu_count"] >= 1
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_runs_record_the_load_at_start_and_end(tmp_path, monkeypatch):
    loads = iter([load.Load(0.25, load.LOAD_AVERAGE), load.Load(3.5, load.LOAD_AVERAGE)])
    monkeypatch.setattr("attention_zoo.store.machine_load", lambda: next(loads))
    with ResultStore(tmp_path / "s.sqlite") as store:
        run = store.start_run(kind="bench")
        assert store.finish_run(run) == load.Load(3.5, load.LOAD_AVERAGE)  # what it recorded
        info = store.run(run)
        given = store.start_run(kind="bench", load=load.Load(1.5, load.SAMPLED))  # not resampled
        assert store.run(given)["load_start"] == 1.5
        assert store.run(given)["meta"]["load"] == load.SAMPLED
        # resumed: busy if any session started busy; the end's kind picks the report's end rule
        store.start_run(run_id=given, load=load.Load(0.5, load.SAMPLED))
        assert store.run(given)["load_start"] == 1.5
        store.start_run(run_id=given, load=load.Load(2.5, load.SAMPLED))
        assert store.run(given)["load_start"] == 2.5
        monkeypatch.setattr(
            "attention_zoo.store.machine_load", lambda: load.Load(0.75, load.LOAD_AVERAGE)
        )
        store.finish_run(given)
        assert store.run(given)["meta"]["load"] == load.LOAD_AVERAGE
        assert store.run(given)["load_end"] == 0.75
        store.start_run(run_id=given, load=load.Load(9.0, load.SAMPLED))  # finished: unchanged
        assert store.run(given)["load_start"] == 2.5
    assert (info["load_start"], info["load_end"]) == (0.25, 3.5)
    assert info["meta"]["load"] == load.LOAD_AVERAGE  # the report picks the end rule by it
    assert info["cpu_count"] == load.cpu_count()


def test_busy_rules_and_the_warning_say_what_was_seen():
    assert not load.busy_at_start(0.4, cores=2, threads=2)
    assert load.busy_at_start(0.6, cores=2, threads=2)
    assert not load.busy_at_start(2.4, cores=8, threads=2)
    assert load.busy_at_end(2.6, 2, 2, sampled=False) and not load.busy_at_end(
        2.4, 2, 2, sampled=False
    )
    assert load.busy_at_end(0.6, 2, 2, sampled=True) and not load.busy_at_end(
        0.4, 2, 2, sampled=True
    )
    sampled, average = (
        (lambda x: load.Load(x, load.SAMPLED)),
        (lambda x: load.Load(x, load.LOAD_AVERAGE)),
    )
    assert load.busy_warning(sampled(0.1), 2, 2) == ""
    text = load.busy_warning(sampled(3.0), 2, 2)
    assert "3.00 on 2 cores" in text and "2 threads" in text and "inflated" in text
    assert "at the end of the run" in load.busy_warning(sampled(5.0), 2, 2, at_end=True)
    # the end rule follows how the load was measured: a load average includes the run's threads
    assert load.busy_warning(sampled(1.0), 2, 2, at_end=True)
    assert load.busy_warning(average(1.0), 2, 2, at_end=True) == ""
    assert load.busy_warning(average(None), 2, 2) == ""


def test_machine_load_is_the_busy_share_of_the_cpu_counters(monkeypatch):
    samples = iter([(100, 1000), (150, 1100)])  # 50 of 100 jiffies busy: half of every core
    monkeypatch.setattr(load, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(load, "cpu_count", lambda: 4)  # the cores this process may run on
    assert load.machine_load(sample_s=0) == load.Load(2.0, load.SAMPLED)


@pytest.mark.slow
@pytest.mark.real_load
def test_machine_load_sees_another_process_spinning():
    if load._cpu_times() is None:
        pytest.skip("no /proc/stat here: the load average is used instead")
    spin = "import time\nprint('up', flush=True)\nt = time.time()\nwhile time.time() < t + 5: pass"
    proc = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"  # up and spinning from here
        busy = load.machine_load(sample_s=0.5).cores_busy
    finally:
        proc.kill()
        proc.wait()
    assert busy is not None and 0.7 <= busy <= (os.cpu_count() or 1) + 0.01, busy


@pytest.mark.slow
def test_zoo_bench_warns_on_a_busy_machine(tmp_path, monkeypatch, capsys):
    busy = load.Load(9.0, load.SAMPLED)
    monkeypatch.setattr("attention_zoo.commands.bench_cmd.machine_load", lambda: busy)
    monkeypatch.setattr("attention_zoo.commands.bench_cmd.cpu_count", lambda: 2)
    store = tmp_path / "s.sqlite"
    argv = ["bench", "--backends", "full", "--lengths", "16", "--metrics", "predict",
            "--threads", "1", "--store", str(store), "--no-progress"]  # fmt: skip
    assert zoo_main(argv) == 0
    err = capsys.readouterr().err
    assert "the machine is busy: the load is 9.00" in err
    with ResultStore(store) as s:
        assert json.loads(s.rows()[0]["config"])["seq_len"] == 16
        assert s.runs()[0]["load_start"] == 9.0  # the sample it warned about is the one stored


@pytest.mark.slow
def test_zoo_bench_samples_the_load_once_at_each_end_of_its_run(tmp_path, monkeypatch, capsys):
    taken = []

    def sample(sample_s=None):
        taken.append(sample_s)
        return load.Load(5.0, load.SAMPLED)  # busy both times

    for where in ("attention_zoo.commands.bench_cmd", "attention_zoo.store"):
        monkeypatch.setattr(f"{where}.machine_load", sample)
    monkeypatch.setattr("attention_zoo.commands.bench_cmd.cpu_count", lambda: 2)
    argv = ["bench", "--backends", "full", "--lengths", "16", "--metrics", "predict",
            "--threads", "1", "--store", str(tmp_path / "s.sqlite"), "--no-progress"]  # fmt: skip
    assert zoo_main(argv) == 0
    err = capsys.readouterr().err
    assert len(taken) == 2  # start and end, each warned about and stored from one sample
    assert "the load is 5.00" in err and "5.00 at the end of the run" in err
    with ResultStore(tmp_path / "s.sqlite") as s:
        (run,) = s.runs()
    assert (run["load_start"], run["load_end"]) == (5.0, 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("load_value", [0.0])
def test_zoo_bench_is_quiet_on_an_idle_machine(tmp_path, monkeypatch, capsys, load_value):
    idle = load.Load(load_value, load.SAMPLED)
    monkeypatch.setattr("attention_zoo.commands.bench_cmd.machine_load", lambda: idle)
    argv = ["bench", "--backends", "full", "--lengths", "16", "--metrics", "predict",
            "--threads", "1", "--store", str(tmp_path / "s.sqlite"), "--no-progress"]  # fmt: skip
    assert zoo_main(argv) == 0
    assert "busy" not in capsys.readouterr().err


def test_an_opener_that_lost_the_race_to_migrate_finds_the_store_upgraded(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_store(path)
    with ResultStore(path, create=False) as first, ResultStore(path, create=False) as second:
        second._upgrade(1)  # read version 1 before `first` upgraded the file: nothing left to do
        assert [r["value"] for r in first.rows()] == [0.5] == [r["value"] for r in second.rows()]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
