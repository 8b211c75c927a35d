"""Busy means busy: every budgeted timing lasts long enough to read the cores other processes used
while it ran, so a fast case is judged by its own reading, never by the run's start and end
samples taken at other moments (a transient there marked every fast case of an idle machine's first
quick run busy). Planted: an idle machine (the counters show this process alone) with a busy blip
at the run's start; and real load (processes spinning on every core)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_zoo.measure import load, trust
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import measure_case
from attention_zoo.measure.table import comparison_table, group_cases
from attention_zoo.presets import load_sweep_preset
from attention_zoo.report.frame import case_frame
from attention_zoo.store import ResultStore
from attention_zoo.sweep import run_sweep

# what `zoo bench --preset quick` times with (a 0.15 s budget, at most 20 rounds), time only, by
# the wall clock (the preset's CPU clock reads no load: these tests are about the wall clock's)
QUICK = dataclasses.replace(
    load_sweep_preset("quick").settings, metrics=("time",), threads=1, clock="wall"
)
FAST = BenchCase(target="attention", backend="sdpa", seq_len=16, num_heads=1, head_dim=8)


def _this_process_alone() -> tuple[int, int]:
    """CPU counters (busy, total jiffies over 2 cores) of a machine where only this process runs."""
    return round(time.process_time() * 100), round(time.perf_counter() * 100 * 2)


@pytest.mark.slow
def test_a_fast_case_on_an_idle_machine_is_judged_by_its_own_reading(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: its 20 rounds took a few ms, too short to read, so the run's start sample (busy for
    a moment, as at a first run) marked it busy in the report."""
    monkeypatch.setattr(load, "cpu_count", lambda: 2)
    monkeypatch.setattr(load, "_cpu_times", _this_process_alone)
    samples = iter([load.Load(2.0, load.SAMPLED), load.Load(0.0, load.SAMPLED)])  # start, end
    monkeypatch.setattr("attention_zoo.store.machine_load", lambda: next(samples))
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_sweep([FAST], store, settings=QUICK, progress=False)
        rows, runs = store.rows(), store.runs()
    assert runs[0]["load_start"] == 2.0  # the blip is recorded with the run
    metrics = {r["metric"]: r["value"] for r in rows}
    assert metrics["time_repeats"] > QUICK.max_repeats  # timed on until the load can be read
    assert metrics["free_cores"] >= 2 - load.SLACK  # its own reading: this process alone
    (case,) = case_frame(rows, runs).to_dict("records")
    # busy: never; unstable (a 16-token step's spread on a shared machine) is another mark's call
    assert case["busy"] is False and not [m for m in case["marks"] if m.startswith("busy")]
    assert "busy" not in comparison_table(group_cases(rows), reference=None)


@pytest.mark.slow
def test_a_timing_without_a_budget_keeps_the_repeats_asked_for() -> None:
    exact = dataclasses.replace(QUICK, time_budget_s=0.0, min_repeats=3)
    result = measure_case(FAST, exact)
    assert result.value("time_repeats") == 3  # --budget 0: exactly --repeats, as documented


@pytest.mark.slow
@pytest.mark.real_load
def test_a_fast_case_beside_spinning_processes_is_marked_busy() -> None:
    """Real load: before, a fast case had no reading of its own and went unmarked."""
    if load._cpu_times() is None:
        pytest.skip("no /proc/stat here: the load of a case cannot be read")
    spin = "import time\nprint('up', flush=True)\nt = time.time()\nwhile time.time() < t + 20: pass"
    procs = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        for _ in range(3 * (os.cpu_count() or 1))
    ]
    try:
        assert all(p.stdout.readline().strip() == "up" for p in procs)
        result = measure_case(FAST, QUICK)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    metrics = {r.metric: r.value for r in result.rows}
    assert metrics["free_cores"] < 1 - load.SLACK, metrics
    marks = trust.timing_marks(metrics, threads=1, device="cpu")
    assert trust.BUSY in [m.kind for m in marks]


@pytest.mark.slow
@pytest.mark.real_load
def test_the_probe_attributes_every_timing_window(tmp_path) -> None:
    """benchmarks/scripts/busy_probe.py: one window per timing, its cores split by who used them."""
    if load._cpu_times() is None:
        pytest.skip("no /proc/stat here")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))
    import busy_probe

    flags = ["--target", "attention", "--backends", "sdpa,full", "--lengths", "16",
             "--metrics", "time", "--budget", "0.05", "--threads", "1"]  # fmt: skip
    flags.append("--no-progress")
    windows = busy_probe.probe(flags, tmp_path / "s.sqlite")
    with ResultStore(tmp_path / "s.sqlite", write=False) as store:
        attempts = [r["value"] for r in store.rows() if r["metric"] == "time_attempts"]
    assert len(windows) == sum(attempts) >= 2  # one window per timing (a case timed again: more)
    for w in windows:
        assert w["wall"] >= load.MIN_WINDOW_S and 0 <= w["own"] <= 1.5 and w["machine"] >= 0
        assert w["others"] == pytest.approx(max(0.0, w["machine"] - w["own"]))
