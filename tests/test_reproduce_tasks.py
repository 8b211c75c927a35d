"""The lra-listops and zoology reproductions: sweep expansion and verdict rules on known rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_zoo.reproduce.lra_listops import claims as lra_listops
from attention_zoo.reproduce.zoology import sweep as zoology


def _row(task: str, preset: str, backend: str, length: int, accuracy: float) -> dict:
    return {
        "task": task, "preset": preset, "backend": backend, "length": length, "seed": 0,
        "metric": "accuracy", "value": accuracy, "eval": "trained",
    }  # fmt: skip


def test_zoology_sweep_expands_every_point_and_width() -> None:
    presets = zoology.sweep_presets("cpu")
    sweep = zoology.SWEEPS["cpu"]
    assert len(presets) == len(sweep.points) * len(sweep.widths)
    got = {(p.task.seq_len, p.task.num_kv_pairs, p.model["hidden_size"]) for p in presets}
    assert got == {(n, kv, w) for n, kv in sweep.points for w in sweep.widths}
    assert all(p.model["num_attention_heads"] == 1 for p in presets)  # as Figure 2's attention
    assert {p.name for p in presets} == {zoology.point_name("cpu", w) for w in sweep.widths}
    assert zoology.SWEEPS["paper"].points == ((64, 4), (128, 8), (256, 16))
    assert zoology.SWEEPS["paper"].widths == (64, 128, 256, 512)
    paper = zoology.sweep_presets("paper")[0]
    assert paper.task.vocab_size == 8192 and paper.model["num_hidden_layers"] == 2
    assert paper.task.random_non_queries is False  # Figure 2's data: zero filler


def _zoology_rows(full: dict[tuple[int, int], float], other: float) -> list[dict]:
    rows = []
    for (n, w), acc in full.items():
        name = zoology.point_name("smoke", w)
        rows += [_row("associative-recall", name, "full", n, acc)]
        rows += [_row("associative-recall", name, "local", n, other)]
    return rows


@pytest.mark.parametrize(
    "full, verdicts",
    [
        ({(16, 16): 0.99, (16, 32): 1.0, (24, 16): 0.97, (24, 32): 0.99}, ["holds", "holds"]),
        (
            {(16, 16): 0.5, (16, 32): 0.99, (24, 16): 0.2, (24, 32): 0.3},
            ["holds weaker", "does not hold here"],
        ),
    ],
)
def test_zoology_verdicts_follow_the_stated_rule(full: dict, verdicts: list[str]) -> None:
    lines = zoology.claims(_zoology_rows(full, other=0.1), "smoke", target=0.95)
    assert [line.verdict for line in lines[:-1]] == verdicts
    assert lines[-1].verdict == "holds" and lines[-1].ours == "4/4 comparisons"
    behind = zoology.claims(_zoology_rows(full, other=1.0), "smoke", target=0.95)[-1]
    assert behind.verdict != "holds" and "behind: local" in behind.ours


@pytest.mark.slow  # matplotlib
def test_zoology_plot_and_nothing_stored(tmp_path: Path) -> None:
    rows = _zoology_rows({(16, 16): 0.5, (16, 32): 0.9, (24, 16): 0.4, (24, 32): 0.8}, 0.1)
    assert zoology.plot(rows, "smoke", tmp_path / "z.png").stat().st_size > 1000
    assert zoology.plot([], "smoke", tmp_path / "none.png") is None
    assert {c.verdict for c in zoology.claims([], "smoke", 0.95)} == {"not measured"}


def test_lra_gaps_are_classed_against_full_attention() -> None:
    accs = {"full": 0.40, "local": 0.20, "lsh-2": 0.41, "performer": 0.39, "linear": 0.3}
    rows = [_row("listops", "cpu", b, 128, a) for b, a in accs.items()]
    rows.append(_row("listops", "smoke", "linformer", 64, 0.9))  # another preset: ignored
    lines = {line.setting.split()[-1]: line for line in lra_listops.claims(rows, "cpu")}
    assert lines["full"].verdict == "reference"
    assert lines["local"].verdict == "holds"  # below, as in LRA
    assert lines["local"].ours == "20.0 (-20.0)"
    assert lines["lsh-2"].verdict == "holds"  # level, as in LRA
    assert lines["performer"].verdict == "does not hold here"  # LRA: far below
    assert lines["linformer"].verdict == "not measured"
    assert lines["linear"].ours == "30.0 (-10.0)" and lines["linear"].verdict == "ours only"
    assert lines["full"].published == "36.37 (+0.00)"


@pytest.mark.slow  # trains the smoke presets: ~15 s each on 2 cores
@pytest.mark.parametrize("name", ["lra-listops", "zoology"])
def test_smoke_reproduction_trains_stores_and_prints_its_claims(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attention_zoo.cli import main

    argv = ["reproduce", name, "--preset", "smoke", "--store", str(tmp_path / "r.db")]
    assert main([*argv, "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "reproduced" in out and "rules:" in out
    assert "not measured" not in out.split("reproduced")[1].splitlines()[2]  # first claim measured
    assert main([*argv, "--no-progress"]) == 0  # again: everything is found in the store
    assert "trained" not in capsys.readouterr().out.replace("0 run(s) trained", "")
