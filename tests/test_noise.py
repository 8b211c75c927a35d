"""benchmarks/scripts/noise.py: a series of rounds read as gate runs of identical code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
import noise  # noqa: E402  (scripts, importable from their folder)

SCRIPT = ROOT / "benchmarks" / "scripts" / "noise.py"


def series(*xs: float) -> list[dict[str, list[float]]]:
    """Rounds of one sample each: a steady case `y`, and a case `x` that takes `xs` in turn."""
    return [{"x": [x], "y": [1.0]} for x in xs]


def test_a_side_slow_in_every_round_reads_its_slowdown() -> None:
    # two rounds a side in the gate's order (a b b a): the middle two are one side's
    [stretch] = noise.stretch_ratios(series(1.0, 1.2, 1.2, 1.0), rounds=2)
    assert stretch == pytest.approx({"x": 1.2, "y": 1.0})


def test_one_slow_round_is_outread_by_the_sides_low_quantile() -> None:
    [stretch] = noise.stretch_ratios(series(1.0, 1.2, 1.0, 1.0), rounds=2)
    assert stretch["x"] == pytest.approx(1.0)


def test_one_rare_fast_sample_is_outread_by_the_sides_low_quantile() -> None:
    # the fastest samples would read 1.0 against 0.6 (1.67x); the quantiles read both sides 1.0
    rounds = [{"x": [0.6] + [1.0] * 19}, {"x": [1.0] * 20}, {"x": [1.0] * 20}, {"x": [1.0] * 20}]
    [stretch] = noise.stretch_ratios(rounds, rounds=2)
    assert stretch["x"] == pytest.approx(1.0)


def test_either_side_slower_is_noise_and_stretches_keep_the_gates_order() -> None:
    # stretches start at every other round: 0-3 (a b b a), 2-5 (a b b a again)
    stretches = noise.stretch_ratios(series(1.1, 1.0, 1.0, 1.1, 1.0, 1.0), rounds=2)
    assert [s["x"] for s in stretches] == pytest.approx([1.1, 1.0])


def test_the_summary_counts_runs_within_the_target_and_names_the_noisiest_case() -> None:
    text = noise.summary(series(1.0, 1.2, 1.2, 1.0, 1.0, 1.0), target=1.05, rounds=[2, 4])
    assert "2 rounds a side, 2 gate runs: largest ratio median 1.100x, max 1.200x (x)" in text
    assert "within 1.05x in 1 of 2 (50%)" in text
    assert "4 rounds a side: fewer than 8 rounds in the series" in text


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--series", "4", "--cases", "nope:forward"], "is not backend:mode"),
        (["--series", "4", "--rounds", "1"], "each must be >= 2"),
        (["--series", "1"], "--series must be >= 2"),
        (["--read", "missing.jsonl"], "no series at missing.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZOO_ASV_NO_WARMUP", "1")  # the suite's import only checks --cases
    try:
        code = noise.main(args)
    except SystemExit as exc:  # argparse's error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.parametrize(
    "lines, says",
    [
        (['{"x": [1.0]}', "not json"], ":2 is not a round noise.py wrote"),
        (['{"x": [1.0]}', '{"x": 1.0}'], ":2 holds one number a case (an older noise.py's log)"),
        (['{"x": [1.0]}', '{"x": []}'], ":2 is not a round noise.py wrote"),
        (['{"x": [1.0]}', '{"x": "12"}'], ":2 is not a round noise.py wrote"),
        (['{"x": [1.0]}', '{"x": [NaN]}'], ":2 is not a round noise.py wrote"),
        (['{"x": [1.0]}', '{"x": {"1": 2}}'], ":2 is not a round noise.py wrote"),
        (['{"x": [1.0]}', '{"y": [1.0]}'], ":2 times other cases than line 1"),
        (['{"x": [1.0]}'], "holds 1 round(s)"),
    ],
)
def test_a_log_that_is_not_one_series_is_said_in_one_line(
    lines: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    log = tmp_path / "noise.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert noise.main(["--read", str(log)]) == 2
    assert says in capsys.readouterr().err


def test_a_round_killed_without_a_word_is_a_failed_round(monkeypatch: pytest.MonkeyPatch) -> None:
    killed = subprocess.CompletedProcess([], -9, stdout="", stderr="")
    monkeypatch.setattr(noise.subprocess, "run", lambda *a, **k: killed)
    with pytest.raises(noise.NoiseError, match="a round failed: exit -9, no message"):
        noise.measure_round(["local:forward"], window=0.01, warmup=0.0)


@pytest.mark.slow
@pytest.mark.long
def test_a_measured_series_is_logged_round_by_round_and_read_back(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    log = tmp_path / "noise.jsonl"
    done = run("--series", "2", "--window", "0.02", "--cases", "local:forward", "--log", str(log))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2 and all(0 < t < 1 for r in rows for t in r["local:forward"])
    assert noise.main(["--read", str(log), "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 rounds; per case" in out and "local:forward" in out
