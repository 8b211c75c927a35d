"""Only trustworthy numbers are ranked: a plugin whose output breaks the contract is stored
`invalid` with its reason and never ranked; a time whose repeats disagree is timed again, then
marked unstable; a time taken while other processes kept the cores busy is marked and warned
about; a steady time on an idle machine carries no mark."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_zoo.measure import load, trust
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import MeasureSettings, measure_case, measure_group
from attention_zoo.measure.status import INVALID, OK
from attention_zoo.measure.timing import CPU_CLOCK, WALL, TimeStats
from attention_zoo.plugins import import_target
from attention_zoo.store import ResultStore
from attention_zoo.sweep import run_sweep

from .test_plugins import run

MODULE = "zoo_broken_plugin"
PLUGIN_SOURCE = '''
"""Attentions for the trust tests: four break the contract, two sleep (steadily, or not)."""

import time
from dataclasses import dataclass

import torch

from attention_zoo import AttentionCore, Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """No options."""


def softmax_attention(q, k, v, causal, scale=True):
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale else 1.0)
    if causal:
        n = q.shape[-2]
        later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(later, float("-inf"))
    return scores.softmax(-1) @ v


APPROXIMATE = Capabilities(exact=False)


@register_attention("broken-shape", config=NoOptions, caps=APPROXIMATE)
class BrokenShape(AttentionCore):
    """Drops the last token."""

    def attend(self, q, k, v, key_padding_mask):
        return softmax_attention(q, k, v, self.causal)[:, :, :-1]


@register_attention("broken-nan", config=NoOptions, caps=APPROXIMATE)
class BrokenNaN(AttentionCore):
    """All NaN."""

    def attend(self, q, k, v, key_padding_mask):
        return torch.full_like(q, float("nan"))


@register_attention("broken-dtype", config=NoOptions, caps=APPROXIMATE)
class BrokenDtype(AttentionCore):
    """Returns float64 whatever it is given."""

    def attend(self, q, k, v, key_padding_mask):
        return softmax_attention(q, k, v, self.causal).double()


@register_attention("broken-exact", config=NoOptions)
class BrokenExact(AttentionCore):
    """Claims to be exact, forgets the 1/sqrt(d) scale."""

    def attend(self, q, k, v, key_padding_mask):
        return softmax_attention(q, k, v, self.causal, scale=False)


@register_attention("picky-exact", config=NoOptions)
class PickyExact(AttentionCore):
    """Exact, but cannot run float64 (like a flash kernel) and forgets the scale in float16."""

    def attend(self, q, k, v, key_padding_mask):
        if q.dtype == torch.float64:
            raise RuntimeError("no float64 kernel")
        return softmax_attention(q, k, v, self.causal, scale=q.dtype != torch.float16)


class Sleeper(AttentionCore):
    """Exact attention, then a sleep of SLEEPS_S[call % len(SLEEPS_S)] seconds."""

    SLEEPS_S = (0.04,)  # long beside a loaded machine's wake-up delays (milliseconds)

    def attend(self, q, k, v, key_padding_mask):
        self.calls = getattr(self, "calls", -1) + 1
        time.sleep(self.SLEEPS_S[self.calls % len(self.SLEEPS_S)])
        return softmax_attention(q, k, v, self.causal)


@register_attention("steady", config=NoOptions)
class Steady(Sleeper):
    """40 ms every call."""


@register_attention("zigzag", config=NoOptions)
class Zigzag(Sleeper):
    """1 ms, 12 ms, 1 ms, 12 ms, ...: a median no repeat is near."""

    SLEEPS_S = (0.001, 0.012)
'''
BROKEN = {
    "broken-shape": "returned shape (1, 2, 31, 16), the contract says (1, 2, 32, 16)",
    "broken-nan": "1024 of 1024 output values are NaN or infinite (the inputs were finite)",
    "broken-dtype": "returned dtype torch.float64 for float32 inputs",
    "broken-exact": "exact backend 'broken-exact' disagrees with 'full' at n=48 (float64)",
}
FAST = MeasureSettings(
    time_budget_s=0.0, min_repeats=1, max_repeats=1, threads=1, metrics=("time",)
)


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None) -> Path:
    path = tmp_path / f"{MODULE}.py"
    path.write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import_target(MODULE)
    return path


def _case(backend: str, **changes) -> BenchCase:
    fields = dict(target="attention", backend=backend, seq_len=32, num_heads=2, head_dim=16)
    return BenchCase(**{**fields, **changes})


@pytest.mark.slow
def test_a_broken_output_is_stored_invalid_with_its_reason(plugin: Path) -> None:
    for backend, reason in BROKEN.items():
        result = measure_case(_case(backend), FAST)
        assert (result.status, backend) == (INVALID, backend)
        assert reason in result.error
        assert result.value("time_median") is None and result.value("peak_bytes") is None
    # a NaN core inside a block: the block's output is checked too
    block = measure_case(_case("broken-nan", target="block", hidden=32), FAST)
    assert block.status == INVALID and "NaN or infinite" in block.error
    # the honest ones pass: exact and right, and a non-causal case of the same wrong one fails
    assert measure_case(_case("full"), FAST).status == OK
    assert measure_case(_case("broken-exact", causal=False), FAST).status == INVALID


@pytest.mark.slow
@pytest.mark.long
def test_invalid_cases_are_shown_like_oom_and_never_ranked(
    plugin: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("pandas")
    backends = ",".join([*BROKEN, "full"])
    code, out, err = run(
        capsys, "--import", MODULE, "bench", "--target", "attention", "--backends", backends,
        "--lengths", "32", "--metrics", "time,memory", "--store", "zoo.sqlite",
        "--budget", "0", "--repeats", "1", "--threads", "1", "--no-progress",
    )  # fmt: skip
    assert code == 1 and f"{len(BROKEN)} case(s) ended error or invalid" in err  # a CI notices
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("attention ")}
    assert all(" invalid " in rows[b] for b in BROKEN) and " ok " in rows["full"]
    warned = [r.getMessage() for r in caplog.records]  # one line each
    assert any(
        "broken-nan L=32 b=1 forward float32 cpu: invalid: 8192 of 8192" in w for w in warned
    )
    with ResultStore("zoo.sqlite") as store:
        cases = {c["config"]["backend"]: c for c in store.cases()}
    assert {b: cases[b]["status"] for b in cases} == {**dict.fromkeys(BROKEN, INVALID), "full": OK}
    assert "disagrees with 'full'" in cases["broken-exact"]["error"]
    code, _, err = run(capsys, "report", "--store", "zoo.sqlite", "--out", "report")
    assert code == 0, err
    text = Path("report/report.md").read_text()
    headline = text.split("# Headline")[1].split("# Scaling")[0]
    best = next(line for line in headline.splitlines() if line.startswith("| 32 |"))
    assert best.count("`full`") == 2 and "broken" not in best  # fastest and leanest
    missing = text.split("# Cases without numbers")[1].split("\n# ")[0]
    for backend in BROKEN:
        (line,) = [x for x in missing.splitlines() if f"`{backend}`" in x]
        assert "| invalid |" in line


def _timed(budget_s: float, repeats: int = 1) -> MeasureSettings:
    return MeasureSettings(
        time_budget_s=budget_s, min_repeats=repeats, max_repeats=max(repeats, 100),
        threads=1, metrics=("time",),
    )  # fmt: skip


def _marks(result, device: str = "cpu") -> list:
    metrics = {r.metric: r.value for r in result.rows}
    return trust.timing_marks(metrics, threads=1, device=device)


@pytest.mark.slow
def test_an_unstable_time_is_measured_again_then_marked(plugin: Path) -> None:
    result = measure_case(_case("zigzag"), _timed(budget_s=0.05, repeats=6))
    assert (result.status, result.error) == (OK, None)  # the marks follow from the stored rows
    assert result.value("time_attempts") == 1 + trust.RETIMES
    median, iqr = result.value("time_median"), result.value("time_iqr")
    assert iqr > trust.UNSTABLE_IQR * median  # the stored numbers carry the reason
    (mark,) = _marks(result)
    assert mark.kind == trust.UNSTABLE
    assert mark.reason.startswith(f"unstable after {1 + trust.RETIMES} timings: IQR")


@pytest.mark.slow
def test_a_steady_time_on_an_idle_machine_carries_no_mark(plugin: Path) -> None:
    result = measure_case(_case("steady"), _timed(budget_s=0.4))
    assert (result.status, result.error) == (OK, None)
    assert result.value("time_attempts") == 1
    assert result.value("free_cores") >= 1  # the tests' CPU counters read idle
    assert _marks(result) == []


class ScriptedTimings:
    """Stands in for time_interleaved: attempt k gives every key timed the spread (IQR/median)
    that SPREADS[key][k - 1] says, its mean set to k so a stored time names its attempt."""

    def __init__(self, spreads: dict[str, list[float]]) -> None:
        self.spreads, self.calls = spreads, []

    def __call__(self, fns, **_):
        self.calls.append(sorted(fns))
        k = len(self.calls)
        return {key: self.stats(self.spreads[key][k - 1], k) for key in fns}

    @staticmethod
    def stats(spread: float, attempt: int) -> TimeStats:
        median = 0.01
        return TimeStats(
            median=median, iqr=spread * median, min=0.9 * median, mean=attempt, repeats=5,
            warmup=0, threads=1, device="cpu", samples=(median,) * 5,
        )  # fmt: skip


def _until_stable(fake: ScriptedTimings, monkeypatch, budget_s: float = 1.0) -> dict:
    monkeypatch.setattr(trust, "time_interleaved", fake)
    fns = dict.fromkeys(fake.spreads, lambda: None)
    return trust.time_until_stable(
        fns, device="cpu", warmup=0, repeats=5, budget_s=budget_s, max_repeats=5
    )


def test_a_group_timed_again_is_timed_whole_and_kept_from_one_attempt(monkeypatch) -> None:
    # the reference is steady; the variant's spread is 50%, 30%, 40% of its median
    fake = ScriptedTimings({"ref": [0.02, 0.02, 0.02], "variant": [0.5, 0.3, 0.4]})
    timed = _until_stable(fake, monkeypatch)
    assert fake.calls == [["ref", "variant"]] * (1 + trust.RETIMES)  # always round-robin
    # both from the attempt whose worst spread was the smallest (the second), never mixed
    assert {key: t.stats.mean for key, t in timed.items()} == {"ref": 2, "variant": 2}
    assert {t.attempts for t in timed.values()} == {1 + trust.RETIMES}


@pytest.mark.slow
def test_a_group_that_settles_on_its_second_timing_is_not_marked(plugin: Path, monkeypatch) -> None:
    fake = ScriptedTimings({0: [0.02, 0.02], 1: [0.6, 0.05]})
    monkeypatch.setattr(trust, "time_interleaved", fake)
    full, steady = measure_group([_case("full"), _case("steady")], _timed(budget_s=0.05))
    assert fake.calls == [[0, 1], [0, 1]]
    for result in (full, steady):
        assert (result.status, result.error) == (OK, None)
        assert result.value("time_attempts") == 2 and _marks(result) == []
        assert result.value("time_iqr") == pytest.approx(
            fake.spreads[0 if result is full else 1][1] * result.value("time_median")
        )


def test_no_retry_on_a_busy_machine_or_after_a_long_attempt(monkeypatch) -> None:
    unsteady = {"a": [0.5] * 3, "b": [0.02] * 3}
    monkeypatch.setattr(trust, "free_cores", lambda before, after: 0.2)  # others kept them busy
    fake = ScriptedTimings(unsteady)
    timed = _until_stable(fake, monkeypatch)
    assert len(fake.calls) == 1 and timed["a"].attempts == 1 and timed["a"].free_cores == 0.2
    monkeypatch.setattr(trust, "free_cores", lambda before, after: None)  # unknown: retried
    fake = ScriptedTimings(unsteady)
    assert _until_stable(fake, monkeypatch)["a"].attempts == 1 + trust.RETIMES
    # an attempt of 3 budgets per case or more (here: any, with no budget) is not repeated
    fake = ScriptedTimings(unsteady)
    assert _until_stable(fake, monkeypatch, budget_s=0.0)["a"].attempts == 1


@pytest.mark.slow
def test_a_case_timed_while_the_cores_were_busy_is_marked_and_warned_about(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The CPU counters say every core was busy while the case slept: other processes'."""
    ticks = iter(range(0, 10**12, 100))

    def all_busy() -> tuple[int, int]:
        t = next(ticks)
        return t, t

    monkeypatch.setattr(load, "_cpu_times", all_busy)
    monkeypatch.setattr(load, "cpu_count", lambda: 2)
    store = ResultStore(tmp_path / "s.sqlite")
    with store, caplog.at_level(logging.WARNING, logger="attention_zoo.sweep"):
        result = run_sweep([_case("steady")], store, settings=_timed(budget_s=0.4), progress=False)
        (row,) = store.cases()
    (stored,) = result.results
    assert stored.status == OK and stored.value("free_cores") < 0.5
    assert stored.value("time_attempts") == 1  # busy: never timed again
    assert row["error"] is None and [m.kind for m in _marks(stored)] == [trust.BUSY]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "steady" in warning and "time marked busy: other processes left 0.0" in warning
    assert "cores free while it was timed, for its 1 thread" in warning


def test_a_case_both_unstable_and_busy_is_warned_about_once(caplog) -> None:
    from attention_zoo.measure.metrics import metric_row
    from attention_zoo.measure.runner import CaseResult
    from attention_zoo.sweep import _warn_marks

    case = _case("full")
    rows = [("time_median", 1.0), ("time_iqr", 0.5), ("time_min", 0.9), ("free_cores", 0.0)]
    result = CaseResult(case=case, status=OK, rows=[metric_row(m, v) for m, v in rows])
    with caplog.at_level(logging.WARNING, logger="attention_zoo.sweep"):
        _warn_marks(case, result, threads=1)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "time marked unstable: IQR 50% of the median (above 25%); busy: other" in warning


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.real_load
def test_a_case_timed_beside_spinning_processes_is_marked_busy(plugin: Path) -> None:
    if load._cpu_times() is None:
        pytest.skip("no /proc/stat here: the load of a case cannot be read")
    cores = load.cpu_count()
    # three spinners a core: this process's one thread gets about a quarter of a core, the others
    # keep all but that busy, well past the busy rule (free < threads - SLACK)
    spin = "import time\nprint('up', flush=True)\nt = time.time()\nwhile time.time() < t + 20: pass"
    procs = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        for _ in range(3 * (os.cpu_count() or cores))
    ]
    try:
        assert all(p.stdout.readline().strip() == "up" for p in procs)
        case = _case("full", seq_len=256, head_dim=64)
        result = measure_case(case, _timed(budget_s=0.5))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert result.status == OK and result.value("free_cores") < 1 - load.SLACK, result.rows
    assert trust.BUSY in [m.kind for m in _marks(result)]  # maybe unstable too: spinners
    assert result.value("time_attempts") == 1  # busy: never timed again


def test_the_load_of_others_is_the_machines_less_this_process(monkeypatch) -> None:
    monkeypatch.setattr(load, "cpu_count", lambda: 4)
    before = load.CpuReading(busy=1000, total=4000, own_s=10.0, wall_s=100.0)
    # 1 s later: 300 of 400 jiffies busy (3 cores), 1.5 of them this process's own threads
    after = load.CpuReading(busy=1300, total=4400, own_s=11.5, wall_s=101.0)
    assert load.others_load(before, after) == 1.5
    assert load.others_load(before, None) is None  # no counters: unknown, never idle
    short = load.CpuReading(busy=1001, total=4004, own_s=10.0, wall_s=100.01)
    assert load.others_load(before, short) is None  # too short to read (MIN_WINDOW_S)


STAT = """cpu  900 0 300 5000 100 0 0 0 0 0
cpu0 100 0 100 800 0 0 0 0 0 0
cpu1 400 0 100 400 100 0 0 0 0 0
cpu2 100 0 0 900 0 0 0 0 0 0
cpu3 300 0 100 2900 0 0 0 0 0 0
intr 12345
"""


def test_the_counters_are_those_of_the_cores_this_process_may_use(monkeypatch) -> None:
    # cpu1 and cpu3 (taskset -c 1,3): busy = user + system, idle = idle + iowait
    assert load.cpu_times(STAT, {1, 3}) == (500 + 400, 1000 + 3300)
    assert load.cpu_times(STAT, {7}) is None  # none of ours listed: unknown
    monkeypatch.setattr(load, "allowed_cpus", lambda: {1, 3})
    assert load.cpu_count() == 2  # the free cores and the load count the same cores
    before = load.CpuReading(busy=0, total=0, own_s=0.0, wall_s=0.0)
    after = load.CpuReading(busy=150, total=200, own_s=0.5, wall_s=1.0)  # 3/4 of 2 cores busy
    assert load.others_load(before, after) == 1.0 and load.free_cores(before, after) == 1.0


def test_the_marks_follow_from_the_stored_numbers() -> None:
    steady = {"time_median": 1.0, "time_iqr": 0.05, "time_min": 0.9, "free_cores": 1.6}
    assert trust.timing_marks(steady, threads=2, device="cpu") == []
    assert [m.kind for m in trust.timing_marks(steady, threads=3, device="cpu")] == [trust.BUSY]
    wide = {**steady, "time_iqr": 0.3, "time_attempts": 3}
    (mark,) = trust.timing_marks(wide, threads=1, device="cpu")
    assert mark.reason == "unstable after 3 timings: IQR 30% of the median (above 25%)"
    low = {**steady, "time_min": 0.4}
    assert "minimum 40% of the median" in trust.timing_marks(low, threads=1, device="cpu")[0].reason
    no_time = {"free_cores": 0.0}
    assert trust.timing_marks(no_time, threads=1, device="cpu") == []  # nothing to mark
    # a run busy at its ends marks only a case without a reading of its own
    assert trust.timing_marks(steady, threads=1, device="cpu", run_busy="load 9") == []
    unread = {k: v for k, v in steady.items() if k != "free_cores"}
    (mark,) = trust.timing_marks(unread, threads=1, device="cpu", run_busy="load 9")
    assert mark == trust.Mark(trust.BUSY, "busy: load 9")


def test_on_cuda_only_the_launching_thread_needs_a_free_core() -> None:
    """torch's CPU threads idle while CUDA kernels run: 0.9 free cores are plenty on CUDA, far
    too few for 16 CPU threads."""
    timed = {"time_median": 1.0, "time_iqr": 0.01, "time_min": 0.99, "free_cores": 0.9}
    assert trust.timing_marks(timed, threads=16, device="cuda") == []
    (mark,) = trust.timing_marks(timed, threads=16, device="cpu")
    assert mark.reason.endswith("for its 16 threads")
    (mark,) = trust.timing_marks({**timed, "free_cores": 0.3}, threads=16, device="cuda:0")
    assert mark.reason.endswith("left 0.30 cores free while it was timed, for its 1 thread")


def test_the_table_divides_no_time_set_aside_and_notes_each_kind_once() -> None:
    from attention_zoo.measure.table import comparison_table

    def case(backend: str, n: int, iqr: float, free: float) -> dict:
        metrics = {"time_median": 0.01, "time_iqr": iqr * 0.01, "time_min": 0.01}
        config = _case(backend, seq_len=n).to_dict()
        return {"config": config, "status": OK, "error": None, "threads": 1,
                "metrics": {**metrics, "free_cores": free}}  # fmt: skip

    cases = [
        case("full", 32, 0.01, 2.0),
        case("sdpa", 32, 0.01, 2.0),  # trusted both sides: divided
        case("full", 64, 0.01, 0.0),  # the reference busy: no ratio for anyone at 64
        case("sdpa", 64, 0.01, 2.0),
        case("full", 128, 0.5, 2.0),
        case("sdpa", 128, 0.5, 0.0),  # unstable and busy
    ]
    text = comparison_table(cases, reference="full")
    rows = {tuple(line.split()[1:3]): line.split() for line in text.splitlines()[2:8]}
    assert rows[("sdpa", "32")][-2] == "1.00x"
    assert rows[("sdpa", "64")][-2] == "-" and rows[("full", "64")][-2] == "-"
    assert "ok (unstable) (busy)" in text and rows[("sdpa", "128")][-2] == "-"
    notes = text.split("times set aside")[1].splitlines()
    assert notes[1].startswith("  busy (2 cases: full L=64 forward, sdpa L=128 forward)")
    assert notes[2].startswith("  unstable (2 cases: full L=128 forward, sdpa L=128 forward)")
    assert "zoo results --format csv" in notes[3]


@pytest.mark.slow
def test_an_exact_check_tries_the_next_dtype_and_the_case_s_own(plugin: Path) -> None:
    # no float64 kernel: checked in float32 (right there), then in float16, the case's (wrong)
    result = measure_case(_case("picky-exact", dtype="float16"), FAST)
    assert result.status == INVALID
    assert "'picky-exact' disagrees with 'full' at n=48 (float16)" in result.error
    assert (result := measure_case(_case("picky-exact"), FAST)).status == OK, result.error
    assert result.error is None  # checked (float32), not skipped with a note


def test_a_runnable_s_output_is_keyword_only() -> None:
    from attention_zoo.measure.cases import Runnable, build_runnable

    built = build_runnable(_case("full"))
    with pytest.raises(TypeError):
        Runnable(built.case, built.module, built.inputs, built.step, None, built.output)
    assert Runnable(built.case, None, (), built.step, output=built.output).optimizer is None


def test_the_report_sets_aside_a_case_timed_busy(tmp_path: Path) -> None:
    """A case's own reading decides; only a case without one takes its run's load at the ends."""
    pytest.importorskip("pandas")
    from attention_zoo.report.context import trusted
    from attention_zoo.report.frame import case_frame

    frees = {"idle": {"full": 0.0, "sdpa": 2.0}, "busy": {"local": None, "lsh": 2.0}}
    with ResultStore(tmp_path / "s.sqlite") as store:
        for state, cases in frees.items():
            run = store.start_run(kind="bench")
            for backend, free in cases.items():
                rows = [("time_median", 1.0, "s"), ("time_iqr", 0.0, "s"), ("time_min", 1.0, "s")]
                rows += [("free_cores", free, "cores")] if free is not None else []
                store.add_rows(run, None, _case(backend).to_dict(), rows)
            store.finish_run(run)
            if state == "busy":  # 40 cores' load at the run's start, on 2 cores
                store._db.execute(
                    "UPDATE runs SET load_start = 40.0, cpu_count = 2 WHERE run_id = ?", (run,)
                )
                store._db.commit()
        frame = case_frame(store.rows(), store.runs())
    rows = {r["config"]["backend"]: r for _, r in frame.iterrows()}
    busy = {b: r["busy"] for b, r in rows.items()}
    assert busy == {"full": True, "sdpa": False, "local": True, "lsh": False}
    assert {b: trusted(r, "time_median") for b, r in rows.items()} == {
        "full": False, "sdpa": True, "local": False, "lsh": True
    }  # fmt: skip
    assert rows["local"]["marks"] == ["busy: the run's load at its start was 40.00 on 2 cores"]


def test_a_time_set_aside_is_on_no_pareto_front() -> None:
    pytest.importorskip("pandas")
    from attention_zoo.report.accuracy import _front_of_trusted

    def row(**flags) -> dict:
        return {"status": OK, "metrics": {"time_median": 1.0}, **flags}

    rows = [row(busy=True), row(), row(unstable=True), row()]
    # the busy one is cheapest and the best: ranked, it would hide both trusted points
    front = _front_of_trusted(rows, cost=[0.1, 1.0, 0.2, 2.0], acc=[0.99, 0.8, 0.95, 0.9])
    assert front == [False, True, False, True]


@pytest.mark.slow
def test_an_attempt_is_long_by_the_clock_it_was_timed_with(monkeypatch) -> None:
    # a group timed by the process's CPU time on a loaded machine: its wall time grows with the
    # load, its CPU time does not, so it is still retried while unstable
    class Waiting(ScriptedTimings):
        def __call__(self, fns, **kw):
            time.sleep(0.1)  # wall time passes, CPU time does not
            return super().__call__(fns, **kw)

    monkeypatch.setattr(trust, "free_cores", lambda before, after: None)
    fns = {"a": lambda: None, "b": lambda: None}
    for clock, attempts in ((WALL, 1), (CPU_CLOCK, 1 + trust.RETIMES)):
        fake = Waiting({"a": [0.5] * 3, "b": [0.02] * 3})
        monkeypatch.setattr(trust, "time_interleaved", fake)
        timed = trust.time_until_stable(
            fns, device="cpu", warmup=0, repeats=5, budget_s=0.01, max_repeats=5, clock=clock
        )
        assert timed["a"].attempts == attempts


@pytest.mark.parametrize(
    ("mode", "grad"), [("forward", False), ("forward+backward", True), ("train-step", True)]
)
def test_the_output_check_runs_in_the_step_s_grad_mode(mode, grad):
    """The check's forward has autograd exactly where the step has a backward: a compiled kernel
    it triggers is the step's own (a grad mode change compiles another)."""
    import dataclasses

    import torch

    from attention_zoo.measure.cases import build_runnable
    from attention_zoo.measure.validate import invalid_output

    target = "block" if mode == "train-step" else "attention"
    runnable = build_runnable(BenchCase(target=target, backend="sdpa", seq_len=32, mode=mode))
    seen = []
    output = runnable.output

    def spying():
        seen.append(torch.is_grad_enabled())
        return output()

    assert invalid_output(dataclasses.replace(runnable, output=spying)) is None
    assert seen == [grad]
