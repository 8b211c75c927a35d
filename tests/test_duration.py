"""A case's time predicted before it runs (its FLOPs at this machine's rate, measured once and
cached), a case predicted past the limit not run, progress and --timeout inside a case, and Ctrl-C
that ends a command stuck inside one long operation within seconds, its run resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_zoo.measure import duration, rate
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK, TIMEOUT
from attention_zoo.store import ResultStore, run_status

CASE = BenchCase(target="attention", backend="sdpa", seq_len=128)


def test_the_rate_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = rate.machine_rate("cpu", rate.torch.float32)
    assert first.source == "measured now" and first.flops_per_s > 0
    monkeypatch.setattr(rate, "_measure", lambda *_: pytest.fail("measured again"))
    again = rate.machine_rate("cpu", rate.torch.float32)
    assert again.flops_per_s == first.flops_per_s and again.source == str(rate.cache_file())
    assert list(json.loads(rate.cache_file().read_text())) == [first.key]


def _slow_machine(monkeypatch, flops_per_s: float) -> None:
    fixed = rate.Rate(flops_per_s, "test", "test")
    monkeypatch.setattr(duration, "machine_rate", lambda *_: fixed)


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


def test_a_case_within_the_limit_runs(monkeypatch):
    _slow_machine(monkeypatch, 1e15)
    settings = MeasureSettings(metrics=("time",), time_limit_s=60, time_budget_s=0)
    assert measure_case(CASE, settings).status == OK


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


@pytest.mark.slow  # a fresh interpreter with torch, a few seconds
def test_ctrl_c_ends_a_process_stuck_in_one_long_operation():
    code, took, out = _interrupt_when([sys.executable, "-c", STUCK], "inside", "stdout")
    assert code == 130 and took < 5, (code, took)
    assert "the operation finished" not in out


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
