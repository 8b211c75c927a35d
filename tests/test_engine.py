"""The one run pipeline: --resume, --run-id and --force mean the same on `zoo bench` and `zoo task`
(engine.RUN_RULE), and every command opens the store through one function with one set of
messages."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attention_zoo.cli import main
from attention_zoo.engine import RUN_RULE, RunPolicy
from attention_zoo.measure import load
from attention_zoo.measure import runner as measure_runner
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import CaseResult
from attention_zoo.store import ResultStore, open_store, run_status
from attention_zoo.sweep import run_sweep
from attention_zoo.tasks import runner
from attention_zoo.tasks.driver import TaskRequest, train_task
from attention_zoo.tasks.trainer import EvalResult, TrainResult

BENCH = ["bench", "--backends", "full", "--lengths", "16", "--metrics", "predict"]
BENCH += ["--threads", "1", "--no-progress"]
TASK = ["task", "duplication", "--preset", "smoke", "--backends", "full", "--seeds", "0"]
TASK += ["--eval-hashes", "", "--quiet"]
COMMANDS = {"bench": (BENCH, "bench"), "task": (TASK, "task")}  # argv, the store run's kind


def trained(spec, *, device="cpu", on_step=None) -> runner.RunOutcome:
    """A stand-in for tasks.runner.run_one: a training that takes no time."""
    result = TrainResult(
        steps=1, steps_to_target=None, final_accuracy=0.5, final_loss=1.0,
        stopped="max_steps", wall_time_s=0.0,
    )  # fmt: skip
    test = EvalResult(accuracy=0.5, loss=1.0, scored=1)
    return runner.RunOutcome(spec=spec, result=result, test=test, evals={})


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh folder, trainings that take no time (a stand-in outcome), torch threads restored."""
    monkeypatch.setattr(runner, "run_one", trained)
    monkeypatch.setattr(load, "SAMPLE_S", 0.0)  # the load sampled at each run's start and end
    # no collection after each case: these cases only predict, and this process's heap is large
    monkeypatch.setattr(measure_runner, "gc", SimpleNamespace(collect=lambda: 0))
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)


def _zoo(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _runs(kind: str) -> list[tuple[str, int]]:
    """(run id, cases it holds) of every run of `kind`, oldest first."""
    with ResultStore("results/zoo.sqlite", create=False) as store:
        return [(r["run_id"], r["n_cases"]) for r in store.runs(kind=kind)]


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_resume_run_id_and_force_mean_the_same_on_bench_and_task(
    workdir: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    argv, kind = COMMANDS[command]
    assert _zoo([*argv, "--run-id", "first"], capsys)[0] == 0
    assert _runs(kind) == [("first", 1)]
    # --resume continues the latest run of the same jobs; --run-id the one it names: nothing new
    assert _zoo([*argv, "--resume"], capsys)[0] == 0
    assert _zoo([*argv, "--run-id", "first"], capsys)[0] == 0
    assert _runs(kind) == [("first", 1)]
    # --force runs every job again (here into a new run)
    assert _zoo([*argv, "--force"], capsys)[0] == 0
    runs = _runs(kind)
    assert len(runs) == 2 and runs[0] == ("first", 1) and runs[1][1] == 1
    # the conflicting flags are refused the same way on both commands
    for flags, text in (
        (["--resume", "--run-id", "x"], "--resume and --run-id cannot be combined"),
        (["--resume", "--force"], "--resume and --force cannot be combined"),
    ):
        code, err = _zoo([*argv, *flags], capsys)
        assert code == 2 and text in err and len(err.splitlines()) == 1, err
    assert len(_runs(kind)) == 2


@pytest.mark.slow
def test_without_flags_a_training_is_reused_and_a_measurement_is_taken_anew(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rule's one difference between the jobs: a training run stored by any earlier run is
    the same model; a time belongs to the machine's state when it is taken."""
    for argv, kind, runs_after_second in ((BENCH, "bench", 2), (TASK, "task", 1)):
        assert _zoo(argv, capsys)[0] == 0 and _zoo(argv, capsys)[0] == 0
        assert len(_runs(kind)) == runs_after_second  # no empty run when nothing was left to do


def test_help_states_the_one_rule(capsys: pytest.CaptureFixture[str]) -> None:
    first_words = " ".join(RUN_RULE.split()[:8])
    for command in ("bench", "task"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert first_words in text and "--force runs every job again" in text


@pytest.mark.slow
def test_a_failed_case_is_run_again_on_resume_a_finished_one_is_not(tmp_path: Path) -> None:
    cases = [
        BenchCase(target="attention", backend="full", seq_len=n, num_heads=1, head_dim=8)
        for n in (8, 16)
    ]
    calls: list[int] = []

    def flaky(case: BenchCase, settings) -> CaseResult:
        calls.append(case.seq_len)
        if case.seq_len == 16 and len(calls) <= 2:
            raise RuntimeError("transient")
        return CaseResult(case=case, status="ok", rows=[("flops", 1.0, "flop")])

    with ResultStore(tmp_path / "zoo.sqlite") as store:
        first = run_sweep(cases, store, measure=flaky, progress=False)
        resume = RunPolicy(resume=True)
        again = run_sweep(cases, store, measure=flaky, policy=resume, progress=False)
        statuses = {c["config"]["seq_len"]: c["status"] for c in store.cases(first.run_id)}
    assert calls == [8, 16, 16] and again.run_id == first.run_id and again.already_done == 1
    assert statuses == {8: "ok", 16: "ok"}


@pytest.mark.slow
def test_a_write_the_store_refuses_stops_the_run_in_one_line_that_says_how_to_go_on(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store locked past its timeout or a full disk at a case's write: exit with what is kept
    and --resume, no traceback; --resume then runs only the missing case."""
    argv = [*BENCH[:4], "16,32", *BENCH[5:]]
    add_rows, writes = ResultStore.add_rows, []

    def full_disk(self, *args, **kwargs):
        writes.append(args[1])
        if len(writes) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        return add_rows(self, *args, **kwargs)

    monkeypatch.setattr(ResultStore, "add_rows", full_disk)
    code, err = _zoo(argv, capsys)
    line = err.strip().splitlines()[-1]
    assert code != 0 and "Traceback" not in err
    assert "database or disk is full" in line and "1 of 2 cases are stored in run" in line
    assert "rerun the same command with --resume" in line
    assert _zoo([*argv, "--resume"], capsys)[0] == 0
    assert len(writes) == 3 and _runs("bench")[-1][1] == 2  # the missing case, once more


STORE_COMMANDS = {
    "bench": BENCH,
    "task": TASK,
    "results": ["results"],
    "report": ["report"],
}


@pytest.mark.parametrize("bad", ["folder", "garbage"])
def test_a_bad_store_gives_one_message_from_every_command(
    workdir: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    pytest.importorskip("matplotlib")  # zoo report needs its extra before it opens the store
    path = workdir / "store"
    if bad == "folder":
        path.mkdir()
    else:
        path.write_text("not a database\n" * 100)
    lines = {}
    for name, argv in STORE_COMMANDS.items():
        code, err = _zoo([*argv, "--store", str(path)], capsys)
        assert code == 2 and len(err.splitlines()) == 1, (name, err)
        prefix = f"zoo {name}: error: "
        assert err.startswith(prefix), err
        lines[name] = err.removeprefix(prefix).strip()
    assert len(set(lines.values())) == 1, lines
    (line,) = set(lines.values())
    assert (
        "is a folder; give a file such as" if bad == "folder" else "not an attention-zoo"
    ) in line


@pytest.mark.slow
def test_train_task_is_the_function_behind_zoo_task(workdir: Path) -> None:
    """What `zoo task` runs, callable with an open store (as `zoo reproduce` needs it)."""
    request = TaskRequest(
        run_spec="duplication", preset="smoke", backends=("full",), seeds=(0,), eval_hashes=()
    )
    lines: list[str] = []
    with open_store(None, write=True) as store:
        train_task(request, store, progress=False, say=lines.append)
        train_task(request, store, progress=False, say=lines.append)
        train_task(request, store, policy=RunPolicy(force=True), progress=False, say=lines.append)
    trained = [line for line in lines if line.startswith("[1/1] full seed 0:")]
    assert len(trained) == 2 and sum("already in the store" in line for line in lines) == 1
    assert len(_runs("task")) == 2


@pytest.mark.slow
def test_run_id_of_another_kind_of_run_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _zoo([*TASK, "--run-id", "mine"], capsys)[0] == 0
    code, err = _zoo([*BENCH, "--run-id", "mine"], capsys)
    assert code == 2 and "--run-id mine: that run holds task jobs, not bench jobs" in err, err
    assert _runs("bench") == []


@pytest.mark.slow
def test_a_dry_run_says_what_the_rule_would_run_and_writes_nothing(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run applies the rule as a run would (what the store holds is not run again) and
    leaves the store as it was: absent when there was none, byte for byte when there was."""
    store = workdir / "results" / "zoo.sqlite"
    for argv, _ in COMMANDS.values():
        assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run, bench: 1 of 1 to do\n  block:full L=16" in out, out
    assert "dry run, task: 1 of 1 to do\n  full seed 0" in out, out
    assert not store.parent.exists()
    for argv, _ in COMMANDS.values():
        assert main(argv) == 0
    before, runs = store.read_bytes(), _runs("task") + _runs("bench")
    capsys.readouterr()
    for argv in (TASK, BENCH, [*BENCH, "--resume"]):
        assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run, task: 0 of 1 to do (1 already stored)" in out
    assert "dry run, bench: 1 of 1 to do" in out  # a time is taken anew ...
    assert "dry run, bench: 0 of 1 to do (1 already stored)" in out  # ... unless resumed
    assert store.read_bytes() == before and _runs("task") + _runs("bench") == runs


@pytest.mark.slow
def test_a_reproduction_dry_run_lists_its_jobs_and_writes_nothing(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its sweeps and trainings are listed, its claims not printed, and neither a new store nor
    an existing one is written (the Reformer's parameter counts included)."""
    assert main(BENCH) == 0
    store = workdir / "results" / "zoo.sqlite"
    before = store.read_bytes()
    for name, kind in (("reformer", "bench"), ("state-tracking", "task")):
        for where in ("new.sqlite", str(store)):
            argv = ["reproduce", name, "--preset", "smoke", "--store", where, "--no-progress"]
            assert main([*argv, "--dry-run"]) == 0
            out = capsys.readouterr().out
            assert f"dry run, {kind}: " in out and ", reproduced\n" not in out, out
    assert not (workdir / "new.sqlite").exists() and store.read_bytes() == before


def test_a_dry_run_prints_no_table(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--table2 shows the table of what was trained; a dry run trains nothing, so shows none."""
    assert main([*TASK, "--table2"]) == 0
    assert "accuracy on the scored positions" in capsys.readouterr().out
    assert main([*TASK, "--dry-run", "--table2"]) == 0
    out = capsys.readouterr().out
    assert "0 of 1 to do" in out and "accuracy on the scored positions" not in out


def test_a_dry_run_leaves_out_what_the_time_limit_refuses(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where this machine's rates are known, a bench dry run refuses what the run would refuse,
    so after a run that refused a case, --resume --dry-run continues that same run."""
    from attention_zoo.commands import bench_cmd

    def time_check(cases, settings) -> bench_cmd.TimeCheck:
        refused = {c.key(): f"{c.name()}: past the limit" for c in cases if c.seq_len == 32}
        return bench_cmd.TimeCheck(refused=refused, predicted={})

    monkeypatch.setattr(bench_cmd, "probes_to_time", lambda cases: 0)  # every rate known here
    monkeypatch.setattr(bench_cmd, "time_check", time_check)
    argv = [a if a != "16" else "16,32" for a in BENCH]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--resume", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "dry run, bench: 0 of 1 to do (1 already stored)" in captured.out
    assert "L=32 b=1 forward float32 cpu: past the limit" in captured.err


@pytest.mark.slow
def test_a_reproduction_finishes_its_interrupted_task_run(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after one training of three; the same command again trains the other two into that
    run and finishes it (before: into a new run, the first left unfinished for ever)."""
    calls = []

    def train_then_ctrl_c(spec, *, device="cpu", on_step=None) -> runner.RunOutcome:
        calls.append(spec)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return trained(spec, device=device, on_step=on_step)

    monkeypatch.setattr(runner, "run_one", train_then_ctrl_c)
    argv = ["reproduce", "selective-copying", "--preset", "smoke", "--store", "r.sqlite"]
    assert main([*argv, "--no-progress"]) == 130
    monkeypatch.setattr(runner, "run_one", trained)
    assert main([*argv, "--no-progress"]) == 0
    capsys.readouterr()
    with ResultStore("r.sqlite") as store:
        (run,) = store.runs(kind="task")
        assert run_status(run) == "finished" and run["n_cases"] == 3
