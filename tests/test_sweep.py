"""Sweeps: grid expansion and its errors, failures and OOM recorded while the sweep goes on,
resume after a kill with no lost or duplicate rows, presets."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attention_zoo import UnknownNameError
from attention_zoo.attention.spec import BACKENDS
from attention_zoo.engine import RunPolicy
from attention_zoo.errors import ConfigError, OptionError
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.labels import DEFAULT_REFERENCE
from attention_zoo.measure.runner import CaseResult, MeasureSettings, Metric
from attention_zoo.measure.worker import run_isolated
from attention_zoo.presets import builtin_presets, load_sweep_preset, parse_sweep_preset
from attention_zoo.store import ResultStore
from attention_zoo.sweep import SweepGrid, run_sweep

FAST = MeasureSettings(metrics=("memory", "predict"), time_budget_s=0.0, min_repeats=1)


def fake_measure(case: BenchCase, settings: MeasureSettings) -> CaseResult:
    return CaseResult(case=case, status="ok", rows=[Metric("seq_len_echo", case.seq_len, "tokens")])


# ---- grids ----------------------------------------------------------------------------------


def test_grid_expands_product_with_option_axes() -> None:
    grid = SweepGrid(
        target="attention",
        backends=("full", "sdpa"),
        seq_lens=(64, 128),
        modes=("forward", "forward+backward"),
        options={"sdpa": {"kernel": ["math", "auto"]}},
    )
    cases = grid.cases()
    # full: 2 lengths x 2 modes; sdpa: 2 kernels x 2 lengths x 2 modes
    assert len(cases) == 4 + 8
    assert {c.options.get("kernel") for c in cases if c.backend == "sdpa"} == {"math", "auto"}
    assert len({c.key() for c in cases}) == len(cases)


def test_grid_default_backends_come_from_registry() -> None:
    names = {c.backend for c in SweepGrid(seq_lens=(64,)).cases()}
    assert names == set(BACKENDS.names())


def test_unknown_backend_in_grid_lists_known_ones() -> None:
    with pytest.raises(
        UnknownNameError, match=r"unknown attention backend 'flash-typo'; known .*full.*sdpa"
    ):
        SweepGrid(backends=("full", "flash-typo")).cases()


def test_unknown_option_in_grid_names_accepted_ones() -> None:
    with pytest.raises(
        OptionError, match=r"'sdpa' does not take option\(s\) 'num_hashes'; it takes: kernel"
    ):
        SweepGrid(backends=("sdpa",), options={"sdpa": {"num_hashes": 4}}).cases()


def test_shared_kv_heads_that_do_not_divide_the_heads_are_refused_before_any_run() -> None:
    grid = SweepGrid(backends=("sdpa",), num_heads=4, options={"sdpa": {"kv_heads": [1, 3]}})
    with pytest.raises(ConfigError, match=r"^sdpa: kv_heads=3 must divide the 4 query heads; pick"):
        grid.cases()
    assert SweepGrid(backends=("sdpa",), num_heads=4, options={"sdpa": {"kv_heads": 2}}).cases()
    model = {"num_attention_heads": 6, "attention_head_size": 8, "num_hidden_layers": 1}
    grid = SweepGrid(
        target="model", backends=("sdpa",), num_heads=4, models=(model,),
        options={"sdpa": {"kv_heads": 3}},
    )  # fmt: skip
    assert grid.cases()  # a model's own head count is what kv_heads must divide


def test_bad_grid_values() -> None:
    with pytest.raises(ConfigError, match="mode"):
        SweepGrid(modes=("sideways",))
    with pytest.raises(ConfigError, match="'seq_lens' is empty"):
        SweepGrid(seq_lens=())
    with pytest.raises(ConfigError, match="train-step' needs parameters"):
        SweepGrid(target="attention", modes=("train-step",)).cases()


def test_grid_values_of_the_wrong_kind_are_refused_before_anything_computes_with_them() -> None:
    """Before: num_heads = "four" reached kv_heads_for (TypeError); causal = ["false"] and a
    length past what the kernels index became per-case errors at run time."""
    for bad, message in [
        (dict(num_heads="four"), "num_heads must be an integer >= 1, got 'four'"),
        (dict(num_heads=4.5), "num_heads must be an integer >= 1, got 4.5"),
        (dict(num_heads=True), "num_heads must be an integer >= 1, got True"),
        (dict(seq_lens=(64, "128")), "seq_lens must be a list of ints, got (64, '128')"),
        (dict(seq_lens=(2**31,)), "seq_lens must be an integer from 1 to 2147483647"),
        (dict(batches=(0,)), "batches must be an integer >= 1, got 0"),
        (dict(new_tokens=-1), "new_tokens must be an integer >= 0, got -1"),
        (dict(causal=("false",)), "causal must be a list of true/false values, got ('false',)"),
        (dict(dtypes=(32,)), "dtypes must be a list of strings, got (32,)"),
        (dict(options={"sdpa": 2}), "options must be a table of tables, got {'sdpa': 2}"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
            SweepGrid(**{"backends": ("sdpa",), "options": {"sdpa": {"kv_heads": 2}}, **bad})
    with pytest.raises(ConfigError, match=r"^p.toml \[grid\]: num_heads must be an integer >= 1"):
        parse_sweep_preset('[grid]\nnum_heads = "four"\n', source="p.toml")
    with pytest.raises(ConfigError, match="seq_len must be an integer from 1 to 2147483647"):
        BenchCase(seq_len=2**31)
    assert SweepGrid(seq_lens=(2**31 - 1,), new_tokens=0).seq_lens == (2**31 - 1,)


# ---- presets --------------------------------------------------------------------------------


def test_builtin_presets_load() -> None:
    assert {"quick", "standard", "crime-and-punishment"} <= set(builtin_presets())
    quick = load_sweep_preset("quick")
    assert quick.settings.threads == 1 and quick.reference == DEFAULT_REFERENCE
    assert quick.settings.clock == "cpu"  # one thread's CPU time: a busy machine still ranks it
    assert len(quick.grid.seq_lens) >= 3  # enough lengths for a crossover
    assert quick.grid.cases()  # expands against the current registry


def test_malformed_preset_says_where() -> None:
    with pytest.raises(ConfigError, match=r"my.toml is not valid TOML: .*line 3"):
        parse_sweep_preset("[grid]\nseq_lens = [1, 2\ntarget = 3\n", source="my.toml")
    with pytest.raises(
        ConfigError,
        match=r"^p.toml \[grid\] does not take key\(s\) 'lengths'; it takes: target, .*seq_lens",
    ):
        parse_sweep_preset("[grid]\nlengths = [1024]\n", source="p.toml")
    with pytest.raises(
        ConfigError,
        match=r"^p.toml does not take top-level key\(s\) 'grdi'; it takes: description, grid, "
        r"measure; did you mean 'grid'\?$",
    ):
        parse_sweep_preset("[grdi]\n", source="p.toml")
    with pytest.raises(
        ConfigError,
        match=r"^p.toml \[measure\] does not take key\(s\) 'budget'; it takes: .*reference",
    ):
        parse_sweep_preset("[measure]\nbudget = 1\n", source="p.toml")
    with pytest.raises(ConfigError, match=r"^p.toml: \[grid\] must be a table"):
        parse_sweep_preset("grid = 3\n", source="p.toml")
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'; built-in presets: .*quick"):
        load_sweep_preset("nope")


def test_measure_values_a_run_could_not_use_are_refused_with_the_preset() -> None:
    """Before: threads = -2 passed --dry-run and failed in timing.py; time_budget_s = "x" became
    an error row per case."""
    for line, message in [
        ("threads = -2", "threads must be an integer >= 1, got -2"),
        ('time_budget_s = "x"', "time_budget_s must be a number of seconds, got 'x'"),
        ("min_repeats = 5\nmax_repeats = 2", "min_repeats (5) is more than max_repeats (2)"),
        ("warmup = 1.5", "warmup must be an integer >= 0, got 1.5"),
        ('interleave = "yes"', "interleave must be true or false, got 'yes'"),
    ]:
        with pytest.raises(ConfigError, match=f"^p.toml \\[measure\\]: {re.escape(message)}"):
            parse_sweep_preset(f"[measure]\n{line}\n", source="p.toml")


def test_a_preset_that_is_a_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is a folder; a preset is a built-in name \(.*quick"):
        load_sweep_preset(str(tmp_path))


def test_preset_file_from_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        '[grid]\ntarget = "attention"\nbackends = ["full"]\nseq_lens = [64]\n'
        "[measure]\nthreads = 1\n"
    )
    preset = load_sweep_preset(str(path))
    assert [c.backend for c in preset.grid.cases()] == ["full"] and preset.settings.threads == 1


# ---- failures and OOM keep the sweep going ---------------------------------------------------


@pytest.mark.slow
def test_failing_and_oom_cases_are_recorded_and_sweep_goes_on(
    tmp_path: Path, bad_backends: None
) -> None:
    cases = SweepGrid(
        target="attention", backends=("full", "test-failing", "test-oom", "sdpa"), seq_lens=(64,)
    ).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        result = run_sweep(cases, store, settings=FAST, progress=False)
        status = {
            c["config"]["backend"]: (c["status"], c["error"]) for c in store.cases(result.run_id)
        }
    assert status["full"] == ("ok", None) and status["sdpa"] == ("ok", None)
    assert (
        status["test-failing"][0] == "error"
        and "ValueError: injected failure" in status["test-failing"][1]
    )
    assert status["test-oom"][0] == "oom" and "can't allocate memory" in status["test-oom"][1]
    assert result.counts() == {"ok": 2, "error": 1, "oom": 1}


@pytest.mark.slow
def test_prediction_guard_marks_oversized_case_oom_without_running(tmp_path: Path) -> None:
    big = BenchCase(
        target="attention", backend="full", seq_len=65536, mode="forward"
    )  # ~64 GiB of scores
    small = BenchCase(target="attention", backend="full", seq_len=64, mode="forward")
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        result = run_sweep(
            [big, small], store, settings=FAST, memory_limit_bytes=2**30, progress=False
        )
    by_len = {r.case.seq_len: r for r in result.results}
    assert by_len[65536].status == "oom" and "not run: predicted" in by_len[65536].error
    assert by_len[65536].value("predicted_peak_bytes") >= 4 * 65536**2 * 4  # the scores alone
    assert by_len[65536].value("peak_bytes") is None  # nothing was measured
    assert by_len[64].status == "ok"


def test_injected_measure_that_raises_is_stored(tmp_path: Path) -> None:
    def boom(case: BenchCase, settings: MeasureSettings) -> CaseResult:
        if case.seq_len == 128:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if case.seq_len == 256:
            raise KeyError("weird")
        return fake_measure(case, settings)

    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128, 256, 512)).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        result = run_sweep(cases, store, measure=boom, progress=False)
        status = {c["config"]["seq_len"]: c["status"] for c in store.cases(result.run_id)}
    assert status == {64: "ok", 128: "oom", 256: "error", 512: "ok"}


# ---- kill and resume --------------------------------------------------------------------------

KILLER = textwrap.dedent("""
    import os, sys
    from attention_zoo.engine import RunPolicy
    from attention_zoo.measure.runner import CaseResult, Metric
    from attention_zoo.store import ResultStore
    from attention_zoo.sweep import SweepGrid, run_sweep

    store_path, kill_at = sys.argv[1], int(sys.argv[2])
    seen = []

    def measure(case, settings):
        seen.append(case.seq_len)
        if len(seen) == kill_at:
            os._exit(9)  # die mid-case, like a crash or kill -9: no cleanup, no commit
        rows = [Metric("echo", case.seq_len, "tokens"), Metric("twice", 2 * case.seq_len, "tokens")]
        return CaseResult(case=case, status="ok", rows=rows)

    grid = SweepGrid(target="attention", backends=("full", "sdpa"), seq_lens=(64, 128, 256))
    cases = grid.cases()
    with ResultStore(store_path) as store:
        run_sweep(cases, store, measure=measure, policy=RunPolicy(resume=True), progress=False)
    print("completed", len(seen))
""")


@pytest.mark.slow
@pytest.mark.long
def test_killed_sweep_resumes_only_missing_cases(tmp_path: Path) -> None:
    script, store_path = tmp_path / "sweep.py", tmp_path / "zoo.sqlite"
    script.write_text(KILLER)
    first = subprocess.run(
        [sys.executable, str(script), str(store_path), "4"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert first.returncode == 9, first.stderr
    with ResultStore(store_path) as store:
        (run,) = store.runs()
        assert (
            run["n_cases"] == 3 and run["finished_at"] is None
        )  # cases 1-3 committed, the 4th lost
    second = subprocess.run(
        [sys.executable, str(script), str(store_path), "0"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert second.returncode == 0, second.stderr
    assert "completed 3" in second.stdout  # only the 3 missing cases ran
    with ResultStore(store_path) as store:
        (run,) = store.runs()  # the same run was continued
        rows = store.rows(run["run_id"])
        assert run["n_cases"] == 6 and run["finished_at"] is not None
    pairs = [(r["case_key"], r["metric"]) for r in rows]
    assert len(pairs) == 12 and len(set(pairs)) == 12  # 6 cases x 2 metrics, none twice, none lost


@pytest.mark.slow
def test_resume_of_complete_run_measures_nothing(tmp_path: Path) -> None:
    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128)).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        first = run_sweep(cases, store, measure=fake_measure, progress=False)
        before = store.run(first.run_id)
        again = run_sweep(
            cases, store, measure=fake_measure, policy=RunPolicy(resume=True), progress=False
        )
        after = store.run(first.run_id)  # nothing measured: the run's times and loads unchanged
        fresh = run_sweep(cases, store, measure=fake_measure, progress=False)
    assert again.run_id == first.run_id and again.results == [] and again.already_done == 2
    assert again.load_end is None and after == before
    assert fresh.run_id != first.run_id and len(fresh.results) == 2  # without --resume: a new run


def test_progress_bar_shows_current_case_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attention_zoo.progress._is_terminal", lambda stream: True)
    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128)).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        run_sweep(cases, store, measure=fake_measure, progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "attention:full L=128" in err


def test_progress_in_a_log_is_plain_lines_without_carriage_returns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attention_zoo import progress

    cases = SweepGrid(target="attention", backends=("full",), seq_lens=(64, 128)).cases()
    with ResultStore(tmp_path / "zoo.sqlite") as store:
        run_sweep(cases, store, measure=fake_measure, progress=True)
    assert capsys.readouterr().err == ""  # a short sweep in a log: no progress lines at all
    bar = progress.progress(3, desc="bench", unit="cases", every_s=0.0)
    for name in ("a", "b", "c"):
        bar.set_postfix_str(name)
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1].startswith("bench: 3/3 cases, ")
    assert err.splitlines()[-1].endswith("(c)")


# ---- subprocess isolation -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.long
def test_isolated_case_under_address_space_limit_is_oom() -> None:
    """No prediction guard here: the subprocess really tries to allocate 4 GiB of scores and hits
    its RLIMIT_AS, which is stored as oom; the parent is unharmed."""
    case = BenchCase(target="attention", backend="full", seq_len=16384, mode="forward")
    result = run_isolated(
        case, MeasureSettings(metrics=("memory",)), rlimit_bytes=512 * 2**20, timeout_s=120
    )
    assert result.status == "oom", result.error
    assert "allocate" in result.error
    ok = run_isolated(
        case.replace(seq_len=128), MeasureSettings(metrics=("memory",)), rlimit_bytes=512 * 2**20
    )
    assert ok.status == "ok" and ok.value("peak_bytes") > 0
    assert ok.facts["capabilities"]["full"]["kind"] == "full"  # carried out of the worker
    assert os.getpid()  # still here
