"""The niah reproduction: verdicts on planted ladders (a growing cache keeps its accuracy, a fixed
state falls; undecided where the run cannot tell), the plot, and the smoke preset end to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from attention_zoo.report.claims import FAILS, HOLDS, NOT_MEASURED, verdict_class
from attention_zoo.reproduce.evidence import FEW_SEEDS
from attention_zoo.reproduce.niah import ladder
from attention_zoo.reproduce.niah.plot import plot
from attention_zoo.tasks.niah import VARIANTS
from attention_zoo.tasks.suite import TaskPreset

SEEDS = (0, 1, 2)
PRESET = ladder.ladder_presets("cpu")[0]
PRESET_SMOKE = ladder.ladder_presets("smoke")[0]
SHORT, LONG = PRESET.task.lengths[0], PRESET.task.lengths[-1]


def _rows(
    accs: dict[str, dict[int, float]],
    seeds: tuple[int, ...] = SEEDS,
    preset: TaskPreset = PRESET,
) -> list[dict]:
    """Planted runs of `preset`'s ladder: backend -> length -> accuracy (a fraction) at every
    depth split, the seeds a point apart."""
    rows = []
    for backend, by_length in accs.items():
        for seed in seeds:
            for length, acc in by_length.items():
                for depth in preset.task.depths:
                    rows.append({
                        "task": "niah", "preset": ladder.rung_name(preset, length),
                        "backend": backend, "length": length, "seed": seed, "metric": "accuracy",
                        "value": min(1.0, acc + 0.01 * (seed - 1)),
                        "eval": f"n{length}-d{round(100 * depth)}", "ref": f"run/{backend}{seed}",
                    })  # fmt: skip
            longest = preset.task.lengths[-1]
            rows.append({"task": "niah", "preset": ladder.rung_name(preset, longest),
                         "backend": backend,
                         "length": longest, "seed": seed, "metric": "accuracy", "value": 0.5,
                         "eval": "trained", "ref": f"run/{backend}{seed}"})  # fmt: skip
    return rows


def _ladder(short: float, long: float) -> dict[int, float]:
    middle = PRESET.task.lengths[1:-1]
    return {SHORT: short, **{n: (short + long) / 2 for n in middle}, LONG: long}


def _verdicts(rows: list[dict]) -> dict[str, str]:
    return {c.setting.split()[-1]: c.verdict for c in ladder.claims(rows, PRESET)}


@pytest.mark.slow
def test_the_recurrences_share_one_fixed_state_and_attention_grows() -> None:
    fixed = {b: ladder.memory(PRESET, b) for b in ("gla", "gated-deltanet", "retention")}
    assert all(m.fixed for m in fixed.values())
    assert len({m.long_bytes for m in fixed.values()}) == 1  # same heads, same head width
    for routed in ("full", "moba", "nsa"):  # block routing reads a cache that grows all the same
        grows = ladder.memory(PRESET, routed)
        assert not grows.fixed and grows.long_bytes > grows.short_bytes


@pytest.mark.slow
def test_attention_that_keeps_and_recurrences_that_fall_hold() -> None:
    rows = _rows({"full": _ladder(0.99, 0.97), "gla": _ladder(0.95, 0.30),
                  "retention": _ladder(0.90, 0.88)})  # fmt: skip
    verdicts = _verdicts(rows)
    assert verdicts["full"] == HOLDS
    assert verdicts["gla"] == HOLDS  # fell by 65 points
    assert verdicts["retention"] == FAILS  # a fixed state that kept its accuracy
    lines = {c.setting.split()[-1]: c for c in ladder.claims(rows, PRESET)}
    assert "fixed state" in lines["gla"].claim and "grows" in lines["full"].claim
    assert lines["gla"].interval.startswith("-65.0 [") and lines["gla"].seeds == "0,1,2"
    assert lines["gla"].ours.startswith(f"L {SHORT}: 95.0")
    assert "run/full0" in lines["gla"].rows_used  # the reference's floor was read too


def test_attention_that_falls_does_not_hold() -> None:
    verdicts = _verdicts(_rows({"full": _ladder(0.99, 0.40)}))
    assert verdicts["full"] == FAILS


def test_no_verdict_where_the_run_cannot_tell() -> None:
    # full never retrieves at the longest length: a recurrence's fall says nothing
    rows = _rows({"full": _ladder(0.99, 0.60), "gla": _ladder(0.95, 0.30)})
    assert _verdicts(rows)["gla"] == ladder.NO_REFERENCE
    # a recurrence at chance everywhere did not fall: it never learned
    rows = _rows({"full": _ladder(0.99, 0.99), "linear": _ladder(0.02, 0.02)})
    assert _verdicts(rows)["linear"] == ladder.NO_FALL
    # seeds that disagree about a fall: the interval crosses the band's edge
    rows = _rows({"full": _ladder(0.99, 0.99)})
    for seed, drop in zip(SEEDS, (0.0, 0.3, 0.05)):
        rows += _rows({"gla": _ladder(0.9, 0.9 - drop)}, seeds=(seed,))
    assert _verdicts(rows)["gla"] == ladder.STRADDLES
    # one seed: no interval
    rows = _rows({"full": _ladder(0.99, 0.99), "gla": _ladder(0.9, 0.1)}, seeds=(0,))
    assert {verdict_class(v) for v in _verdicts(rows).values()} == {"undecided"}
    assert _verdicts(rows)["gla"] == FEW_SEEDS
    floors = {c.floor.split("full keeps its accuracy: ")[-1] for c in ladder.claims(rows, PRESET)}
    assert floors == {f"undecided ({FEW_SEEDS})"}  # not "no": one seed cannot tell
    kept = _rows({"full": _ladder(0.99, 0.99)})
    assert ladder.claims(kept, PRESET)[0].floor.endswith("full keeps its accuracy: yes")
    fell = _rows({"full": _ladder(0.99, 0.40)})
    assert ladder.claims(fell, PRESET)[0].floor.endswith("full keeps its accuracy: no")


def test_a_backend_whose_state_cannot_be_sized_here_is_undecided() -> None:
    """A run of a backend not registered here (a plugin's, not loaded) or of a mix of layers:
    which claim applies (fixed or growing state) is unknown, so no verdict, and the other claims
    stand. A backend that cannot run here is sized on the meta device all the same."""
    rows = _rows({"full": _ladder(0.99, 0.97), "mine": _ladder(0.99, 0.97),
                  "local+lsh": _ladder(0.9, 0.5), "xformers": _ladder(0.99, 0.97)})  # fmt: skip
    verdicts = _verdicts(rows)
    assert verdicts["mine"] == verdicts["local+lsh"] == ladder.UNSIZED
    assert verdicts["full"] == verdicts["xformers"] == HOLDS  # xformers: a growing cache


@pytest.mark.slow
def test_accuracy_a_key_blind_rule_reaches_decides_nothing() -> None:
    """With 2 needles in random filler and earlier answers in the input (answers="shown"),
    picking a context value not yet given scores ~76% without reading the asked key: a ladder at
    that level is below the floor, not 'full keeps its accuracy'."""
    task = dataclasses.replace(PRESET.task, num_needles=2, answers="shown")
    shown = dataclasses.replace(PRESET, task=task)
    rules = ladder.key_blind(shown)
    assert 74 < rules < 78  # H_2 / 2 = 75%, a little more for repeated values
    assert ladder.learned_floor(shown) == pytest.approx(rules + ladder.MARGIN)
    rows = _rows({"full": _ladder(0.76, 0.76), "gla": _ladder(0.77, 0.60)})
    assert {c.verdict for c in ladder.claims(rows, shown)} == {ladder.NO_FALL}
    line = ladder.claims(rows, shown)[0]
    assert f"key-blind rules {rules:.1f}%" in line.floor
    # hidden answers (the preset's): nothing is ruled out, one of its 4 values is right about a
    # quarter of the time (a little more for repeated values)
    assert PRESET.task.num_needles == 4 and 24 < ladder.key_blind(PRESET) < 28


@pytest.mark.slow
def test_a_ladder_a_key_blind_rule_solves_judges_nothing() -> None:
    """One needle in filler (RULER's single): copying the only value there is answers every query,
    so perfect accuracy shows no retrieval, and every claim on that ladder says so."""
    single = next(p for p in ladder.ladder_presets("cpu") if p.task.variant == "single")
    assert ladder.key_blind(single) == 100.0
    rows = _rows({"full": _ladder(1.0, 1.0), "gla": _ladder(1.0, 0.3)}, preset=single)
    verdicts = {c.verdict for c in ladder.claims(rows, single)}
    assert verdicts == {ladder.KEY_BLIND.format(100)}
    assert verdict_class(verdicts.pop()) == "undecided"
    floors = {c.floor for c in ladder.claims(rows, single)}
    assert floors == {"none: the key-blind rules score 100.0% at L 32"}


def test_every_variant_has_a_ladder() -> None:
    """One accuracy-vs-length plot per RULER variant needs a ladder of each at some size."""
    variants = {p.task.variant for size in ladder.SIZES for p in ladder.ladder_presets(size)}
    assert variants == set(VARIANTS)


@pytest.mark.slow
def test_the_key_blind_floor_is_read_where_the_ladder_is_judged() -> None:
    """At a fixed depth the asked needle's place among the needles can give it away (depth 0:
    first), which the training draw (uniform depths) does not show: the rules are scored on the
    shortest length's depth splits, the accuracies the claims compare."""
    preset = ladder.ladder_presets("gpu")[0]
    assert 100 * preset.task.baseline_accuracy() < 10  # the training draw: distractor needles
    assert 25 < ladder.key_blind(preset) < 45  # the splits: 'first' is right at depth 0


def test_each_rung_is_trained_apart_and_read_at_its_own_length() -> None:
    rungs = ladder.rungs(PRESET)
    assert [(r.task.seq_len, r.task.lengths) for r in rungs] == [
        (n, (n,)) for n in PRESET.task.lengths
    ]
    assert [r.name for r in rungs] == [ladder.rung_name(PRESET, n) for n in PRESET.task.lengths]
    assert len({r.name for r in rungs}) == len(rungs) and PRESET.name not in {r.name for r in rungs}
    rows = _rows({"full": _ladder(0.99, 0.97)})
    assert set(ladder.accuracies(rows, PRESET)[0]["full"]) == set(PRESET.task.lengths)
    together = [{**r, "preset": PRESET.name} for r in rows]  # one model for every length
    assert ladder.accuracies(together, PRESET)[0] == {}
    elsewhere = [{**r, "preset": ladder.rung_name(PRESET, SHORT)} for r in rows]
    assert set(ladder.accuracies(elsewhere, PRESET)[0]["full"]) == {SHORT}


def test_nothing_stored_is_not_measured() -> None:
    assert {c.verdict for c in ladder.claims([], PRESET)} == {NOT_MEASURED}


@pytest.mark.slow  # matplotlib
def test_plot_has_a_line_per_mechanism_and_chance(tmp_path: Path) -> None:
    rows = _rows({"full": _ladder(0.99, 0.97), "gla": _ladder(0.95, 0.30)})
    path = plot(rows, PRESET, tmp_path / "niah.png")
    assert path is not None and path.stat().st_size > 1000
    import matplotlib.pyplot as plt
    from PIL import Image

    assert Image.open(path).size[0] > 500
    plt.close("all")
    assert plot([], PRESET, tmp_path / "none.png") is None
    headers, body = ladder.table(rows, PRESET)
    assert headers == ["mechanism", "state", *(f"L {n}" for n in PRESET.task.lengths)]
    assert [r[:2] for r in body] == [["`full`", "grows"], ["`gla`", "fixed"]]


@pytest.mark.slow  # trains the smoke preset: seconds on 2 cores
def test_smoke_reproduction_trains_stores_and_says_undecided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attention_zoo.cli import main

    argv = ["reproduce", "niah", "--preset", "smoke", "--store", str(tmp_path / "r.db")]
    assert main([*argv, "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    table = out.split("reproduced")[1].split("rules:")[0]
    assert "fewer than 3 seeds" in table
    assert " holds " not in table and " does not hold here " not in table
    assert "scales:" in out and "2 heads x 8" in out
    assert "[1/2] full seed 0" in out
    from attention_zoo.reproduce.training import task_rows
    from attention_zoo.store import ResultStore

    frame = ResultStore(tmp_path / "r.db").to_dataframe()
    stored = {r["preset"] for r in task_rows(frame, ladder.rungs(PRESET_SMOKE))}
    assert stored == {ladder.rung_name(PRESET_SMOKE, n) for n in PRESET_SMOKE.task.lengths}
    assert main([*argv, "--no-progress"]) == 0  # again: everything is found in the store
    assert "[1/" not in capsys.readouterr().out


def test_the_plot_legend_names_how_each_state_grows():
    assert ladder.Memory(4096, 4096).kind == "fixed state"
    assert ladder.Memory(4096, 65536).kind == "growing cache"
    assert ladder.Memory(None, None).kind == "state not sized here"  # neither, and not drawn so
    assert not ladder.Memory(None, None).fixed
    from attention_zoo.reproduce.niah.plot import LINES

    kinds = [ladder.Memory(*m).kind for m in ((1, 1), (1, 2), (None, None))]
    assert sorted(kinds) == sorted(LINES) and len(set(LINES.values())) == 3  # a style each
