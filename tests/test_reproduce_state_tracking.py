"""The state-tracking reproduction (Grazzi et al.'s parity claims): its presets, the verdicts on
planted runs (holds, does not hold, undecided where the run cannot decide) and, slow, the smoke
preset end to end with its report section."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_zoo.blocks import NoPositionEmbedding
from attention_zoo.report.claims import FAILS, HOLDS, NOT_MEASURED, verdict_class
from attention_zoo.reproduce import get_reproduction
from attention_zoo.reproduce.evidence import FEW_SEEDS
from attention_zoo.reproduce.state_tracking import claims as st
from attention_zoo.reproduce.state_tracking.presets import base_name, negative_name, parity_presets
from attention_zoo.tasks.runner import build_model, plan_runs
from attention_zoo.tasks.suite import load_task_preset

SEEDS = (0, 1, 2)
PRESET = load_task_preset("state-tracking", base_name("cpu"))
LABELS = [label for label, _ in st.ranges(PRESET)]  # the training length first
CHANCE = 0.5


def _runs(accs: dict[str, list[float]], seeds: tuple[int, ...] = SEEDS) -> list[dict]:
    """Planted runs: mechanism name -> accuracy per length range (training length first), seeds
    a little apart."""
    mechanisms = {m.name: m for m in st.MECHANISMS}
    rows = []
    for name, values in accs.items():
        m = mechanisms[name]
        preset = negative_name("cpu") if m.negative else base_name("cpu")
        for seed in seeds:
            for label, value in zip(LABELS, values):
                rows.append({
                    "task": "state-tracking", "preset": preset, "backend": m.backend,
                    "length": 40, "seed": seed, "metric": "accuracy", "eval": label,
                    "value": min(1.0, value + 0.002 * (seed - 1)), "ref": f"run/{name}{seed}",
                })  # fmt: skip
    return rows


def _verdicts(rows: list[dict]) -> dict[str, str]:
    lines = st.claims(rows, "cpu", PRESET)
    return {m.name: line.verdict for m, line in zip(st.MECHANISMS, lines)}


SOLVED = [1.0, 1.0, 0.995, 0.99]
LEARNED_SHORT = [1.0, 0.8, CHANCE, CHANCE]  # parity at the training length, lost past it
CONTRASTS = [m.name for m in st.CONTRASTS]


def test_the_reference_keeping_parity_and_the_others_losing_it_holds_every_claim() -> None:
    rows = _runs({
        st.REFERENCE.name: SOLVED, CONTRASTS[0]: LEARNED_SHORT, CONTRASTS[1]: [0.7] + [CHANCE] * 3,
        CONTRASTS[2]: [CHANCE] * 4,
    })  # fmt: skip
    assert set(_verdicts(rows).values()) == {HOLDS}
    gla = st.claims(rows, "cpu", PRESET)[2]
    assert gla.seeds == "0,1,2" and "(below)" in gla.interval and gla.interval.startswith("1-39")
    assert len(gla.rows_used) == 6  # its three runs and the reference's


def test_a_contrast_as_good_as_the_reference_everywhere_does_not_hold() -> None:
    rows = _runs({st.REFERENCE.name: SOLVED, "gla": [1.0, 0.99, 0.99, 0.985]})
    verdicts = _verdicts(rows)
    assert verdicts["gla"] == FAILS
    assert verdicts["linear"] == NOT_MEASURED


def test_a_reference_that_loses_parity_past_training_judges_the_contrasts_where_it_kept_it():
    """The reference keeps parity only at the training length: its own claim does not hold, and
    each contrast is judged there alone: below holds; level cannot refute "does not keep it"
    (past there the reference lost parity too), so it is undecided."""
    rows = _runs({st.REFERENCE.name: LEARNED_SHORT, "linear": [CHANCE] * 4,
                  "gla": [1.0, CHANCE, CHANCE, CHANCE]})  # fmt: skip
    verdicts = _verdicts(rows)
    assert verdicts[st.REFERENCE.name] == FAILS
    assert verdicts["linear"] == HOLDS and verdicts["gla"] == st.LEVEL_WHERE_KEPT
    linear = st.claims(rows, "cpu", PRESET)[3]
    assert linear.interval.startswith("1-39: ") and ";" not in linear.interval  # one range judged
    assert linear.floor.endswith("cleared at 1-39")


def test_a_reference_across_the_floor_at_the_longest_range_still_decides_the_contrasts() -> None:
    """As measured at the cpu preset: the reference's interval crosses the floor past 160 tokens
    (its own claim undecided) and the contrasts, at chance, hold on the three ranges it kept."""
    rows = _runs({st.REFERENCE.name: SOLVED, **{name: [CHANCE] * 4 for name in CONTRASTS}})
    rows += [  # a fourth seed far below the floor at the last range: its interval crosses it
        {**r, "seed": 3, "value": 0.6 if r["eval"] == LABELS[-1] else r["value"]}
        for r in rows
        if r["seed"] == 0
    ]
    lines = st.claims(rows, "cpu", PRESET)
    assert lines[0].verdict == st.CROSSES
    assert [line.verdict for line in lines[1:]] == [HOLDS] * len(CONTRASTS)
    judged = [part.split(":")[0] for part in lines[1].interval.split("; ")]
    assert judged == ["1-39", "40-79", "80-159"]
    level = _runs({st.REFERENCE.name: SOLVED, "gla": SOLVED})
    level += [
        {**r, "seed": 3, "value": 0.6 if r["eval"] == LABELS[-1] else r["value"]}
        for r in level
        if r["seed"] == 0
    ]
    assert _verdicts(level)["gla"] == st.LEVEL_WHERE_KEPT  # not refuted where nothing was kept


def test_nothing_learned_at_the_training_length_is_undecided_for_every_claim() -> None:
    rows = _runs({name: [CHANCE] * 4 for name in [st.REFERENCE.name, *CONTRASTS]})
    verdicts = _verdicts(rows)
    assert verdicts[st.REFERENCE.name] == st.NOT_LEARNED
    assert {verdicts[name] for name in CONTRASTS} == {st.REFERENCE_NOT_LEARNED}
    assert {verdict_class(v) for v in verdicts.values()} == {"undecided"}


def test_an_interval_across_the_floor_or_too_few_seeds_is_undecided() -> None:
    rows = _runs({st.REFERENCE.name: SOLVED})
    rows += [  # a fourth seed far below the floor at the last range: its interval crosses it
        {**r, "seed": 3, "value": 0.6 if r["eval"] == LABELS[-1] else r["value"]} for r in rows[:4]
    ]
    assert _verdicts(rows)[st.REFERENCE.name] == st.CROSSES
    one_seed = _runs({name: SOLVED for name in [st.REFERENCE.name, *CONTRASTS]}, seeds=(0,))
    assert set(_verdicts(one_seed).values()) == {FEW_SEEDS}


def test_no_rows_is_not_measured_and_each_line_names_its_setting_and_scale() -> None:
    lines = st.claims([], "cpu", PRESET)
    assert [line.verdict for line in lines] == [NOT_MEASURED] * len(st.MECHANISMS)
    assert all("no position embeddings" in line.setting for line in lines)
    assert all(line.scale.startswith("parity trained at 40 tokens") for line in lines)
    assert "tested to 256" in lines[0].scale


@pytest.mark.parametrize("size", ["smoke", "cpu", "gpu"], ids=lambda s: f"{s}-preset")
def test_presets_train_gated_deltanet_both_ways_and_every_model_without_positions(
    size: str,
) -> None:
    negative, base = parity_presets(size)
    assert negative.name == negative_name(size) and negative.grid.backends == ("gated-deltanet",)
    assert set(base.grid.backends) == {"gated-deltanet", "gla", "linear"}
    assert negative.task == base.task and negative.train == base.train
    for preset, flag in ((negative, True), (base, False)):
        runs, skipped = plan_runs(preset, seeds=[0])
        assert not skipped
        for spec in runs:
            model = build_model(spec)
            assert isinstance(model.reformer.positions, NoPositionEmbedding)
            cores = [m.core.cfg for m in model.modules() if hasattr(m, "core")]
            if spec.variant.label == "gated-deltanet":
                assert {c.negative_eigenvalues for c in cores} == {flag}
    assert max(base.task.test_lengths) > base.task.seq_len


@pytest.mark.slow  # trains the smoke presets: seconds on one core
def test_smoke_reproduction_is_undecided_everywhere_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attention_zoo.cli import main

    store = str(tmp_path / "r.db")
    argv = ["reproduce", "state-tracking", "--preset", "smoke", "--store", store, "--no-progress"]
    assert main([*argv, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    table = out.split("reproduced")[1].split("rules:")[0]
    assert table.count(FEW_SEEDS) == len(st.MECHANISMS)  # one smoke seed: no verdict
    assert " holds " not in table and FAILS not in table
    lines = get_reproduction("state-tracking").claims(_frame(store))
    assert {verdict_class(line.verdict) for line in lines} == {"undecided"}
    assert main(["report", "--store", store, "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    section = report.split("State tracking: parity past the training length")[1]
    assert "positions 1-15" in section and "positions 32-63" in section
    assert "`gated-deltanet [-1, 1]`" in section and "`linear`" in section
    assert (tmp_path / "rep" / "state-tracking-smoke.png").stat().st_size > 1000


def _frame(path: str):
    from attention_zoo.store import open_store

    with open_store(path, write=False) as store:
        return store.to_dataframe()
