"""Executors: the flags and their errors, jobs measured by the same method wherever they run; in
worker processes: training runs side by side with the local runs' results, timed cases one at a
time, a killed worker's job retried; on a local Ray runtime (2 CPUs, one per module): the same cases
and statuses as the local executor, a worker killed mid-case retried, a driver killed mid-sweep
resumed with exactly the uninterrupted rows, a bad cluster address refused in seconds."""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_zoo.cli import main
from attention_zoo.errors import UnavailableError, UsageError
from attention_zoo.executors import (
    Job,
    LocalExecutor,
    PoolExecutor,
    RayError,
    RayExecutor,
    add_executor_args,
    executor_argv,
    executor_from_args,
    run_job,
)
from attention_zoo.executors.ray_cluster import TIMING_SLOT, check_address, probe
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import CaseResult, MeasureSettings, Metric
from attention_zoo.presets import load_sweep_preset
from attention_zoo.store import ResultStore
from attention_zoo.sweep import SweepGrid, measure_one, run_sweep

from .test_plugins import PLUGIN_SOURCE

REPO = Path(__file__).resolve().parents[1]
FAST = MeasureSettings(metrics=("memory", "predict"), time_budget_s=0.0, min_repeats=1, threads=1)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_executor_args(parser)
    return parser.parse_args(list(argv))


# ---- flags ----------------------------------------------------------------------------------


def test_local_is_the_default_and_takes_no_ray_flags() -> None:
    assert isinstance(executor_from_args(parse()), LocalExecutor)
    with pytest.raises(UsageError, match=r"--gpus-per-case applies to --executor ray"):
        executor_from_args(parse("--gpus-per-case", "1"))
    with pytest.raises(UsageError, match=r"--ray-address applies to --executor ray"):
        executor_from_args(parse("--ray-address", "auto"))


def test_workers_go_with_the_processes_executor() -> None:
    executor = executor_from_args(parse("--executor", "processes", "--workers", "3"))
    assert isinstance(executor, PoolExecutor) and executor.workers == 3
    with pytest.raises(UsageError, match=r"--workers applies to --executor processes"):
        executor_from_args(parse("--workers", "2"))
    with pytest.raises(UsageError, match=r"--cpus-per-case applies to --executor ray"):
        executor_from_args(parse("--executor", "processes", "--cpus-per-case", "1"))


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("0", "must be an integer >= 1, got 0"),
        ("-1", "must be an integer >= 1, got -1"),
        ("1.5", "expected an integer, got '1.5'"),
        ("two", "expected an integer, got 'two'"),
    ],
)
def test_bad_worker_counts_are_refused(
    bad: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("--executor", "processes", "--workers", bad)
    assert f"argument --workers: {why}" in capsys.readouterr().err


def test_executor_flags_pass_on_to_a_nested_command() -> None:
    args = parse("--executor", "ray", "--ray-address", "auto", "--gpus-per-case", "0.5")
    again = parse(*executor_argv(args))
    assert vars(again) == vars(args)
    assert executor_argv(parse()) == ["--executor", "local"]
    args = parse("--executor", "processes", "--workers", "4")
    assert executor_argv(args) == ["--executor", "processes", "--workers", "4"]
    assert vars(parse(*executor_argv(args))) == vars(args)


def test_missing_ray_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UnavailableError, match=r"needs Ray.*pip install -e '\.\[ray\]'"):
        executor_from_args(parse("--executor", "ray"))
    store = tmp_path / "zoo.sqlite"
    code = main(["bench", "--target", "attention", "--backends", "full", "--lengths", "64",
                 "--store", str(store), "--executor", "ray"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "'.[ray]'" in err
    assert not store.exists()  # refused before anything was stored


def test_bad_resource_amounts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--executor", "ray", "--gpus-per-case", "-1")
    assert "--gpus-per-case: must be a number >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--executor", "ray", "--cpus-per-case", "inf")
    assert "expected a finite number, got 'inf'" in capsys.readouterr().err


def test_ray_resources_default_to_the_case() -> None:
    cpu = Job(key="a", label="a", fn=print, device="cpu", threads=4)
    gpu = Job(key="b", label="b", fn=print, device="cuda", threads=None)
    assert RayExecutor().resources(cpu) == (4.0, 0.0)
    assert RayExecutor().resources(gpu) == (1.0, 1.0)
    assert RayExecutor(cpus_per_case=2, gpus_per_case=0.5).resources(gpu) == (2.0, 0.5)


@pytest.mark.parametrize("address", ["localhost", "ray://nohost", "http://x:1/", "host:port"])
def test_malformed_address_says_what_works(address: str) -> None:
    with pytest.raises(RayError, match=r"is not an address; use 'auto'.*'ray://HOST:PORT'"):
        check_address(address)


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_unreachable_address_fails_fast(address: str) -> None:
    start = time.monotonic()
    with pytest.raises(RayError, match=r"no Ray cluster answers at .*127\.0\.0\.1:1.*ray start"):
        probe(check_address(address))
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_bad_address_fails_the_command_fast_before_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    store = tmp_path / "zoo.sqlite"
    start = time.monotonic()
    argv = ["bench", "--target", "attention", "--backends", "full", "--lengths", "64"]
    argv += ["--store", str(store), "--executor", "ray", "--ray-address", "127.0.0.1:1"]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and time.monotonic() - start < 15
    assert len(err.splitlines()) == 1 and "no Ray cluster answers at 127.0.0.1:1" in err
    assert not store.exists()


def test_ray_address_comes_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert RayExecutor().address == "10.0.0.1:6379"
    assert RayExecutor(address="auto").address == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "nowhere")
    with pytest.raises(RayError, match="'nowhere' is not an address"):
        RayExecutor()


# ---- the same method everywhere -------------------------------------------------------------


class _Ref:
    """An object ref: hashable, holding the outcome of a job already run."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome


class _FakeRay:
    """Ray's API as RayExecutor.run uses it, recording every submission and running it here."""

    exceptions = None

    def __init__(self) -> None:
        self.submitted: list[dict] = []

    def remote(self, fn):
        fake = self

        class Task:
            def options(self, **options):
                def remote(*args, **kwargs):
                    fake.submitted.append({"task": fn, "options": options, "args": args, **kwargs})
                    return _Ref(fn(*args, **kwargs))

                return type("Submit", (), {"remote": staticmethod(remote)})()

        return Task()

    def wait(self, pending, num_returns=1):
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref):
        return ref.outcome


@pytest.mark.slow
def test_every_executor_gets_the_same_measuring_job(tmp_path: Path, monkeypatch) -> None:
    """The local executor and RayExecutor's real submission get measure_one with the sweep's
    settings: the Ray worker measures exactly as the local process does (warm-up, repeats,
    medians come from measure_case)."""
    local_jobs: list[Job] = []

    class Recording(LocalExecutor):
        def run(self, jobs, *, on_start=None):
            local_jobs.extend(jobs)
            return super().run(jobs, on_start=on_start)

    fake = _FakeRay()
    ray_executor = RayExecutor()
    monkeypatch.setattr(ray_executor, "_connect", lambda: fake)
    monkeypatch.setattr(ray_executor, "prepare", lambda jobs: None)
    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128)).cases()
    settings = MeasureSettings(metrics=("predict",), time_budget_s=0.25, min_repeats=5, threads=1)
    for name, executor in (("local", Recording()), ("ray", ray_executor)):
        with ResultStore(tmp_path / f"{name}.sqlite") as store:
            run_sweep(cases, store, settings=settings, executor=executor, progress=False)
    assert len(local_jobs) == len(fake.submitted) == 2
    for job, sent in zip(local_jobs, fake.submitted):
        assert job.fn is measure_one and job.args[1] == settings and job.threads == 1
        assert job.kwargs["measure"] is None  # measure_one -> measure_case
        assert sent["task"] is run_job
        assert sent["args"] == (job.fn, job.args, job.kwargs)
        assert (sent["key"], sent["device"], sent["threads"]) == (job.key, job.device, job.threads)
        assert sent["options"]["num_cpus"] == job.threads
        assert sent["options"]["resources"] == {TIMING_SLOT: 1}  # one CPU case per node at once


def test_a_cluster_without_timing_slots_is_refused_for_cpu_cases(monkeypatch) -> None:
    fake = _FakeRay()
    fake.nodes = lambda: [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}]
    executor = RayExecutor()
    monkeypatch.setattr(executor, "_connect", lambda: fake)
    job = Job(key="k", label="k", fn=json.loads, device="cpu", threads=1)
    with pytest.raises(RayError, match=re.escape("""--resources '{"zoo_timing_slot": 1}'""")):
        executor.prepare([job])
    executor.prepare([Job(key="g", label="g", fn=json.loads, device="cuda", threads=1)])


def test_training_runs_are_untimed_and_share_ray_nodes() -> None:
    """A timed CPU case takes its node's timing slot; a training run (untimed) does not, so
    runs train side by side on a node's CPUs."""
    timed = Job(key="t", label="t", fn=json.loads, device="cpu", threads=1)
    training = Job(key="r", label="r", fn=json.loads, device="cpu", threads=1, timed=False)
    assert RayExecutor().slots(timed) == {TIMING_SLOT: 1.0}
    assert RayExecutor().slots(training) == {}


def _interval(seconds: float) -> tuple[float, float]:
    start = time.monotonic()  # one clock for every process of the machine
    time.sleep(seconds)
    return start, time.monotonic()


@pytest.mark.slow
def test_processes_time_timed_jobs_one_at_a_time() -> None:
    """Timed jobs (bench cases) never overlap each other or an untimed job, whatever --workers."""
    timed = [Job(key=f"t{i}", label="t", fn=_interval, args=(0.3,)) for i in range(3)]
    untimed = [Job(key=f"u{i}", label="u", fn=_interval, args=(0.3,), timed=False) for i in "01"]
    outcomes = {o.key: o.value for o in PoolExecutor(workers=2).run([*timed, *untimed])}
    spans = sorted(outcomes[j.key] for j in timed)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert max(outcomes[j.key][1] for j in untimed) <= spans[0][0]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _suicide(marker: str) -> int:
    """Kill this worker process the first time (marker file absent), return 7 after."""
    if not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return 7


@pytest.mark.slow
def test_processes_run_jobs_and_retry_a_killed_worker(tmp_path: Path) -> None:
    """Outcomes of every job; an exception is an error outcome; a worker killed mid-job takes
    its pool down, and the unfinished jobs run again in a fresh one (bounded)."""
    jobs = [
        Job(key="ok", label="ok", fn=json.loads, args=("[1]",), timed=False),
        Job(key="raises", label="raises", fn=json.loads, args=("{",), timed=False),
        Job(key="killed", label="killed", fn=_suicide, args=(str(tmp_path / "m"),), timed=False),
    ]
    executor = PoolExecutor(workers=2)
    executor.prepare(jobs)
    outcomes = {o.key: o for o in executor.run(jobs)}
    assert outcomes["ok"].value == [1] and outcomes["ok"].environment is not None
    assert outcomes["raises"].error.startswith("JSONDecodeError")
    assert outcomes["killed"].ok and outcomes["killed"].value == 7  # its second try


@pytest.mark.slow
def test_a_worker_that_always_dies_fails_its_own_job_only() -> None:
    """The killer is found (run again alone) and stored as an error after its retries; the jobs
    that were waiting, or running beside it, all run."""
    others = [Job(key=f"s{i}", label="s", fn=time.sleep, args=(0.2,), timed=False) for i in "0123"]
    dies = Job(key="d", label="d", fn=_die, timed=False)
    outcomes = {o.key: o for o in PoolExecutor(workers=2, max_retries=1).run([dies, *others])}
    assert "worker process died" in outcomes["d"].error and "1 retry too" in outcomes["d"].error
    assert all(outcomes[j.key].ok for j in others) and len(outcomes) == 5


# a pool of 2 workers: a quick job (its outcome printed once a worker has started), then 2 long
DRIVER = """
import time
from attention_zoo.executors import Job, PoolExecutor
jobs = [Job(key="quick", label="q", fn=time.sleep, args=(0,), timed=False)]
jobs += [Job(key=str(i), label="s", fn=time.sleep, args=(120,), timed=False) for i in range(2)]
for outcome in PoolExecutor(workers=2).run(jobs):
    print(outcome.key, flush=True)
"""


def _stat(pid: int | str) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # ended, or ended while read
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has ended)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _children(pid: int) -> set[int]:
    """The live processes whose parent is `pid`."""
    pids = (int(p.name) for p in Path("/proc").glob("[0-9]*"))
    return {c for c in pids if (stat := _stat(c)) and stat[1] == pid and stat[0] != "Z"}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_workers_end_when_their_driver_is_killed() -> None:
    """A driver killed without the chance to end its pool (SIGKILL; SIGTERM alike) leaves no
    worker training on: each watches its parent and exits when it is gone."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "quick"  # a worker has started: it is watching
        workers = _children(driver.pid)
        assert workers
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 30
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, "workers outlived their driver"


def _unpicklable_result() -> object:
    return lambda: None


@pytest.mark.slow
def test_a_job_that_cannot_travel_is_its_own_error() -> None:
    """Arguments that cannot be pickled, or a result that cannot come back: that job's error, and
    the sweep goes on."""
    jobs = [
        Job(key="args", label="a", fn=json.loads, args=(lambda: None,), timed=False),
        Job(key="result", label="r", fn=_unpicklable_result, timed=False),
        Job(key="ok", label="o", fn=json.loads, args=("[2]",), timed=False),
    ]
    outcomes = {o.key: o for o in PoolExecutor(workers=1).run(jobs)}
    assert "cannot go to a worker" in outcomes["args"].error
    assert not outcomes["result"].ok and outcomes["ok"].value == [2]


SUITE = """task = "mine-task"
[presets.smoke]
description = "a plugin's task"
task = { seq_len = 16, vocab_size = 8, eval_size = 32 }
model = { axial_pos_embds = false, hidden_size = 32, num_attention_heads = 2, \
  feed_forward_size = 64, num_hidden_layers = 1 }
train = { max_steps = 3, eval_every = 3, batch_size = 4, target_accuracy = 0.9 }
grid = { backends = ["full"], seeds = [0, 1] }
"""


@pytest.mark.slow
@pytest.mark.usefixtures("clean_registries")
def test_a_plugin_task_trains_in_worker_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task class a plugin file defines (test_plugins' `mine-task`) travels to the workers:
    they load the plugins before they read a job."""
    (tmp_path / "zoo_pool_plugin.py").write_text(PLUGIN_SOURCE)
    (tmp_path / "pool-task.toml").write_text(SUITE)
    store = tmp_path / "zoo.sqlite"
    argv = ["task", str(tmp_path / "pool-task.toml"), "--preset", "smoke"]
    argv += ["--import", str(tmp_path / "zoo_pool_plugin.py"), "--store", str(store), "--quiet"]
    assert main([*argv, "--executor", "processes", "--workers", "2"]) == 0
    capsys.readouterr()
    with ResultStore(store) as s:
        assert [(c["status"], c["error"]) for c in s.cases()] == [("ok", None)] * 2


@pytest.mark.slow
def test_task_runs_on_processes_give_the_local_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two seeds side by side in two workers: the local executor's runs, metric for metric and
    value for value (wall time aside), and the driver alone writes the store."""
    argv = ["task", "duplication", "--preset", "smoke", "--max-steps", "6", "--quiet"]
    argv += ["--threads", "1", "--seeds", "0,1"]
    local, pooled = tmp_path / "local.sqlite", tmp_path / "pool.sqlite"
    assert main([*argv, "--store", str(local)]) == 0
    assert main([*argv, "--store", str(pooled), "--executor", "processes", "--workers", "2"]) == 0
    assert "executor processes (2 workers here)" in capsys.readouterr().out

    def values(path: Path) -> dict[tuple[str, str], float]:
        with ResultStore(path) as store:
            return {
                (r["case_key"], r["metric"]): r["value"]
                for r in store.rows()
                if r["metric"] != "wall_time_s"
            }

    want = values(local)
    assert len({key for key, _ in want}) == 2 and values(pooled) == want


def test_a_job_that_raises_is_an_error_outcome_with_the_environment() -> None:
    outcome = run_job(json.loads, ("{",), {}, key="k", device="cpu", threads=3)
    assert not outcome.ok and outcome.error.startswith("JSONDecodeError")
    assert outcome.environment.threads == 3 and outcome.environment.host


# ---- on a local Ray runtime ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_runtime():
    """One local Ray runtime (2 CPUs) for the module; workers import this checkout and tests/."""
    ray = pytest.importorskip("ray")
    # what Ray leaves set in this process (variables, sys.path, hooks) is put back after it
    env, path, hook = dict(os.environ), list(sys.path), sys.excepthook
    sigterm = signal.getsignal(signal.SIGTERM)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    ray.init(
        num_cpus=2,
        resources={TIMING_SLOT: 1},
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    yield ray
    ray.shutdown()
    os.environ.clear()
    os.environ.update(env)
    sys.path[:], sys.excepthook = path, hook
    signal.signal(signal.SIGTERM, sigterm)


def _pairs(rows: list) -> list[tuple[str, str]]:
    """(case_key, metric) of stored rows, free_cores left out: it is stored only for a timing long
    enough to read the load, so whether a case has it depends on the run."""
    return [(r["case_key"], r["metric"]) for r in rows if r["metric"] != "free_cores"]


def _statuses(store: ResultStore, run_id: str) -> dict[str, str]:
    return {c["case_key"]: c["status"] for c in store.cases(run_id)}


@pytest.mark.slow
@pytest.mark.long
def test_quick_preset_on_ray_gives_the_local_cases_and_statuses(
    ray_runtime, tmp_path: Path
) -> None:
    """The quick preset's grid, every backend and target (at its shorter length and with the
    backward, memory and prediction only for time)."""
    grid = load_sweep_preset("quick").grid
    cases = [
        c for c in grid.cases() if c.seq_len == min(grid.seq_lens) and c.mode == "forward+backward"
    ]
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        local = run_sweep(cases, store, settings=FAST, progress=False)
        remote = run_sweep(
            cases, store, settings=FAST, progress=False, executor=RayExecutor(cpus_per_case=1)
        )
        assert _statuses(store, local.run_id) == _statuses(store, remote.run_id)
        assert set(_statuses(store, local.run_id).values()) >= {"ok"}
        rows = store.rows(remote.run_id)
        metrics = set(_pairs(store.rows(local.run_id)))
    assert set(_pairs(rows)) == metrics
    assert all(json.loads(r["environment"])["threads"] == 1 for r in rows)


def _timing_rows(store: ResultStore, run_id: str) -> dict[str, float]:
    return {r["metric"]: r["value"] for r in store.rows(run_id) if r["metric"]}


@pytest.mark.slow
def test_ray_worker_times_with_warmup_and_repeats_like_local(ray_runtime, tmp_path: Path) -> None:
    settings = MeasureSettings(metrics=("time",), time_budget_s=0.0, min_repeats=4, threads=1)
    cases = [BenchCase(target="attention", backend="full", seq_len=64, mode="forward")]
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        local = run_sweep(cases, store, settings=settings, progress=False)
        remote = run_sweep(cases, store, settings=settings, progress=False, executor=RayExecutor())
        a, b = _timing_rows(store, local.run_id), _timing_rows(store, remote.run_id)
    assert set(a) == set(b) >= {"time_median", "time_iqr", "time_min", "time_repeats"}
    assert a["time_repeats"] == b["time_repeats"] == 4  # budget 0: exactly min_repeats, both


def _die_first_time(marker_dir: str, case: BenchCase, settings: MeasureSettings) -> CaseResult:
    """Kills its worker process on a case's first attempt (a marker file remembers attempts)."""
    marker = Path(marker_dir) / f"{case.seq_len}.attempts"
    attempts = int(marker.read_text()) + 1 if marker.exists() else 1
    marker.write_text(str(attempts))
    if attempts == 1:
        os._exit(1)
    return CaseResult(case=case, status="ok", rows=[Metric("attempts", attempts, "count")])


def _always_die(case: BenchCase, settings: MeasureSettings) -> CaseResult:
    os._exit(1)


@pytest.mark.long
@pytest.mark.slow
def test_worker_killed_mid_case_is_retried_then_recorded(ray_runtime, tmp_path: Path) -> None:
    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128)).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        retried = run_sweep(
            cases,
            store,
            progress=False,
            measure=functools.partial(_die_first_time, str(tmp_path)),
            executor=RayExecutor(max_retries=1),
        )
        assert [r.status for r in retried.results] == ["ok", "ok"]
        assert {r.value("attempts") for r in retried.results} == {2.0}  # died once, then ran
        assert store.run(retried.run_id)["finished_at"] is not None
        dead = run_sweep(
            cases[:1],
            store,
            progress=False,
            measure=_always_die,
            executor=RayExecutor(max_retries=1),
        )
        (case,) = store.cases(dead.run_id)
    assert case["status"] == "error" and "its Ray worker died" in case["error"]
    assert "1 retry too" in case["error"]


KILL_GRID = [
    "bench", "--target", "attention", "--backends", "full,sdpa", "--lengths", "64,128,256,512",
    "--metrics", "time", "--budget", "0.5", "--repeats", "1", "--threads", "1", "--no-progress",
]  # fmt: skip


def _stored_cases(path: Path) -> int:
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("SELECT count(*) FROM cases").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
@pytest.mark.long
def test_driver_killed_mid_sweep_resumes_to_the_uninterrupted_rows(
    ray_runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    killed, whole = tmp_path / "killed.sqlite", tmp_path / "whole.sqlite"
    command = [sys.executable, "-m", "attention_zoo", *KILL_GRID, "--executor", "ray"]
    driver = subprocess.Popen(
        [*command, "--store", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the Ray runtime it starts is cleaned up
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 300
        while _stored_cases(killed) < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
        driver.send_signal(signal.SIGKILL)  # the driver alone, mid-sweep
        driver.wait(30)
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # the runtime it left behind
        except ProcessLookupError:
            pass
    before = _stored_cases(killed)
    assert 2 <= before < 8
    assert main([*KILL_GRID, "--store", str(killed), "--executor", "ray", "--resume"]) == 0
    assert main([*KILL_GRID, "--store", str(whole)]) == 0
    capsys.readouterr()
    with ResultStore(killed) as a, ResultStore(whole) as b:
        (run,) = a.runs()  # the killed run was continued, not a new one started
        resumed = _pairs(a.rows())
        uninterrupted = _pairs(b.rows())
        assert run["finished_at"] is not None and run["n_cases"] == 8
    assert len(resumed) == len(set(resumed))  # no row twice
    assert set(resumed) == set(uninterrupted)  # none lost


@pytest.mark.long
@pytest.mark.slow
def test_task_smoke_preset_on_ray_gives_the_local_runs_and_statuses(
    ray_runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["task", "duplication", "--preset", "smoke", "--max-steps", "10", "--quiet"]
    argv += ["--threads", "1"]
    local, remote = tmp_path / "local.sqlite", tmp_path / "ray.sqlite"
    assert main([*argv, "--store", str(local)]) == 0
    assert main([*argv, "--store", str(remote), "--executor", "ray"]) == 0
    out = capsys.readouterr().out
    assert "[1/1] shared-qk seed 0:" in out
    with ResultStore(local) as a, ResultStore(remote) as b:
        expected = {c["case_key"]: c["status"] for c in a.cases()}
        assert {c["case_key"]: c["status"] for c in b.cases()} == expected
        metrics = {(r["case_key"], r["metric"]) for r in a.rows()}
        assert {(r["case_key"], r["metric"]) for r in b.rows()} == metrics
        assert {json.loads(r["environment"])["threads"] for r in b.rows()} == {1}


PLUGIN = """
from dataclasses import dataclass

from attention_zoo import AttentionCore, register_attention


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    '''No options.'''


@register_attention("test-plugin-full", config=NoOptions)
class PluginFull(AttentionCore):
    '''Softmax attention from a plugin file.'''

    def attend(self, q, k, v, key_padding_mask):
        import torch

        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        if self.causal:  # exact means exact: the runner compares it with full attention
            n = q.shape[-2]
            later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(later, float("-inf"))
        return torch.softmax(scores, -1) @ v
"""


@pytest.mark.slow
def test_a_plugin_backend_runs_on_ray_workers(
    ray_runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--import registers the backend in the driver; each Ray worker loads the same plugin."""
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN)
    store = tmp_path / "zoo.sqlite"
    argv = ["bench", "--import", str(plugin), "--target", "attention"]
    argv += ["--backends", "test-plugin-full", "--lengths", "64", "--metrics", "memory"]
    from attention_zoo.attention.spec import BACKENDS
    from attention_zoo.plugins import PLUGINS

    before = {id(r): set(r.names()) for r in (BACKENDS, PLUGINS)}
    try:
        assert main([*argv, "--store", str(store), "--executor", "ray", "--no-progress"]) == 0
    finally:  # nothing the plugin registered stays for other tests
        for registry in (BACKENDS, PLUGINS):
            for name in set(registry.names()) - before[id(registry)]:
                registry.remove(name)
    capsys.readouterr()
    with ResultStore(store) as s:
        ((status, error),) = [(c["status"], c["error"]) for c in s.cases()]
    assert status == "ok", error
