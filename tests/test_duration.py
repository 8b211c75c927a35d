"""A case's time predicted before it runs (its FLOPs at this machine's rate, measured once and
cached), a case predicted past the limit not run, progress and --timeout inside a case, and Ctrl-C
that ends a command stuck inside one long operation within seconds, its run resumable."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_zoo.cli import main
from attention_zoo.measure import duration, preflight, rate, runner
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.memory import rss_supported
from attention_zoo.measure.predict import predict_case, predict_flops
from attention_zoo.measure.preflight import time_check
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK, TIMEOUT
from attention_zoo.measure.timing import fixed_threads
from attention_zoo.measure.worker import run_isolated
from attention_zoo.store import ResultStore, run_status

CASE = BenchCase(target="attention", backend="sdpa", seq_len=128)


def test_the_rate_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = rate.case_rate(CASE)
    assert first.source == "measured now" and first.flops_per_s > 0
    monkeypatch.setattr(rate, "_fastest_step", lambda *_: pytest.fail("measured again"))
    again = rate.case_rate(CASE)
    assert again.flops_per_s == first.flops_per_s and again.source == str(rate.cache_file())
    assert list(json.loads(rate.cache_file().read_text())) == [first.key]


def test_a_rate_timed_by_the_wall_clock_while_the_cores_were_busy_is_not_kept(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(rate, "free_cores", lambda *_: 0.0)  # others held every core
    with fixed_threads(2):  # timed by the wall clock: the load inflates it
        assert "busy" in rate.case_rate(CASE).source and not rate.cache_file().exists()
    with fixed_threads(1):  # timed by its own CPU time: kept
        assert rate.case_rate(CASE).source == "measured now" and rate.cache_file().exists()


def test_the_preflight_says_when_it_times_cases_and_not_when_their_rates_are_cached(
    tmp_path, monkeypatch, caplog
):
    """Timing a case to predict it can take long (on a GPU each probe compiles): it is said, once
    per run, with the flag that skips it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    settings = MeasureSettings(time_limit_s=300, threads=1)  # CPU-timed: cached on a busy machine
    cases = [dataclasses.replace(CASE, seq_len=n) for n in (2048, 4096)]  # one 1024-token probe
    with caplog.at_level("WARNING", logger="attention_zoo.measure.preflight"):
        assert time_check(cases, settings).refused == {}
        assert time_check(cases, settings).refused == {}
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("timing 1 case once (at up to 1024 tokens) to predict the run's time")
    assert "--time-limit none skips this" in said


def test_a_probe_that_is_a_case_of_the_grid_is_not_counted_again(tmp_path, monkeypatch):
    """The time check predicts every case first; a rate's probe (the case at 1024 tokens) that is
    one of them, or the case itself, takes its FLOPs from that count, as it would count itself."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    counted, rates = [], []
    real_count, real_rate = rate.predict_flops, rate.case_rate
    monkeypatch.setattr(rate, "predict_flops", lambda c: counted.append(c) or real_count(c))
    monkeypatch.setattr(rate, "_fastest_step", lambda *_: 0.5)
    monkeypatch.setattr(
        duration, "case_rate", lambda case, probe: rates.append(probe) or real_rate(case, probe)
    )
    settings = MeasureSettings(time_limit_s=300, threads=1)
    probe = dataclasses.replace(CASE, seq_len=1024)
    time_check([dataclasses.replace(CASE, seq_len=4096), probe], settings)
    assert counted == [] and rates[0] == predict_flops(probe)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cold"))
    time_check([dataclasses.replace(CASE, seq_len=4096)], settings)  # its probe is not in it
    assert counted == [probe]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "colder"))
    duration.expected_duration(probe, rates[0], ("time",), warmup=1, min_repeats=1)
    assert counted == [probe] and rates[-1] == rates[0]  # the case is its own probe (the runner)


def test_a_case_is_predicted_at_the_rate_of_its_own_step(tmp_path, monkeypatch):
    """Each variant's step is timed (at most CALIBRATION_LENGTH tokens): a materialised softmax
    and a fused kernel that skips the masked half run at very different FLOP rates."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    probes = []
    monkeypatch.setattr(rate, "_fastest_step", lambda case, _: probes.append(case) or 0.5)
    n = rate.CALIBRATION_LENGTH
    for backend in ("full", "sdpa"):
        short = BenchCase(target="attention", backend=backend, seq_len=n)
        long = BenchCase(target="attention", backend=backend, seq_len=4 * n)
        at = duration.expected_duration(
            long, predict_flops(long), ("time",), warmup=1, min_repeats=1
        )
        assert probes[-1] == short  # the same case, shortened
        assert at.step_s == pytest.approx(0.5 * predict_flops(long) / predict_flops(short))
    assert [p.backend for p in probes] == ["full", "sdpa"]


def _slow_machine(monkeypatch, flops_per_s: float) -> None:
    fixed = rate.Rate(flops_per_s, "test", "test")
    monkeypatch.setattr(duration, "case_rate", lambda *_: fixed)


@pytest.mark.parametrize(
    "device,metrics,steps",
    [
        ("cpu", ("crosscheck",), 2),  # the output check and the tracked peak
        pytest.param(  # with the profiled peak and RSS beside it
            "cpu",
            ("memory", "crosscheck"),
            4,
            marks=pytest.mark.skipif(not rss_supported(), reason="no RSS reset here"),
        ),
        ("cuda", ("memory", "crosscheck"), 3),  # no RSS on CUDA
    ],
)
def test_the_expected_steps_are_those_the_runner_takes(device, metrics, steps):
    case = BenchCase(seq_len=64, mode="forward", device=device)
    assert duration.step_count(case, metrics, warmup=1, min_repeats=3) == steps


@pytest.mark.slow
def test_a_case_predicted_past_the_limit_is_not_run(monkeypatch):
    _slow_machine(monkeypatch, 1e6)  # a million FLOPs a second: any case takes hours
    built = []
    monkeypatch.setattr("attention_zoo.measure.runner.build_runnable", built.append)
    settings = MeasureSettings(metrics=("time", "flops"), time_limit_s=60)
    result = measure_case(CASE, settings)
    assert result.status == TIMEOUT and not built
    assert result.error.startswith("not run: predicted ")
    assert "at 0.00100 GFLOP/s" in result.error and "> --time-limit 60 s" in result.error
    assert result.value("flops") > 0  # what was known before the run is kept


@pytest.mark.slow
def test_a_case_within_the_limit_runs(monkeypatch):
    _slow_machine(monkeypatch, 1e15)
    settings = MeasureSettings(metrics=("time",), time_limit_s=60, time_budget_s=0)
    assert measure_case(CASE, settings).status == OK


def test_a_grid_predicted_past_the_limit_is_refused_in_one_line_and_nothing_stored(
    tmp_path, capsys
):
    store = tmp_path / "s.sqlite"
    code = main(["bench", "--backends", "sdpa", "--lengths", "1048576", "--store", str(store)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not store.exists()
    assert err[0].startswith("zoo bench: error: block:sdpa L=1048576")
    assert "not run: predicted" in err[0] and "> --time-limit 300 s" in err[0]


@pytest.mark.slow
def test_refused_cases_leave_the_others_to_run_and_the_run_resumable(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    argv = ["bench", "--target", "attention", "--backends", "sdpa", "--lengths", "64,1048576"]
    argv += ["--metrics", "time", "--budget", "0", "--repeats", "1", "--store", str(store)]
    assert main([*argv, "--no-progress"]) == 0
    refused = [x for x in capsys.readouterr().err.splitlines() if "not run: predicted" in x]
    assert len(refused) == 1 and refused[0].startswith("zoo bench: attention:sdpa L=1048576")
    with ResultStore(store, write=False) as s:
        (run,) = s.runs()
        assert run_status(run) == "finished"
        assert [c["config"]["seq_len"] for c in s.cases(run["run_id"])] == [64]
    assert main([*argv, "--no-progress", "--resume"]) == 0  # the same run: nothing left to do
    assert "1 already stored (resumed)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_case_the_time_check_predicted_is_not_predicted_again_and_stores_its_numbers(
    tmp_path, monkeypatch, capsys
):
    """zoo bench's time check predicts every case (its FLOPs set the expected time); the run
    stores those predictions instead of making each again, plain and interleaved alike."""
    made = []

    def counted(case, device=None):
        made.append(case.key())
        return predict_case(case, device)

    monkeypatch.setattr(preflight, "predict_case", counted)
    monkeypatch.setattr(runner, "predict_case", counted)
    argv = ["bench", "--target", "attention", "--backends", "sdpa,local", "--lengths", "64"]
    argv += ["--metrics", "predict,flops", "--no-progress", "--threads", "1"]
    for interleave in ([], ["--interleave"]):
        made.clear()
        store = tmp_path / f"s{len(interleave)}.sqlite"
        assert main([*argv, *interleave, "--store", str(store)]) == 0
        assert sorted(made) == sorted(set(made)) and len(made) == 2
        with ResultStore(store, write=False) as s:
            (run,) = s.runs()
            rows = {(r["case_key"], r["metric"]): r["value"] for r in s.rows(run["run_id"])}
            cases = [BenchCase.from_dict(c["config"]) for c in s.cases(run["run_id"])]
        assert sorted(c.key() for c in cases) == sorted(made)
        for case in cases:
            prediction = predict_case(case)
            assert rows[(case.key(), "flops")] == prediction.flops
            assert rows[(case.key(), "predicted_peak_bytes")] == prediction.peak_bytes
    capsys.readouterr()


@pytest.mark.slow
def test_an_isolated_case_takes_the_prediction_made_before_the_run():
    """--isolate measures a case in a subprocess: the prediction made before the run travels
    with it and is stored, not made again there."""
    made = dataclasses.replace(predict_case(CASE), flops=123)
    result = run_isolated(CASE, MeasureSettings(metrics=("flops",)), predicted=made)
    assert result.status == OK, result.error
    assert [r.value for r in result.rows if r.metric == "flops"] == [123]


@pytest.mark.slow
def test_timeout_stops_a_case_after_the_step_that_crosses_it(monkeypatch):
    _slow_machine(monkeypatch, 1e15)  # predicted instant: only the clock stops it
    settings = MeasureSettings(
        metrics=("memory", "time"), timeout_s=1e-6, time_budget_s=0, min_repeats=3
    )
    result = measure_case(CASE, settings)
    assert result.status == TIMEOUT
    assert "past --timeout" in result.error and "(after 1 step)" in result.error


def test_durations_read_in_their_unit():
    assert [duration.format_duration(s) for s in (0.25, 12, 246, 22320)] == [
        "0.25 s",
        "12 s",
        "4.1 min",
        "6.2 h",
    ]


STUCK = """
import sys, torch
import torch.nn.functional as F
from attention_zoo.interrupts import stop_when_stuck
torch.set_num_threads(1)
q = torch.randn(1, 4, 65536, 64)  # one SDPA call of 4.4 TFLOP: minutes on one thread
with stop_when_stuck(lambda: "last words") as taken:
    print("inside", flush=True)
    F.scaled_dot_product_attention(q, q, q)
print("the operation finished", flush=True)
"""


def _interrupt_when(argv: list[str], marker: str, stream: str) -> tuple[int, float, str]:
    """Run argv with Ctrl-C possible; send SIGINT a second after `marker` appears on `stream`;
    (exit code, seconds from the signal to the exit, the stream's text)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    seen = []
    for line in pipe:
        seen.append(line)
        if marker in line:
            break
    time.sleep(1.0)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("still running 60 s after Ctrl-C")
    took = time.perf_counter() - sent
    return proc.returncode, took, "".join(seen) + pipe.read()


@pytest.mark.long
@pytest.mark.slow  # a fresh interpreter with torch, a few seconds each
@pytest.mark.parametrize("words", ["fine", "failing"])
def test_ctrl_c_ends_a_process_stuck_in_one_long_operation(words):
    """Ended with code 130, its last words said; last words that fail (a locked store, a full
    disk) end it all the same, saying why."""
    script = STUCK
    if words == "failing":
        script = STUCK.replace('lambda: "last words"', "lambda: open('/nonexistent/x')")
    code, took, out = _interrupt_when([sys.executable, "-c", script], "inside", "stdout")
    assert code == 130 and took < 5, (code, took)
    assert "the operation finished" not in out


@pytest.mark.long
@pytest.mark.slow  # zoo bench in a fresh interpreter until its case is inside one long operation
def test_ctrl_c_inside_a_long_case_leaves_the_run_interrupted_and_resumable(tmp_path):
    store = tmp_path / "s.sqlite"
    argv = [sys.executable, "-m", "attention_zoo", "bench", "--target", "attention"]
    argv += ["--backends", "sdpa", "--lengths", "65536", "--threads", "1", "--metrics", "time"]
    argv += ["--time-limit", "1e9", "--memory-limit", "none", "--store", str(store)]
    code, took, err = _interrupt_when([*argv, "--no-progress"], "expected to take", "stderr")
    assert code == 130 and took < 5, (code, took, err)
    assert "interrupted" in err.splitlines()[-1] and "--resume" in err.splitlines()[-1]
    with ResultStore(store, write=False) as s:
        (run,) = s.runs()
        assert run_status(run) == "interrupted"


def test_a_case_that_fails_while_timed_keeps_its_failure(monkeypatch):
    """A step that raises once timing has started (out of memory, a timeout): that case is
    stored with its failure, not as ok without a time; the case timed beside it is ok."""
    build, time_until_stable = runner.build_runnable, runner.time_until_stable
    timing = {"on": False}

    def fragile(case):
        built = build(case)
        if case.backend == "local":
            step = built.step

            def failing():
                if timing["on"]:
                    raise RuntimeError("CUDA out of memory (planted) while timed")
                step()

            built.step = failing
        return built

    def timed(*args, **kwargs):
        timing["on"] = True
        return time_until_stable(*args, **kwargs)

    monkeypatch.setattr(runner, "build_runnable", fragile)
    monkeypatch.setattr(runner, "time_until_stable", timed)
    case = BenchCase(target="attention", backend="full", seq_len=64)
    settings = MeasureSettings(time_budget_s=0.0, metrics=("time",))
    full, local = runner.measure_group([case, case.replace(backend="local")], settings)
    assert full.status == OK and "time_median" in {m.metric for m in full.rows}
    assert local.status == "oom" and "planted" in local.error
