"""Every bad input to `zoo` is one line on stderr and exit code 2: no traceback, nothing changed on
disk (no store created, no run row, no model trained); Ctrl-C keeps what was finished."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from attention_zoo.cli import SIGPIPE_EXIT, main
from attention_zoo.store import ResultStore, run_status

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")

# (id, argv, a piece of the message). Placeholders: {store} a store with one run, {empty} a 0-byte
# file, {no_runs} a store without runs, {garbage} a file that is not a store, {ro_store} a
# read-only store, {ro_dir} a read-only folder, {file} an existing plain file, {bad_toml} a preset
# that is not valid TOML, {heads_toml}, {causal_toml}, {long_toml}, {threads_toml}, {budget_toml}
# presets with one bad value each.
BAD_INPUTS: list[tuple[str, list[str], str]] = [
    # the results store: missing, empty, garbage, read-only, mistyped folder
    ("report-no-store", ["report"], "no results store at results/zoo.sqlite"),
    ("task-table-no-store", ["task", "--table2", "--store", "{missing}"], "no results store at"),
    ("list-import-not-python", ["list", "--import", "{file}"], "is not a Python module"),
    ("report-empty-store", ["report", "--store", "{empty}"], "(the file is empty)"),
    ("report-store-without-runs", ["report", "--store", "{no_runs}"], "nothing stored in"),
    ("results-store-without-runs", ["results", "--store", "{no_runs}"], "holds no runs yet"),
    ("report-garbage-store", ["report", "--store", "{garbage}"], "not an attention-zoo results"),
    ("results-empty-store", ["results", "--store", "{empty}"], "(the file is empty)"),
    ("results-garbage-store", ["results", "--store", "{garbage}"], "not an attention-zoo results"),
    ("results-no-store", ["results", "--store", "none.sqlite"], "no results store at none.sqlite"),
    (
        "bench-read-only-store",
        ["bench", "--backends", "full", "--lengths", "64", "--store", "{ro_store}"],
        "cannot write to the results store",
    ),
    (
        "task-read-only-store",
        ["task", "duplication", "--preset", "smoke", "--store", "{ro_store}"],
        "cannot write to the results store",
    ),
    (
        "bench-store-in-mistyped-folder",
        ["bench", "--backends", "full", "--store", "reslts/zoo.sqlite"],
        "folder reslts does not exist; create it first or fix the path; did you mean 'results'?",
    ),
    (
        "task-store-in-mistyped-folder",
        ["task", "duplication", "--preset", "smoke", "--store", "nowhere/zoo.sqlite"],
        "folder nowhere does not exist",
    ),
    ("bench-store-is-a-folder", ["bench", "--store", "results"], "is a folder"),
    # devices
    ("bench-devices-cuda", ["bench", "--devices", "cuda"], "CUDA is not available here"),
    ("bench-device-alias-cuda", ["bench", "--device", "cuda"], "CUDA is not available here"),
    ("bench-devices-tpu", ["bench", "--devices", "tpu"], "'tpu': unknown device; use cpu, cuda"),
    ("list-device-tpu", ["list", "--device", "tpu"], "'tpu': unknown device"),
    ("task-device-cuda", ["task", "duplication", "--device", "cuda"], "CUDA is not available"),
    ("memory-devices-tpu", ["memory", "--devices", "tpu"], "unknown device"),
    # numeric flags
    ("bench-threads-0", ["bench", "--threads", "0"], "--threads: must be an integer >= 1, got 0"),
    ("bench-repeats-0", ["bench", "--repeats", "0"], "--repeats: must be an integer >= 1"),
    ("bench-timeout-negative", ["bench", "--isolate", "--timeout", "-5"], "must be a number > 0"),
    ("bench-budget-negative", ["bench", "--budget", "-1"], "--budget: must be a number >= 0"),
    ("bench-time-limit-0", ["bench", "--time-limit", "0"], "--time-limit: must be a number > 0"),
    ("bench-budget-nan", ["bench", "--budget", "nan"], "expected a finite number"),
    ("bench-lengths-0", ["bench", "--lengths", "1024,0"], "must be an integer >= 1, got 0"),
    ("bench-lengths-text", ["bench", "--lengths", "1k"], "expected an integer, got '1k'"),
    ("bench-batch-0", ["bench", "--batch", "0"], "--batch: must be an integer >= 1"),
    ("bench-heads-0", ["bench", "--heads", "0"], "--heads: must be an integer >= 1"),
    ("bench-memory-limit-0", ["bench", "--memory-limit", "0"], "must be a size > 0"),
    ("bench-memory-limit-text", ["bench", "--memory-limit", "lots"], "--memory-limit"),
    ("memory-fits-0", ["memory", "--fits", "0"], "--fits: must be a size > 0"),
    ("task-max-steps-0", ["task", "duplication", "--max-steps", "0"], "must be an integer >= 1"),
    ("task-threads-0", ["task", "duplication", "--threads", "0"], "must be an integer >= 1"),
    ("task-seeds-negative", ["task", "duplication", "--seeds", "-1"], "from 0 to 4294967295"),
    ("task-train-hashes-0", ["task", "duplication", "--train-hashes", "0"], "integer >= 1"),
    (
        "task-train-hashes-without-lsh",
        ["task", "duplication", "--backends", "local", "--train-hashes", "2", "--dry-run"],
        "no backend here has an lsh layer (local): add lsh or leave them out",
    ),
    # counts past MAX_COUNT (2**31 - 1): refused as arguments, never a case stored as an error
    (
        "list-context-past-int64-sizes",
        ["list", "--context", "1099511627776"],
        "--context: must be an integer from 1 to 2147483647, got 1099511627776",
    ),
    ("list-context-int64-max", ["list", "--context", "9223372036854775807"], "from 1 to 2147483"),
    ("list-context-past-int64", ["list", "--context", "99999999999999999999"], "from 1 to 21474"),
    (
        "bench-lengths-past-int64",
        ["bench", "--backends", "sdpa", "--lengths", "99999999999999999999", "--threads", "1"],
        "--lengths: must be an integer from 1 to 2147483647, got 99999999999999999999",
    ),
    (
        "bench-lengths-int64-max",
        ["bench", "--backends", "sdpa", "--lengths", "9223372036854775807", "--threads", "1"],
        "--lengths: must be an integer from 1 to 2147483647",
    ),
    ("bench-new-tokens-huge", ["bench", "--new-tokens", "2147483648"], "from 1 to 2147483647"),
    (
        "bench-preset-seq-lens-huge",
        ["bench", "--preset", "{long_toml}", "--dry-run"],
        "seq_lens must be an integer from 1 to 2147483647 (2**31 - 1), got 99999999999999",
    ),
    # comma lists: an empty item is refused, never dropped
    (
        "bench-lengths-empty-item",
        ["bench", "--lengths", "64,,128"],
        "--lengths: '64,,128' has an empty item; give integers separated by single commas",
    ),
    ("bench-backends-trailing-comma", ["bench", "--backends", "sdpa,"], "has an empty item"),
    ("bench-modes-empty-item", ["bench", "--modes", "forward,,decode"], "has an empty item"),
    ("task-seeds-empty-item", ["task", "duplication", "--seeds", "0,,1"], "has an empty item"),
    (
        "bench-option-empty-value",
        ["bench", "--backends", "sdpa", "--option", "sdpa.kv_heads=2,,4"],
        "--option 'sdpa.kv_heads=2,,4' has an empty value",
    ),
    # a backend option given twice would leave only the last
    (
        "bench-option-twice",
        [
            "bench",
            "--backends",
            "sdpa",
            "--option",
            "sdpa.kv_heads=2",
            "--option",
            "sdpa.kv_heads=4",
            "--dry-run",
        ],
        "--option sdpa.kv_heads is given twice ('sdpa.kv_heads=2', 'sdpa.kv_heads=4'); give its "
        "values as one comma list: --option sdpa.kv_heads=2,4",
    ),
    # a negative size: argparse reads it as a flag unless written with '='
    ("memory-fits-negative", ["memory", "--fits=-1GiB"], "--fits: must be a size > 0"),
    (
        "memory-fits-negative-as-a-flag",
        ["memory", "--fits", "-1GiB"],
        "--fits: expected one argument (a value that starts with '-' is written --fits=VALUE)",
    ),
    # names: did you mean
    ("bench-misspelled-flag", ["bench", "--lenghts", "1024"], "did you mean --lengths?"),
    ("memory-misspelled-flag", ["memory", "--fit", "8GiB", "--fitz", "1"], "did you mean --fits?"),
    ("misspelled-command", ["bnech"], "invalid choice: 'bnech'"),
    ("bench-unknown-backend", ["bench", "--backends", "full,flsh"], "did you mean 'lsh'?"),
    ("bench-unknown-option", ["bench", "--option", "sdpa.kernal=math"], "did you mean 'kernel'?"),
    ("bench-option-no-dot", ["bench", "--option", "num_hashes=4"], "write BACKEND.NAME=VALUE"),
    ("bench-unknown-preset", ["bench", "--preset", "quik"], "did you mean 'quick'?"),
    ("bench-missing-preset-file", ["bench", "--preset", "nope.toml"], "does not exist"),
    (
        "task-missing-suite-file",
        ["task", "my-suite.toml"],
        "does not exist; give an existing .toml path, or a task name: associative-recall,",
    ),
    ("bench-bad-toml-preset", ["bench", "--preset", "{bad_toml}"], "is not valid TOML"),
    (
        "bench-preset-a-folder",
        ["bench", "--preset", "results"],
        "preset results is a folder; a preset is a built-in name (",
    ),
    # preset values of the wrong kind: refused before any case, --dry-run included
    (
        "bench-preset-heads-text",
        ["bench", "--preset", "{heads_toml}", "--dry-run"],
        "heads.toml [grid]: num_heads must be an integer >= 1, got 'four'",
    ),
    (
        "bench-preset-causal-strings",
        ["bench", "--preset", "{causal_toml}", "--dry-run"],
        "causal.toml [grid]: causal must be a list of true/false values, got ('false',)",
    ),
    (
        "bench-preset-threads-negative",
        ["bench", "--preset", "{threads_toml}", "--dry-run"],
        "threads.toml [measure]: threads must be an integer >= 1, got -2",
    ),
    (
        "bench-preset-budget-text",
        ["bench", "--preset", "{budget_toml}"],
        "budget.toml [measure]: time_budget_s must be a number of seconds, got 'x'",
    ),
    ("bench-unknown-mode", ["bench", "--modes", "forwad"], "did you mean 'forward'?"),
    ("bench-unknown-dtype", ["bench", "--dtypes", "float3"], "unknown dtype 'float3'"),
    ("bench-unknown-metric-group", ["bench", "--metrics", "tme"], "did you mean 'time'?"),
    ("bench-unknown-target", ["bench", "--target", "blok"], "did you mean 'block'?"),
    ("bench-unknown-reference", ["bench", "--reference", "fulll"], "did you mean 'full'?"),
    (
        "bench-ray-flag-without-ray",
        ["bench", "--ray-address", "auto"],
        "--ray-address applies to --executor ray",
    ),
    (
        "bench-reference-not-benched",
        ["bench", "--backends", "full,sdpa", "--reference", "lsh"],
        "not among the benchmarked backends (full, sdpa)",
    ),
    ("task-unknown-task", ["task", "duplicaton"], "did you mean 'duplication'?"),
    ("task-unknown-preset", ["task", "duplication", "--preset", "smok"], "did you mean 'smoke'?"),
    ("task-unknown-backend", ["task", "duplication", "--backends", "lcal"], "did you mean"),
    (
        "reproduce-settings-it-lacks",
        ["reproduce", "zoology", "--preset", "smoke", "--settings", "lra"],
        "reproduction 'zoology' has no settings 'lra'; settings: preset",
    ),
    (
        "reproduce-unknown-settings",
        ["reproduce", "lra-listops", "--preset", "smoke", "--settings", "lr"],
        "has no settings 'lr'; settings: preset, lra",
    ),
    (
        "reproduce-smoke-at-paper-scale",
        ["reproduce", "reformer", "--preset", "smoke", "--scale", "paper"],
        "--preset smoke and --scale paper disagree; give one",
    ),
    ("results-format-typo", ["results", "--format", "cvs"], "did you mean 'csv'?"),
    (
        "results-unknown-metric",
        ["results", "--store", "{store}", "--format", "csv", "--metric", "nosuch"],
        "no metric 'nosuch' stored; metrics: flops, peak_bytes",
    ),
    ("results-unknown-run", ["results", "--store", "{store}", "--run-id", "x"], "no run 'x'"),
    ("report-unknown-run", ["report", "--store", "{store}", "--run-id", "x"], "no run 'x'"),
    (
        "report-from-and-store",
        ["report", "--from", "folder", "--store", "{store}"],
        "--store reads a store; --from rebuilds a folder from its rows: use one",
    ),
    (
        "results-unknown-reference",
        ["results", "--store", "{store}", "--reference", "sdpa"],
        "--reference 'sdpa' is not among the benchmarked backends (full)",
    ),
    ("import-missing-module", ["list", "--import", "no_such_zoo_plugin"], "No module named"),
    ("import-missing-file", ["--import", "nope/mine.py", "list"], "no file nope/mine.py"),
    # flags that conflict or do nothing
    (
        "bench-resume-with-run-id",
        ["bench", "--resume", "--run-id", "x"],
        "--resume and --run-id cannot be combined",
    ),
    (
        "results-runs-with-format-csv",
        ["results", "--store", "{store}", "--runs", "--format", "csv"],
        "--runs lists the runs as a table",
    ),
    (
        "results-runs-with-run-id",
        ["results", "--runs", "--run-id", "x"],
        "--runs and --run-id cannot be combined",
    ),
    (
        "results-metric-with-table",
        ["results", "--store", "{store}", "--metric", "flops"],
        "--metric selects rows for csv/json",
    ),
    ("task-list-with-table2", ["task", "--list", "--table2"], "--list and --table2 cannot be"),
    ("task-list-with-run-spec", ["task", "duplication", "--list"], "--list takes no RUN_SPEC"),
    ("task-table2-with-force", ["task", "--table2", "--force"], "--force needs a RUN_SPEC"),
    ("report-unknown-flag", ["report", "--xyz"], "unrecognized argument --xyz (see 'zoo report"),
    # known before anything runs: a named kernel that cannot, a metric it cannot be measured with
    (
        "bench-named-kernel-that-cannot-run-here",
        ["bench", "--backends", "linear", "--option", "linear.kernel=fla", "--lengths", "64"],
        "linear kernel='fla' cannot run here: runs on cuda, not cpu; takes bfloat16, "
        "not float32; use kernel='auto' (picks scan); nothing was run or stored",
    ),
    (
        "bench-flex-on-cpu-with-dispatch-mode-metrics",
        ["bench", "--backends", "local", "--option", "local.kernel=flex", "--lengths", "64"],
        "cannot be measured with metrics crosscheck, predict, flops: the storage tracker and the "
        "FLOP counter are torch dispatch modes, which cannot follow flex_attention",
    ),
    (
        "bench-option-for-a-backend-not-measured",
        ["bench", "--backends", "full", "--option", "lsh.num_hashes=4"],
        "--option lsh.num_hashes=4 would change nothing: no case measured here runs lsh",
    ),
    (
        "memory-option-for-a-backend-not-measured",
        ["memory", "--backends", "full", "--option", "lsh.num_hashes=4"],
        "--option lsh.num_hashes=4 would change nothing",
    ),
    (
        "bench-resume-with-nothing-to-resume",
        [
            "bench",
            "--backends",
            "full",
            "--lengths",
            "8",
            "--metrics",
            "flops",
            "--resume",
            "--store",
            "{store}",
            "--no-progress",
        ],
        "holds no earlier run of these 1 bench jobs to continue",
    ),
    ("bench-run-id-a-path", ["bench", "--run-id", "a/b"], "a run name is letters, digits"),
    ("task-run-id-empty", ["task", "duplication", "--run-id", ""], "a run name is letters"),
    (
        "bench-every-case-skipped",
        ["bench", "--backends", "nystrom", "--lengths", "8"],
        "cannot run causally (it is bidirectional only); pass --causal false",
    ),
    (
        "bench-every-case-skipped-in-worker-processes",
        ["bench", "--backends", "nystrom", "--lengths", "8", "--executor", "processes"],
        "cannot run causally (it is bidirectional only); pass --causal false",
    ),
    (
        "bench-every-case-skipped-for-different-reasons",
        ["bench", "--backends", "nystrom,xformers", "--lengths", "8"],
        "(and 1 more case, for this and other reasons); nothing was run or stored",
    ),
    (
        "bench-every-decode-case-skipped",  # generation is causal: no --causal false to suggest
        ["bench", "--backends", "nystrom", "--lengths", "8", "--mode", "decode"],
        "'nystrom' cannot run causally (bidirectional only); nothing was run or stored",
    ),
    (
        "task-table2-of-a-store-without-task-runs",
        ["task", "--table2", "--store", "{store}"],
        "no stored task runs in",
    ),
    (
        "bench-peer-family-mirroring-nothing",
        ["bench", "--backends", "full", "--lengths", "8", "--peers", "hf"],
        "--peers hf would change nothing",
    ),
    (
        "bench-hidden-of-the-core-alone",
        ["bench", "--backends", "full", "--target", "attention", "--hidden", "99"],
        "--hidden would change nothing",
    ),
    (
        "bench-hidden-of-decoding",
        ["bench", "--backends", "full", "--target", "block", "--mode", "decode", "--hidden", "99"],
        "every case here measures the attention core alone",
    ),
    (
        "task-every-backend-skipped",
        ["task", "duplication", "--preset", "smoke", "--backends", "nystrom"],
        "no backend asked for can train here (nystrom:",
    ),
    (
        "task-eval-hashes-without-lsh",
        ["task", "duplication", "--preset", "smoke", "--backends", "full", "--eval-hashes", "2"],
        "evaluation hash counts (--eval-hashes)",
    ),
    (
        "bench-new-tokens-without-decoding",
        ["bench", "--backends", "full", "--lengths", "8", "--new-tokens", "4"],
        "--new-tokens applies to the prefill and decode modes",
    ),
    (
        "bench-resume-of-a-missing-store",
        ["bench", "--backends", "full", "--lengths", "8", "--resume", "--store", "{missing}"],
        "does not exist, so it holds no run to continue",
    ),
    (
        "task-resume-of-a-missing-store",
        ["task", "duplication", "--preset", "smoke", "--resume", "--store", "{missing}"],
        "does not exist, so it holds no run to continue",
    ),
    (
        "report-unknown-reference",
        ["report", "--store", "{store}", "--reference", "nosuch"],
        "--reference 'nosuch': no measured variant of that name",
    ),
    # output paths
    (
        "results-output-missing-folder",
        ["results", "--store", "{store}", "-o", "/missing/dir/x.csv"],
        "folder /missing/dir does not exist",
    ),
    (
        "results-output-read-only-folder",
        ["results", "--store", "{store}", "-o", "{ro_dir}/x.csv"],
        "cannot write in",
    ),
    ("results-output-is-a-folder", ["results", "--store", "{store}", "-o", "."], "is a folder"),
    (
        "bench-store-read-only-folder-dry-run",
        [
            "bench",
            "--backends",
            "full",
            "--lengths",
            "8",
            "--store",
            "{ro_dir}/z.sqlite",
            "--dry-run",
        ],
        "cannot write in",
    ),
    (
        "task-store-read-only-folder",
        ["task", "duplication", "--preset", "smoke", "--store", "{ro_dir}/z.sqlite"],
        "cannot write in",
    ),
    ("report-out-is-a-file", ["report", "--store", "{store}", "--out", "{file}"], "is a file"),
    (
        "report-out-read-only",
        ["report", "--store", "{store}", "--out", "{ro_dir}/report"],
        "cannot write in",
    ),
    ("report-out-missing-parent", ["report", "--out", "nowhere/report"], "does not exist"),
    (
        "report-index-missing-folder",
        ["report", "--store", "{store}", "--index", "nowhere/README.md"],
        "--index nowhere/README.md: folder nowhere does not exist",
    ),
]
CUDA_CASES = {"bench-devices-cuda", "bench-device-alias-cuda", "task-device-cuda"}


def _read_only(path: Path) -> Callable[[], None] | None:
    """Make `path` read-only even for root (chattr +i); returns the undo, or None if impossible."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        return lambda: path.chmod(mode)
    if shutil.which("chattr") is None:
        return None
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        return None
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def make_fixtures(root: Path) -> tuple[dict[str, str], list[Callable[[], None]]]:
    """The files the placeholders stand for, under `root`; returns them and the undo actions."""
    store = root / "store.sqlite"
    with ResultStore(store) as s:
        run = s.start_run(kind="bench")
        config = {"target": "attention", "backend": "full", "seq_len": 64, "mode": "forward"}
        s.add_rows(run, None, config, [("flops", 1.0, "flop"), ("peak_bytes", 2.0, "bytes")])
        s.finish_run(run)
    (root / "results").mkdir()
    (root / "empty.sqlite").write_bytes(b"")
    ResultStore(root / "no_runs.sqlite").close()
    (root / "garbage.sqlite").write_text("not a database\n" * 100)
    (root / "file.txt").write_text("a plain file\n")
    (root / "bad.toml").write_text("[grid]\nseq_lens = [1024\n")
    grid = '[grid]\nbackends = ["sdpa"]\nseq_lens = [64]\n'
    (root / "heads.toml").write_text(grid + 'num_heads = "four"\n')
    (root / "causal.toml").write_text(grid + 'causal = ["false"]\n')
    (root / "long.toml").write_text('[grid]\nbackends = ["sdpa"]\nseq_lens = [99999999999999]\n')
    (root / "threads.toml").write_text(grid + "[measure]\nthreads = -2\n")
    (root / "budget.toml").write_text(grid + '[measure]\ntime_budget_s = "x"\n')
    shutil.copy(store, root / "ro_store.sqlite")
    (root / "ro_dir").mkdir()
    undo = [u for u in (_read_only(root / "ro_store.sqlite"), _read_only(root / "ro_dir")) if u]
    names = {
        "store": "store.sqlite",
        "empty": "empty.sqlite",
        "no_runs": "no_runs.sqlite",
        "garbage": "garbage.sqlite",
        "file": "file.txt",
        "bad_toml": "bad.toml",
        "heads_toml": "heads.toml",
        "causal_toml": "causal.toml",
        "long_toml": "long.toml",
        "threads_toml": "threads.toml",
        "budget_toml": "budget.toml",
        "ro_store": "ro_store.sqlite",
        "ro_dir": "ro_dir",
        "missing": "missing.sqlite",  # never created
    }
    return {k: str(root / v) for k, v in names.items()}, undo


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under root with its bytes: 'unchanged' means no new store, no run row,
    no created folder."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, dict]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZOO_IMPORT", raising=False)
    paths, undo = make_fixtures(tmp_path)
    paths["read_only_ok"] = len(undo) == 2
    yield tmp_path, paths
    for u in undo:
        u()


def run_zoo(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    request: pytest.FixtureRequest,
    workdir: tuple[Path, dict],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    root, paths = workdir
    case = request.node.callspec.id
    if case in CUDA_CASES and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    if "{ro_" in " ".join(argv) and not paths["read_only_ok"]:
        pytest.skip("cannot make a file read-only here (root without chattr)")
    argv = [a.format(**paths) for a in argv]
    before = snapshot(root)
    code, out, err = run_zoo(argv, capsys)
    assert code == 2, (out, err)
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and message in err, err
    assert err.startswith("zoo"), err
    assert snapshot(root) == before


def test_bench_in_a_read_only_folder_names_store(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default store's folder cannot be made here: the line says how to give another."""
    root, paths = workdir
    if not paths["read_only_ok"]:
        pytest.skip("cannot make a folder read-only here (root without chattr)")
    monkeypatch.chdir(paths["ro_dir"])
    before = snapshot(root)
    code, _, err = run_zoo(["bench", "--backends", "full", "--lengths", "64"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot create the results store's folder results" in err and "--store PATH" in err
    assert snapshot(root) == before


def test_debug_shows_the_traceback(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_zoo(["report", "--debug"], capsys)
    assert code == 2 and "Traceback" in err and err.splitlines()[-1].startswith("zoo report: error")
    code, _, err = run_zoo(["--debug", "report"], capsys)
    assert code == 2 and "Traceback" in err


def test_deprecated_run_flag_still_works_with_a_note(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    _, paths = workdir
    code, out, err = run_zoo(["results", "--store", paths["store"], "--run", "latest"], capsys)
    assert code == 0 and "full" in out
    assert err.strip() == "zoo results: note: --run is deprecated; use --run-id"


def test_results_csv_exports_every_run_by_default(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    _, paths = workdir
    with ResultStore(paths["store"]) as store:
        run = store.start_run(kind="bench")
        store.add_rows(run, None, {"backend": "sdpa", "seq_len": 64}, [("flops", 3.0, "flop")])
    code, out, _ = run_zoo(["results", "--store", paths["store"], "--format", "csv"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 1 + 3  # header + rows of both runs
    code, out, _ = run_zoo(
        ["results", "--store", paths["store"], "--format", "csv", "--run-id", "latest"], capsys
    )
    assert code == 0 and len(out.strip().splitlines()) == 1 + 1


FAST = ["--budget", "0", "--repeats", "1", "--threads", "1", "--no-progress"]


@pytest.mark.slow
def test_ctrl_c_in_bench_keeps_finished_cases_and_marks_the_run(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import attention_zoo.sweep as sweep

    real, calls = sweep.measure_case, []

    def measure_then_ctrl_c(case, settings, predicted=None):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(case, settings, predicted)

    monkeypatch.setattr(sweep, "measure_case", measure_then_ctrl_c)
    argv = ["bench", "--target", "attention", "--backends", "full", "--lengths", "32,64"]
    argv += ["--metrics", "flops", "--store", "zoo.sqlite", *FAST]
    code, _, err = run_zoo(argv, capsys)
    last = err.splitlines()[-1]  # after the "2 cases -> zoo.sqlite ..." header
    assert code == 130 and "Traceback" not in err and last.startswith("zoo bench: interrupted: ")
    assert "1 of 2 cases are stored" in last and "--resume" in last and "marked interrupted" in last
    with ResultStore("zoo.sqlite") as store:
        (run,) = store.runs()
        assert run_status(run) == "interrupted" and run["n_cases"] == 1
    monkeypatch.setattr(sweep, "measure_case", real)
    code, out, err = run_zoo([*argv, "--resume"], capsys)
    assert code == 0 and "1 already stored (resumed)" in out, err
    with ResultStore("zoo.sqlite") as store:
        (run,) = store.runs()
        assert run_status(run) == "finished" and run["n_cases"] == 2


@pytest.mark.slow
def test_ctrl_c_in_task_keeps_finished_runs_and_marks_the_run(
    workdir: tuple[Path, dict], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first training run finishes (a stand-in outcome), Ctrl-C hits the second."""
    import attention_zoo.tasks.runner as runner
    from attention_zoo.tasks.trainer import EvalResult, TrainResult

    calls = []

    def train_then_ctrl_c(spec, *, device="cpu", on_step=None):
        calls.append(spec)
        if len(calls) == 2:
            raise KeyboardInterrupt
        result = TrainResult(
            steps=1, steps_to_target=None, final_accuracy=0.5, final_loss=1.0,
            stopped="max_steps", wall_time_s=0.0,
        )  # fmt: skip
        test = EvalResult(accuracy=0.5, loss=1.0, scored=1)
        return runner.RunOutcome(spec=spec, result=result, test=test, evals={})

    monkeypatch.setattr(runner, "run_one", train_then_ctrl_c)
    argv = ["task", "duplication", "--preset", "smoke", "--backends", "full", "--seeds", "0,1"]
    code, _, err = run_zoo([*argv, "--eval-hashes", "", "--quiet"], capsys)
    assert code == 130 and len(err.splitlines()) == 1, err
    assert "1 of 2 training run(s) finished and stored" in err and "rerun the same command" in err
    with ResultStore("results/zoo.sqlite") as store:
        (run,) = store.runs(kind="task")
        assert run_status(run) == "interrupted" and run["n_cases"] == 1


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler, whatever pytest was started with (a shell's background job
    starts with SIGINT ignored, and a real SIGINT would then do nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint_on_load_sample(monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    """Ctrl-C arrives while the store samples the machine's load for the `at_call`-th time."""
    import time

    import attention_zoo.store as store_module
    from attention_zoo.measure.load import Load

    calls = []

    def sample() -> Load:
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the interrupt lands here
        return Load(0.0, "sampled")

    monkeypatch.setattr(store_module, "machine_load", sample)


def test_ctrl_c_while_a_task_run_is_closed_marks_it_interrupted(
    workdir: tuple[Path, dict],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    python_sigint: None,
) -> None:
    """Before: 'zoo task: ' with nothing after it, and the run 'unfinished' for ever."""
    import attention_zoo.tasks.runner as runner

    from .test_engine import trained

    monkeypatch.setattr(runner, "run_one", trained)
    _sigint_on_load_sample(monkeypatch, at_call=2)  # 1: the run starts, 2: it is finished
    argv = ["task", "duplication", "--preset", "smoke", "--backends", "full", "--seeds", "0"]
    code, _, err = run_zoo([*argv, "--eval-hashes", "", "--quiet"], capsys)
    assert code == 130 and len(err.splitlines()) == 1, err
    assert "1 of 1 training run(s) finished and stored" in err and "rerun the same command" in err
    with ResultStore("results/zoo.sqlite") as store:
        (run,) = store.runs(kind="task")
        assert run_status(run) == "interrupted" and run["n_cases"] == 1


@pytest.mark.slow
def test_ctrl_c_while_a_bench_run_is_closed_marks_it_interrupted(
    workdir: tuple[Path, dict],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    python_sigint: None,
) -> None:
    _sigint_on_load_sample(monkeypatch, at_call=1)  # bench samples its start load itself
    argv = ["bench", "--backends", "full", "--lengths", "16", "--metrics", "predict",
            "--threads", "1", "--no-progress"]  # fmt: skip
    code, _, err = run_zoo(argv, capsys)
    assert code == 130 and "1 of 1 cases are stored" in err and "--resume" in err, err
    with ResultStore("results/zoo.sqlite") as store:
        (run,) = store.runs(kind="bench")
        assert run_status(run) == "interrupted"


@pytest.mark.slow  # a process of its own
def test_a_reader_that_stops_early_ends_the_command_quietly() -> None:
    """`zoo ... | head`: the writer ends with the shell's SIGPIPE status and no error line."""
    argv = [sys.executable, "-m", "attention_zoo", "task", "duplication", "--preset", "smoke"]
    proc = subprocess.Popen(
        [*argv, "--dump", "5000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith('{"input"')
    proc.stdout.close()  # more than a pipe's buffer is still to come
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == SIGPIPE_EXIT and err == "", err
