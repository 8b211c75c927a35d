"""`zoo bench`, `zoo memory`, `zoo results`: help with examples, tables, exports, clear errors."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest
import torch

from attention_zoo.attention.spec import BACKENDS
from attention_zoo.cli import main
from attention_zoo.measure.labels import DEFAULT_REFERENCE
from attention_zoo.progress import PlainProgress

FAST = ["--budget", "0", "--repeats", "1", "--threads", "1", "--no-progress"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["bench", "memory", "results"])
def test_help_explains_with_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "examples:" in out and f"zoo {command}" in out.split("examples:")[1]


@pytest.mark.slow
def test_bench_from_flags_prints_table_and_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "zoo.sqlite")
    code, out, err = run(
        capsys,
        "bench",
        "--target",
        "attention",
        "--backends",
        "full,sdpa",
        "--lengths",
        "64,128",
        "--modes",
        "forward",
        "--store",
        store,
        *FAST,
    )
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("attention ")]
    assert len(lines) == 4 and all(" ok " in line for line in lines)
    assert f"time x {DEFAULT_REFERENCE}" in out and f"memory x {DEFAULT_REFERENCE}" in out
    assert "1.00x" in out
    # results: csv with one row per metric and the environment, json with the config parsed
    code, csv_out, _ = run(capsys, "results", "--store", store, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(csv_out)))
    assert code == 0 and {r["metric"] for r in rows} >= {
        "peak_bytes",
        "time_median",
        "flops",
        "predicted_peak_bytes",
    }
    assert all(r["torch_version"] and r["device_name"] and r["threads"] == "1" for r in rows)
    code, json_out, _ = run(
        capsys, "results", "--store", store, "--format", "json", "--metric", "flops"
    )
    data = json.loads(json_out)
    assert len(data) == 4 and {d["config"]["backend"] for d in data} == {"full", "sdpa"}
    code, table, _ = run(capsys, "results", "--store", store)
    assert code == 0 and "sdpa" in table
    code, runs, _ = run(capsys, "results", "--store", store, "--runs")
    assert code == 0 and "bench" in runs


@pytest.mark.slow
def test_bench_resume_measures_nothing_new(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "zoo.sqlite")
    args = [
        "bench",
        "--target",
        "attention",
        "--backends",
        "full",
        "--lengths",
        "64",
        "--store",
        store,
        "--metrics",
        "memory",
        *FAST,
    ]
    assert run(capsys, *args)[0] == 0
    code, out, _ = run(capsys, *args, "--resume")
    assert code == 0 and "nothing new; 1 already stored (resumed)" in out


def test_bench_option_axis_and_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "bench",
        "--target",
        "attention",
        "--backends",
        "sdpa",
        "--lengths",
        "64",
        "--option",
        "sdpa.kernel=math,auto",
        "--dry-run",
    )
    assert code == 0 and "[kernel=math]" in out and "[kernel=auto]" in out
    assert "dry run, bench: 2 of 2 to do" in out


def test_bench_unknown_backend_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "bench", "--backends", "full,flsh", "--dry-run")
    assert (
        code == 2
        and "unknown attention backend 'flsh'; known attention backends:" in err
        and "sdpa" in err
    )


def test_a_bad_store_path_is_refused_after_the_grid_on_a_dry_run_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's path is checked after the flags (their errors first) and before the cases'
    time predictions; a dry run refuses it as the run would, and creates nothing."""
    missing = str(tmp_path / "nowhere" / "zoo.sqlite")
    code, _, err = run(capsys, "bench", "--backends", "flsh", "--store", str(tmp_path))
    assert code == 2 and "unknown attention backend 'flsh'" in err
    code, _, err = run(capsys, "bench", "--backends", "sdpa", "--store", str(tmp_path))
    assert code == 2 and "is a folder" in err
    code, _, err = run(capsys, "bench", "--backends", "sdpa", "--store", missing, "--dry-run")
    assert code == 2 and "nowhere" in err and not (tmp_path / "nowhere").exists()
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "bench", "--backends", "sdpa", "--store", "new.sqlite", "--dry-run")
    assert code == 0 and "1 of 1 to do" in out and not (tmp_path / "new.sqlite").exists()


def test_bench_malformed_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nseq_lens = [1024\n")
    code, _, err = run(capsys, "bench", "--preset", str(bad), "--dry-run")
    assert code == 2 and "bad.toml is not valid TOML" in err
    code, _, err = run(capsys, "bench", "--preset", "quik", "--dry-run")
    assert code == 2 and "unknown preset 'quik'; built-in presets:" in err and "quick" in err


def test_results_refuses_a_file_that_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data.sqlite"
    path.write_text("x" * 1000)
    code, _, err = run(capsys, "results", "--store", str(path))
    assert code == 2 and "is not an attention-zoo results store" in err
    code, _, err = run(capsys, "results", "--store", str(tmp_path / "none.sqlite"))
    assert code == 2 and "no results store at" in err


def test_memory_answers_whether_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "memory",
        "--target",
        "attention",
        "--backends",
        "full,sdpa",
        "--lengths",
        "65536",
        "--modes",
        "forward",
        "--fits",
        "8GiB",
    )
    assert code == 0, err
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("attention ")}
    assert " NO " in rows["full"] and " yes " in rows["sdpa"]  # 64 GiB of scores vs a fused kernel
    assert "fits 8.00 GiB" in out


def test_memory_shows_its_progress_on_stderr_not_in_its_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def log_lines(total: int, *, desc: str, unit: str, **_: object) -> PlainProgress:
        """The bar as in a log, with a line at every case."""
        return PlainProgress(
            total=total, desc=desc, unit=unit, initial=0, stream=sys.stderr, every_s=0
        )

    cases = ["full", "sdpa"]
    monkeypatch.setattr("attention_zoo.commands.memory_cmd.progress", log_lines)
    argv = ["memory", "--target", "attention", "--backends", ",".join(cases), "--lengths", "64"]
    code, out, err = run(capsys, *argv, "--modes", "forward", "--format", "json")
    assert code == 0 and len(json.loads(out)) == 2
    assert "memory: 1/2 cases" in err and "memory: 2/2 cases" in err and "sdpa" in err, err


def test_memory_check_measures_and_compares(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "memory",
        "--target",
        "attention",
        "--backends",
        "full",
        "--lengths",
        "256",
        "--modes",
        "forward",
        "--check",
        "--format",
        "json",
    )
    (record,) = json.loads(out)
    assert code == 0 and record["measured_peak_bytes"] == record["peak_bytes"]


@pytest.mark.slow
@pytest.mark.long
def test_quick_preset_prints_comparison_of_every_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys,
        "bench",
        "--preset",
        "quick",
        *("--lengths", "256", "--repeats", "1", "--budget", "0"),  # its grid, shortest length
        "--store",
        str(tmp_path / "zoo.sqlite"),
        "--no-progress",
    )
    assert code == 0, err
    for name in BACKENDS.names():
        assert f" {name} " in out
    assert f"time x {DEFAULT_REFERENCE}" in out


@pytest.mark.slow
def test_memory_rows_of_an_option_axis_are_told_apart(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "memory",
        "--target",
        "attention",
        "--backends",
        "lsh",
        "--lengths",
        "256",
        "--modes",
        "forward",
        "--option",
        "lsh.num_hashes=1,2",
    )
    assert code == 0, err
    # 1 is lsh's default: that row is plain `lsh`, one label per configuration
    assert "  lsh  " in out and "lsh(num_hashes=2)" in out and "num_hashes=1" not in out


@pytest.mark.slow
def test_interleave_times_a_flag_built_grid_round_robin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--interleave: the cases of one length timed in one rotation (ratios of one run); without
    it a flag-built grid times each case alone, and --no-interleave turns a preset's off."""
    from attention_zoo import cli
    from attention_zoo.commands.bench_cmd import settings_from_args
    from attention_zoo.measure import runner
    from attention_zoo.presets import load_sweep_preset

    rotations: list[int] = []
    real = runner.time_until_stable

    def spy(fns, **kw):
        rotations.append(len(fns))
        return real(fns, **kw)

    monkeypatch.setattr(runner, "time_until_stable", spy)
    grid = ["bench", "--target", "attention", "--backends", "full,sdpa", "--lengths", "32,64"]
    for flag, expected in (("--interleave", [2, 2]), ("--no-interleave", [1, 1, 1, 1])):
        rotations.clear()
        store = str(tmp_path / f"{flag}.sqlite")
        code, _, err = run(capsys, *grid, "--modes", "forward", "--metrics", "time",
                           "--store", store, flag, *FAST)  # fmt: skip
        assert code == 0, err
        assert rotations == expected, flag
    args = cli.parse(cli.build_parser(), ["bench", "--preset", "standard", "--no-interleave"])
    assert load_sweep_preset("standard").settings.interleave
    assert not settings_from_args(args, load_sweep_preset("standard")).interleave


@pytest.mark.slow
def test_a_run_is_continued_only_under_its_own_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cases added to a run (--run-id, --resume) are timed as its others were: other threads (or
    clock, CUDA graphs, interleaving) are refused in one line before anything runs; other
    metrics are rows of their own, and continue it."""
    store = str(tmp_path / "s.sqlite")
    grid = ["bench", "--target", "attention", "--backends", "sdpa", "--modes", "forward",
            "--store", store, "--run-id", "r1", *FAST]  # fmt: skip
    code, _, err = run(capsys, *grid, "--lengths", "32", "--metrics", "time")
    assert code == 0, err
    code, _, err = run(capsys, *grid, "--lengths", "32,64", "--threads", "2")
    refused = "zoo bench: error: run r1 was measured with other settings (threads 1, now 2)"
    assert code == 2 and err.strip().splitlines()[-1].startswith(refused), err
    code, _, err = run(capsys, *grid, "--lengths", "32,64", "--metrics", "memory")
    assert code == 0, err
    code, out, _ = run(capsys, "results", "--store", store, "--run-id", "r1", "--format", "csv")
    rows = csv.DictReader(io.StringIO(out))
    assert {json.loads(row["config"])["seq_len"] for row in rows} == {32, 64}


@pytest.mark.slow
def test_results_output_never_overwrites_a_results_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o naming a results store (this one or another) is refused in one line; the store stays."""
    store = tmp_path / "s.sqlite"
    code, _, err = run(capsys, "bench", "--target", "attention", "--backends", "sdpa",
                       "--lengths", "32", "--modes", "forward", "--metrics", "time",
                       "--store", str(store), *FAST)  # fmt: skip
    assert code == 0, err
    before = store.read_bytes()
    rows = ["results", "--store", str(store), "--format", "csv"]
    code, _, err = run(capsys, *rows, "-o", str(store))
    assert code == 2 and f"--output {store} is a results store; give another file name" in err
    assert store.read_bytes() == before
    code, _, err = run(capsys, *rows, "-o", str(tmp_path / "rows.csv"))
    assert code == 0 and (tmp_path / "rows.csv").read_text().startswith("run_id,"), err
    assert "replacing" not in err
    (tmp_path / "notes.txt").write_text("the user's notes")  # replaced, and it says so
    code, _, err = run(capsys, *rows, "-o", str(tmp_path / "notes.txt"))
    assert code == 0 and f"wrote {tmp_path / 'notes.txt'} (replacing what it held)" in err


@pytest.mark.slow
def test_bench_exits_1_when_a_case_fails_and_0_past_the_machines_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_backends: None
) -> None:
    """A case whose code failed makes the sweep's exit status 1 (a CI notices); an out-of-memory
    case is a measurement of the machine, not a failure."""
    grid = ["bench", "--target", "attention", "--lengths", "64", "--modes", "forward", *FAST]
    store = str(tmp_path / "zoo.sqlite")
    code, out, err = run(capsys, *grid, "--backends", "sdpa,test-oom", "--store", store)
    assert code == 0, err
    assert "1 ok, 1 oom" in out
    code, out, err = run(capsys, *grid, "--backends", "sdpa,test-failing", "--store", store)
    assert code == 1 and "1 error, 1 ok" in out
    assert "zoo bench: 1 case(s) ended error or invalid" in err and "exit status 1" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans from a head node without a GPU")
def test_cuda_runs_on_a_cluster_are_planned_from_a_head_without_a_gpu(tmp_path, capsys):
    """The workers have the GPUs: the head checks the device's name, not its presence."""
    pytest.importorskip("ray")
    store = str(tmp_path / "zoo.sqlite")
    cluster = ["--executor", "ray", "--dry-run", "--store", store]
    grid = ["bench", "--devices", "cuda", "--backends", "full", "--lengths", "256"]
    assert main([*grid, *cluster]) == 0
    assert "block:full L=256 b=1 forward float32 cuda" in capsys.readouterr().out
    assert main(["task", "duplication", "--preset", "smoke", "--device", "cuda", *cluster]) == 0
    assert main([*grid, "--dry-run", "--store", store]) == 2  # run here: there is none
    assert "CUDA is not available here" in capsys.readouterr().err
