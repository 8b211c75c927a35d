"""The GPU check's CPU side: its time budget (benchmarks/scripts/budget.sh) shares BUDGET seconds
by weight among the steps still to run, the script refuses a machine without CUDA in one line, and
gpu_check.sh's steps run in order, with a stand-in interpreter for the GPU machine's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SH = ROOT / "benchmarks" / "scripts" / "budget.sh"


def _limits(script: str, **env: str) -> list[int]:
    """budget_now after each budget_limit call of `script` (bash, budget.sh sourced)."""
    run = subprocess.run(
        ["bash", "-c", f"source {BUDGET_SH}\n{script}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BUDGET": "100", **env},
    )
    return [int(x) for x in run.stdout.split()]


def test_the_budget_is_shared_by_weight_and_what_is_left_moves_on():
    limits = _limits(
        """BUDGET_START=0; budget_plan a:1 b:2 c:1
        SECONDS=0; budget_limit a; echo $budget_now
        SECONDS=5; budget_limit b; echo $budget_now  # a took 5 s of its 25
        SECONDS=65; budget_limit c; echo $budget_now  # b took 60 s of its 63"""
    )
    assert limits == [25, 95 * 2 // 3, 35]


def test_a_step_gets_its_floor_and_step_limit_caps_it():
    late = """BUDGET_START=0; budget_plan a:1 b:1
        SECONDS=500; budget_limit a; echo $budget_now"""
    assert _limits(late) == [10]
    assert _limits("budget_plan a:1\nbudget_limit a; echo $budget_now", STEP_LIMIT="7") == [7]


@pytest.mark.slow
def test_no_cuda_is_refused_in_one_line():
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "gpu_check.sh: no CUDA device is visible; run it on a machine with a GPU (the CPU "
        "checks: python -m pytest)"
    ]


def test_budgets_that_are_not_whole_seconds_are_refused():
    run = subprocess.run(
        ["bash", "-c", f"source {BUDGET_SH}"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUDGET": "8m"},
    )
    assert run.returncode == 2
    assert run.stderr.strip() == "budget.sh: BUDGET must be whole seconds, not '8m'"


# A stand-in interpreter: logs each command with its start and end time, answers the script's
# device questions as a GPU machine would, and takes FAKE_SECONDS for each zoo bench run (one
# with --backends FAKE_FAIL fails). Its CUDA check takes FAKE_SETUP_SECONDS; without fla with
# FAKE_NO_FLA; record.py logs the repository
# it runs from in FAKE_LOG.asv and leaves a result in --results-dir; zoo report makes its folder
# with FAKE_REPORT.
FAKE_PYTHON = r"""#!/usr/bin/env bash
start=$(date +%s.%N)
case "$*" in
    *re.search*) echo h200; exit 0 ;;
    *get_device_name*) echo "Fake GPU torch 0"; exit 0 ;;
    *is_available*) sleep "${FAKE_SETUP_SECONDS:-0}"; exit 0 ;;
    "-c import fla")
        [ -z "${FAKE_NO_FLA:-}" ] && exit 0
        echo "ModuleNotFoundError: No module named 'fla'" >&2; exit 1 ;;
    *core.pick*)  # what needs warming: fla tunes, the low-rank and plain sums need nothing
        for grid in "${@:3}"; do
            IFS=: read -r target causal names <<<"$grid"
            for b in ${names//,/ }; do
                case $b in
                    retention | gla | deltanet | gated-deltanet) echo "$target $causal $b tune" ;;
                    sdpa | linformer | linear | performer) ;;
                    *) echo "$target $causal $b compile" ;;
                esac
            done
        done
        exit 0 ;;
    -c*|"-m pip"*) exit 0 ;;
    *"attention_zoo bench"*)  # a compile: a file in the cache; what it found there, counted
        echo "fake bench: started"
        case " $* " in
            *" --backends ${FAKE_FAIL:-none} "*) echo "fake bench: failed"; exit 1 ;;
        esac
        ls "$TORCHINDUCTOR_CACHE_DIR" 2>/dev/null | wc -l >>"$FAKE_LOG.cache"
        mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && touch "$TORCHINDUCTOR_CACHE_DIR/kernel-$$"
        sleep "$FAKE_SECONDS" ;;
    *record.py*)
        tree=$(cd "$(dirname "$1")/../.." && pwd)
        echo "$tree $(git -C "$tree" rev-list --count HEAD) $(git -C "$tree" status --porcelain |
            wc -l) $(git -C "$tree" ls-files | tr '\n' ,)" >>"$FAKE_LOG.asv"
        for arg in "$@"; do
            [ "${last:-}" = --results-dir ] && mkdir -p "$arg/cuda-fake" &&
                touch "$arg/cuda-fake/result.json"
            last=$arg
        done ;;
    *"attention_zoo report"*)
        [ -z "${FAKE_REPORT:-}" ] || { mkdir -p "${@: -1}" && touch "${@: -1}/index.html"; } ;;
esac
echo "$start $(date +%s.%N) $*" >>"$FAKE_LOG"
"""


# the check's own variables: none of them may leak in from the environment the tests run in
CHECK_VARIABLES = (
    "GRID", "STEPS", "BUDGET", "BUDGET_FLOOR", "BUDGET_START", "STEP_LIMIT", "OUT", "STORE",
    "CAUSAL", "BIDIRECTIONAL", "DECODE", "WARM_JOBS", "WARM_LEAST", "COMPILE_CACHE",
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TASK_WORKERS", "CACHE_MAX_MIB",
)  # fmt: skip


def _run_with_a_fake_gpu(
    tmp_path: Path, root: Path = ROOT, **env: str
) -> subprocess.CompletedProcess:
    """gpu_check.sh (of the tree at root) run with the stand-in interpreter, its commands logged
    in tmp_path."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return subprocess.run(
        ["bash", str(root / "benchmarks" / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k not in CHECK_VARIABLES},
            "PYTHON": str(python),
            "FAKE_LOG": str(tmp_path / "commands.log"),
            "STORE": str(tmp_path / "store.sqlite"),
            **env,
        },
        cwd=root,
    )


def _check_with_a_fake_gpu(
    tmp_path: Path, root: Path = ROOT, **env: str
) -> tuple[list[tuple[float, float, str]], str]:
    """gpu_check.sh run with the stand-in interpreter: (start, end, command) of each command, and
    what the check printed."""
    run = _run_with_a_fake_gpu(tmp_path, root, **env)
    assert run.returncode == 0, run.stderr
    log = tmp_path / "commands.log"
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()] if log.exists() else []
    return sorted((float(a), float(b), command) for a, b, command in lines), run.stdout


def _kind(command: str) -> str:
    """Which step a logged command belongs to."""
    if "attention_zoo bench" in command:
        return command.split("--run-id ")[1].split()[0]
    for script, kind in (
        ("gpu_targets.py", "targets"),
        ("test_fla_accuracy.py", "accuracy"),
        ("-m pytest", "tests"),
        ("record.py", "asv"),
        ("attention_zoo report", "report"),
    ):
        if script in command:
            return kind
    return command


@pytest.mark.slow
def test_the_check_warms_in_parallel_then_times_the_targets_grids_first(tmp_path):
    commands, printed = _check_with_a_fake_gpu(tmp_path, FAKE_SECONDS="0.3", WARM_JOBS="4")
    kinds = [_kind(c) for _, _, c in commands]
    order = list(dict.fromkeys(kinds))
    assert order == [
        "warm", "attention-causal", "attention-bidirectional", "decode", "targets", "accuracy",
        "tests", "block-causal", "block-bidirectional", "asv", "report",
    ]  # fmt: skip
    warm = [(a, b, c) for a, b, c in commands if _kind(c) == "warm"]
    assert all("--cuda-graphs off" in c and "--repeats 1" in c for _, _, c in warm)
    # the stand-in's answer: 6 + 3 + 3 grids compile (causal, bidirectional, decoding), 4 + 4 tune
    assert "warm: 12 grids to compile, 8 to tune: 20 ran, 0 stopped" in printed
    compiling = [w for w in warm if not any(f" {b} " in w[2] for b in TUNED)]
    tuning = [w for w in warm if w not in compiling]
    assert (len(compiling), len(tuning)) == (12, 8)
    at_once = max(sum(a <= t < b for a, b, _ in compiling) for t, _, _ in compiling)
    assert 2 <= at_once <= 4
    # a tuning run has the GPU alone: it starts after every other warm-up run ended
    for a, _, c in tuning:
        assert all(b <= a for b2_start, b, c2 in warm if c2 != c and b2_start < a)
    # no bench step predicts its cases' times first (that preflight compiles every case at 1k)
    benches = [c for _, _, c in commands if "attention_zoo bench" in c]
    assert all(c.split().count("--time-limit") == 1 and "--time-limit none" in c for c in benches)
    assert all("--lengths 16384,65536" in c for c in benches)
    # the decoding targets' backends are timed first
    (decode,) = [c for c in benches if "--run-id decode" in c]
    assert decode.split("--backends ")[1].startswith("sdpa,linear,performer,")
    # four pytest workers on the one GPU, not one a core
    pytests = [c for _, _, c in commands if "-m pytest" in c]
    assert len(pytests) == 2 and all(" -n 4 " in f"{c} " for c in pytests)
    # each step says its time and status as it ends, before the next starts
    said = [line for line in printed.splitlines() if line.startswith("=== ")]
    assert len(said) == 2 * len(order)
    for (started, ended), kind in zip(zip(said[::2], said[1::2]), order):
        assert started.startswith(f"=== {kind} (at most ")
        name, seconds, word, status = ended.split()[1:]
        assert (name, seconds[-1], word, status) == (kind, "s", "exit", "0")
    assert "=== report (at most 40s)" in printed


TUNED = ("retention", "gla", "deltanet", "gated-deltanet")


@pytest.mark.slow
def test_the_task_presets_run_alone_and_side_by_side(tmp_path):
    """STEPS=tasks: the niah and state-tracking gpu presets, runs side by side in TASK_WORKERS
    processes, into the check's store; never part of the check itself (the order test)."""
    commands, printed = _check_with_a_fake_gpu(tmp_path, STEPS="tasks", TASK_WORKERS="6")
    runs = [c for _, _, c in commands]
    assert [c.split("reproduce ")[1].split()[0] for c in runs] == ["niah", "state-tracking"]
    store = str(tmp_path / "store.sqlite")
    for c in runs:
        assert "--preset gpu" in c and "--executor processes --workers 6" in c and store in c
    assert "tasks-niah" in printed and "tasks-state" in printed


@pytest.mark.slow
def test_the_gate_step_runs_the_cuda_acceptance_alone(tmp_path):
    """STEPS=gate: one gate run on an unchanged commit and one on a planted 1.25x slowdown, on
    CUDA, their output logged beside the store; never part of the check itself (the order
    test). A copy without git runs it from a scratch repository, removed after."""
    commands, printed = _check_with_a_fake_gpu(tmp_path, STEPS="gate")
    (run,) = [c for _, _, c in commands]
    script, *flags = run.split()
    assert script == str(ROOT / "benchmarks" / "scripts" / "acceptance.py")
    assert " ".join(flags) == (
        "--device cuda --runs 1 --scenario unchanged --scenario slowdown --slowdown 1.25 "
        f"--log {tmp_path}/gate-acceptance.log"
    )
    assert "=== gate (at most " in printed
    tree = tmp_path / "tree"
    (tree / "benchmarks" / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "budget.sh"):
        shutil.copy(ROOT / "benchmarks" / "scripts" / name, tree / "benchmarks" / "scripts")
    (tmp_path / "commands.log").unlink()
    commands, _ = _check_with_a_fake_gpu(
        tmp_path, tree, STEPS="gate", GIT_CEILING_DIRECTORIES=str(tmp_path)
    )
    (run,) = [c for _, _, c in commands]
    copied = Path(run.split()[0]).parents[2]
    assert copied != tree and not copied.exists() and not (tree / ".git").exists()


@pytest.mark.slow
def test_warming_stops_at_its_share_of_the_budget(tmp_path):
    """Compiling stops at 60% of the warm-up's share (10 s: the floor), tuning gets the rest;
    each stopped run's log ends the warm-up's output."""
    start = time.monotonic()
    commands, printed = _check_with_a_fake_gpu(
        tmp_path, FAKE_SECONDS="30", WARM_JOBS="2", WARM_LEAST="1", STEPS="warm", BUDGET="3"
    )
    assert commands == []  # each warm-up run was stopped before it logged its end
    assert "warm: 12 grids to compile, 8 to tune: 0 ran, 3 stopped at the limit" in printed
    stopped = [line for line in printed.splitlines() if line.endswith(": stopped at the limit")]
    assert stopped == [
        "warm: attention true local: stopped at the limit",
        "warm: attention true sliding-window: stopped at the limit",
        "warm: attention true retention: stopped at the limit",
    ]
    assert printed.count("\n    fake bench: started\n") == 3
    assert time.monotonic() - start < 15


def test_a_failed_warm_up_run_shows_the_end_of_its_log(tmp_path):
    _, printed = _check_with_a_fake_gpu(
        tmp_path, FAKE_SECONDS="0", FAKE_FAIL="nystrom", STEPS="warm", WARM_LEAST="1"
    )
    lines = printed.splitlines()
    at = lines.index("warm: attention false nystrom: failed (exit 1)")
    assert lines[at + 1 : at + 3] == ["    fake bench: started", "    fake bench: failed"]
    assert "19 ran, 0 stopped at the limit, 1 failed" in printed


@pytest.mark.parametrize("jobs", ["0", "two"])
def test_a_warm_up_without_a_process_to_run_is_refused(tmp_path, jobs):
    run = _run_with_a_fake_gpu(tmp_path, WARM_JOBS=jobs)
    assert run.returncode == 2
    assert run.stderr.strip() == f"WARM_JOBS must be a whole number of at least 1, not '{jobs}'"


@pytest.mark.slow
def test_a_run_hands_its_compile_caches_to_the_next(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        (folder / "out").mkdir(parents=True)
    warm = {"FAKE_SECONDS": "0", "STEPS": "warm", "WARM_LEAST": "1"}
    _, printed = _check_with_a_fake_gpu(first, OUT=str(first / "out"), **warm)
    tarball = first / "out" / "compile-cache.tgz"
    assert tarball.exists() and "COMPILE_CACHE=it for the next run" in printed
    assert (first / "commands.log.cache").read_text().split()[0] == "0"  # cold
    _, printed = _check_with_a_fake_gpu(second, COMPILE_CACHE=str(tarball), **warm)
    assert f"compile caches from {tarball}" in printed
    found = [int(n) for n in (second / "commands.log.cache").read_text().split()]
    assert min(found) >= 18  # every run of the first left a kernel; each of the second sees them


def test_compile_caches_larger_than_cache_max_mib_are_not_kept(tmp_path):
    (tmp_path / "out").mkdir()
    _, printed = _check_with_a_fake_gpu(
        tmp_path, OUT=str(tmp_path / "out"), STEPS="targets", CACHE_MAX_MIB="0"
    )
    assert not (tmp_path / "out" / "compile-cache.tgz").exists()
    (line,) = [line for line in printed.splitlines() if line.startswith("compile caches:")]
    assert line.startswith("compile caches: not kept: their tarball has ")
    assert line.endswith(" KiB, more than CACHE_MAX_MIB=0")


@pytest.mark.slow
def test_the_budget_counts_from_the_start_of_the_script(tmp_path):
    _, printed = _check_with_a_fake_gpu(
        tmp_path, STEPS="targets", BUDGET="100", FAKE_SETUP_SECONDS="2"
    )
    (line,) = [line for line in printed.splitlines() if line.startswith("=== targets (")]
    assert int(line.split("at most ")[1].split("s)")[0]) <= 98


def test_without_fla_the_check_says_so_first(tmp_path):
    _, printed = _check_with_a_fake_gpu(tmp_path, STEPS="targets", FAKE_NO_FLA="1")
    first = printed.splitlines()[0]
    assert first.startswith(
        "gpu_check.sh: WARNING: fla cannot be imported (ModuleNotFoundError: No module named "
        "'fla'): fla's accuracy tests will skip"
    )
    _, printed = _check_with_a_fake_gpu(tmp_path, STEPS="targets")
    assert "WARNING" not in printed


@pytest.mark.slow
def test_a_tree_without_git_records_asv_from_a_scratch_commit_and_keeps_its_tarballs(tmp_path):
    """A copy without .git: record.py runs from a scratch repository of the tree's files (what
    .gitignore leaves out left out), one commit, removed after; its results, the report and the
    caches land in OUT, the report's tarball before the caches'."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    (tree / "benchmarks" / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "budget.sh"):
        shutil.copy(ROOT / "benchmarks" / "scripts" / name, tree / "benchmarks" / "scripts")
    (tree / ".gitignore").write_text("ignored/\n")
    (tree / "ignored").mkdir()
    (tree / "ignored" / "big").write_text("not committed")
    out.mkdir()
    _, printed = _check_with_a_fake_gpu(
        tmp_path,
        tree,
        OUT=str(out),
        STEPS="warm asv report",
        FAKE_SECONDS="0",
        WARM_LEAST="1",
        FAKE_REPORT="1",
        GIT_CEILING_DIRECTORIES=str(tmp_path),
    )
    (asv,) = (tmp_path / "commands.log.asv").read_text().splitlines()
    repo, commits, changed, files = asv.split()
    assert (commits, changed) == ("1", "0")
    assert files == ".gitignore,benchmarks/scripts/budget.sh,benchmarks/scripts/gpu_check.sh,"
    assert not Path(repo).exists() and not (tree / ".git").exists()
    assert "asv: no git repository here: recording from a scratch repository" in printed
    assert f"results in {out}/asv-results" in printed
    assert (out / "asv-results" / "cuda-fake" / "result.json").exists()
    lines = printed.splitlines()
    at = {
        key: next(i for i, line in enumerate(lines) if line.startswith(key))
        for key in ("=== asv ", "report folder: ", "GPU check on", "compile caches: ")
    }
    assert at["=== asv "] < at["report folder: "] < at["GPU check on"] < at["compile caches: "]
    assert (out / "gpu-report.tgz").exists() and (out / "compile-cache.tgz").exists()
