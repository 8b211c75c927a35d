"""The selective-copying reproduction (Mamba's Table 1): Table 1's orderings judged on planted runs
(holds, does not hold, undecided), its mapping, and the smoke preset end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_zoo.report.claims import FAILS, HOLDS, NOT_MEASURED, verdict_class
from attention_zoo.reproduce import get_reproduction
from attention_zoo.reproduce.evidence import (
    FEW_SEEDS,
    GROUPED,
    NOT_LEARNED,
    OURS_ONLY,
    REFERENCE_VERDICT,
    STRADDLES,
)
from attention_zoo.reproduce.selective_copying import table1
from attention_zoo.tasks.suite import load_task_preset

SEEDS = (0, 1, 2)


def _rows(accs: dict[str, float | tuple[float, ...]], preset: str = "cpu") -> list[dict]:
    """Planted runs: each backend at its accuracy (or one per seed), seeds a little apart."""
    rows = []
    for backend, acc in accs.items():
        values = acc if isinstance(acc, tuple) else tuple(acc + 0.005 * (s - 1) for s in SEEDS)
        for seed, value in zip(SEEDS, values):
            rows.append({
                "task": table1.TASK, "preset": preset, "backend": backend, "length": 64,
                "seed": seed, "metric": "accuracy", "value": value, "eval": "trained",
                "ref": f"run/{backend}{seed}",
            })  # fmt: skip
    return rows


def _verdicts(rows: list[dict]) -> list[str]:
    """The verdicts of Table 1's three orderings, in CLAIMS order."""
    return [line.verdict for line in table1.claims(rows, "cpu")[: len(table1.CLAIMS)]]


def test_table1_is_the_published_table_and_only_run_rows_are_mapped() -> None:
    assert [(r.arch, r.layer, r.accuracy) for r in table1.TABLE1] == [
        ("No gate", "S4", 18.3), ("No gate", "S6", 97.0), ("H3", "S4", 57.0),
        ("H3", "Hyena", 30.1), ("H3", "S6", 99.7), ("Mamba", "S4", 56.4),
        ("Mamba", "Hyena", 28.4), ("Mamba", "S6", 99.8),
    ]  # fmt: skip
    mapped = {(r.arch, r.layer): r.backend for r in table1.TABLE1 if r.backend}
    assert mapped == {("H3", "S4"): "retention", ("H3", "S6"): "gla"}
    assert all(r.mapping for r in table1.TABLE1)  # each row says how it maps, or why it cannot
    preset = load_task_preset(table1.TASK, "cpu")
    assert preset.model["attn_options"]["gla"]["gate"] == "scalar"  # Mamba2's SSD form
    assert {"full", "gla", "retention"} <= set(preset.grid.backends)
    assert len(preset.grid.seeds) >= 3


def test_the_published_ordering_holds_when_ours_has_it() -> None:
    rows = _rows({"full": 0.97, "gla": 0.96, "retention": 0.60, "linear": 0.70, "sdpa": 0.97})
    assert _verdicts(rows) == [HOLDS, HOLDS, HOLDS]
    lines = {line.setting.split(", ")[-1]: line for line in table1.claims(rows, "cpu")}
    assert lines["gla vs retention"].published == "99.7 vs 57.0 (+42.7: above)"
    assert lines["gla vs retention"].interval.startswith("+36.0 [") and "(above)" in (
        lines["gla vs retention"].interval
    )
    assert lines["full"].verdict == REFERENCE_VERDICT
    assert lines["linear vs full"].verdict == OURS_ONLY
    assert lines["sdpa vs full"].verdict == GROUPED
    assert lines["gla vs retention"].seeds == "0,1,2"
    assert lines["gla vs retention"].rows_used == tuple(
        f"run/{b}{s}" for b in ("gla", "retention") for s in SEEDS
    )


def test_solving_is_one_sided_a_mechanism_above_attention_still_solves() -> None:
    rows = _rows({"full": 0.90, "gla": 0.97, "retention": 0.40})
    assert _verdicts(rows) == [HOLDS, HOLDS, HOLDS]
    solves = table1.claims(rows, "cpu")[1]
    assert solves.published == "99.7 vs 99.8 (-0.1: not below)" and "(not below)" in solves.interval


def test_the_published_ordering_fails_when_ours_reverses_or_levels_it() -> None:
    # the fixed decay as good as the data-dependent one: selection buys nothing here
    rows = _rows({"full": 0.97, "gla": 0.80, "retention": 0.81})
    assert _verdicts(rows) == [FAILS, FAILS, HOLDS]


@pytest.mark.parametrize(
    "accs, reason",
    [
        ({"full": 0.70, "gla": 0.79, "retention": 0.40}, NOT_LEARNED),  # full below the floor
        ({"full": 0.97, "gla": (0.99, 0.70, 0.95), "retention": 0.93}, STRADDLES),
    ],
    ids=["reference-below-floor", "interval-straddles"],
)
def test_no_verdict_where_the_runs_cannot_decide(accs: dict, reason: str) -> None:
    verdicts = _verdicts(_rows(accs))
    assert reason in verdicts and all(verdict_class(v) == "undecided" for v in verdicts[:2])


def test_fewer_than_three_seeds_or_no_rows_give_no_verdict() -> None:
    rows = [r for r in _rows({"full": 0.97, "gla": 0.96, "retention": 0.6}) if r["seed"] < 2]
    assert set(_verdicts(rows)) == {FEW_SEEDS}
    assert set(_verdicts([])) == {NOT_MEASURED}


@pytest.mark.slow  # trains the smoke preset: seconds per backend on 2 cores
def test_smoke_reproduction_trains_stores_prints_and_reports_no_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attention_zoo.cli import main

    store = str(tmp_path / "r.db")
    argv = ["reproduce", "selective-copying", "--preset", "smoke", "--store", store]
    assert main([*argv, "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "Mamba's selective copying (Table 1), reproduced" in out and "rules:" in out
    table = out.split("reproduced")[1].split("rules:")[0]
    assert table.count(FEW_SEEDS) == len(table1.CLAIMS)  # one smoke seed: no verdict
    assert " holds " not in table and " does not hold here " not in table
    assert main(["report", "--store", store, "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "# Selective copying (Mamba Table 1)" in report
    assert "| - | H3 | S6 | 99.7 | `gla`: " in report  # Table 1's row beside ours
    assert "| H3 | H3 | S4 | 57.0 | `retention`: " in report
    summary = report.split("## Summary")[1].split("\n## ")[0]
    assert "claims by verdict" in summary and "undecided: " in summary  # counted with the others
    repro = get_reproduction("selective-copying")
    assert {line.verdict for line in repro.claims(None)} == {NOT_MEASURED}


@pytest.mark.slow  # trains the smoke preset twice: seconds on 2 cores
def test_editing_a_preset_trains_anew_and_claims_read_only_the_new_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A preset edited after its runs were stored (a user's suite file, one more step): the
    reproduction trains every run again and its claims read the new runs only, while the store
    keeps both."""
    from attention_zoo.cli import main
    from attention_zoo.reproduce.training import task_rows
    from attention_zoo.store import ResultStore
    from attention_zoo.tasks.suite import find_suite

    store = str(tmp_path / "r.db")
    argv = ["reproduce", "selective-copying", "--preset", "smoke", "--store", store]
    argv += ["--no-progress", "--threads", "1"]
    assert main(argv) == 0
    text = Path(str(find_suite(table1.TASK))).read_text()
    smoke = text.index("[presets.smoke]")
    edited = text[:smoke] + text[smoke:].replace("max_steps = 30", "max_steps = 31", 1)
    assert edited != text
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / f"{table1.TASK}.toml").write_text(edited)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(argv) == 0
    assert "[1/" in capsys.readouterr().out  # trained again, not found in the store
    frame = ResultStore(store).to_dataframe()
    repro = get_reproduction("selective-copying")
    read = {r["ref"].split("/")[1] for r in task_rows(frame, repro.defined_presets())}
    stored = {r["ref"].split("/")[1] for r in task_rows(frame, [])}
    assert read and len(stored) == 2 * len(read)
