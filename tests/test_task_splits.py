"""Evaluation splits through the task engine: seeded per label, scored after training, stored as
`accuracy@<label>` and tabulated in their natural order; the new suites run on every causal
backend with no per-backend code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attention_zoo.attention.spec import RunTarget, list_backends
from attention_zoo.cli import main
from attention_zoo.tasks import (
    SplitMatrix,
    StateTrackingTask,
    build_matrix,
    format_matrix,
    load_task_preset,
    outcome_rows,
    plan_runs,
    run_one,
)
from attention_zoo.tasks.results import STOP_ACCURACY
from attention_zoo.tasks.runner import build_model
from attention_zoo.tasks.suite import preset_names
from attention_zoo.tasks.trainer import batch_loss

NEW_TASKS = ("niah", "state-tracking", "selective-copying", "forgetting-mqar")
CAUSAL = [
    s.name for s in list_backends() if s.unsupported(RunTarget(device="cpu", causal=True)) is None
]


def test_split_data_comes_from_its_own_stream() -> None:
    one = StateTrackingTask(seq_len=16, test_lengths=(32,), split_size=8, eval_size=8)
    two = dataclasses.replace(one, test_lengths=(32, 64))
    a, b = one.build(seed=3), two.build(seed=3)
    assert torch.equal(a.splits["pos16-31"].input_ids, b.splits["pos16-31"].input_ids)
    assert torch.equal(a.eval_set.input_ids, b.eval_set.input_ids)  # splits change no other data
    assert torch.equal(next(a.batches(4)).input_ids, next(b.batches(4)).input_ids)
    other = one.build(seed=4).splits["pos16-31"].input_ids
    assert not torch.equal(a.splits["pos16-31"].input_ids, other)


def test_splits_are_scored_after_training_and_stored_by_label() -> None:
    preset = load_task_preset("state-tracking", "smoke")
    preset = dataclasses.replace(
        preset, train=dataclasses.replace(preset.train, max_steps=2, eval_every=2)
    )
    (spec, *_), _ = plan_runs(preset, backends=["full"])
    assert spec.model_fields()["max_position_embeddings"] == 64  # the longest split
    outcome = run_one(spec)
    assert set(outcome.evals) == {"pos16-31", "pos32-63"}
    rows = {(r["metric"], r["eval"]): r["value"] for r in outcome_rows(outcome)}
    assert rows[("accuracy", "pos32-63")] == outcome.evals["pos32-63"].accuracy
    assert outcome.evals["pos32-63"].scored == 32 * 32  # split_size x the positions 32..63


def test_split_matrix_orders_lengths_as_numbers() -> None:
    rows = [
        {"backend": "full", "seed": 0, "metric": "accuracy", "value": v, "eval": e}
        for e, v in [("n512-d0", 0.5), ("n64-d100", 1.0), ("n64-d0", 0.9), ("trained", 0.8)]
    ]
    table = build_matrix(rows, SplitMatrix())
    assert table.columns == ("trained", "n64-d0", "n64-d100", "n512-d0")
    text = format_matrix(table)
    assert "test set  n64-d0  n64-d100  n512-d0" in text and "100.0%" in text


def test_new_suites_load_and_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    for task in NEW_TASKS:
        assert {"smoke", "cpu"} <= set(preset_names(task))
        for name in preset_names(task):
            preset = load_task_preset(task, name)
            assert preset.task.name == task and preset.description
    assert main(["task", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {task}: presets smoke" in listed for task in NEW_TASKS)


def test_zoo_task_trains_and_tabulates_the_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "t.db")
    argv = ["task", "state-tracking", "--preset", "smoke", "--max-steps", "2", "--quiet"]
    assert main([*argv, "--backends", "linear", "--store", store, "--table2"]) == 0
    out = capsys.readouterr().out
    assert "eval pos16-31" in out
    assert "test set  pos16-31  pos32-63" in out


@pytest.mark.slow  # one forward and backward per (task, causal backend): a few seconds
@pytest.mark.parametrize("task", NEW_TASKS)
def test_every_causal_backend_runs_every_new_task(task: str) -> None:
    preset = load_task_preset(task, "smoke")
    runs, skipped = plan_runs(preset, backends=CAUSAL)
    assert [s.variant.label for s in runs] == ["lsh-1" if b == "lsh" else b for b in CAUSAL]
    assert not skipped
    data = preset.task.build(seed=0)
    longest = list(data.splits.values())[-1:]  # past training: within the model's positions
    for spec in runs:
        model = build_model(spec)
        loss, _, count = batch_loss(model, data.eval_set.rows(slice(0, 2)))
        loss.backward()
        assert torch.isfinite(loss) and count > 0, spec.variant.label
        for split in longest:
            assert batch_loss(model, split.rows(slice(0, 1)))[2] > 0


def test_a_run_reports_the_test_set_its_stopping_never_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The evaluation set decides when training stops, so a run's accuracy as trained and every
    evaluation override are scored on the held-out test set instead."""
    import attention_zoo.tasks.runner as runner
    import attention_zoo.tasks.trainer as trainer

    preset = load_task_preset("duplication", "smoke")
    preset = dataclasses.replace(
        preset, train=dataclasses.replace(preset.train, max_steps=2, eval_every=2)
    )
    (spec, *_), _ = plan_runs(preset, eval_hashes=[1])
    assert [e.label for e in spec.evals] == ["full", "lsh-1"]
    read: dict[str, list] = {"while training": [], "after": []}
    evaluate = trainer.evaluate
    for module, when in ((trainer, "while training"), (runner, "after")):
        monkeypatch.setattr(
            module,
            "evaluate",
            lambda model, batch, when=when, **kw: (
                read[when].append(batch) or evaluate(model, batch, **kw)
            ),
        )
    outcome = run_one(spec)
    data = spec.preset.task.build(spec.seed)
    assert not torch.equal(data.eval_set.input_ids, data.test_set.input_ids)
    assert read["while training"] and len(read["after"]) == 1 + len(spec.evals)
    assert all(torch.equal(b.input_ids, data.eval_set.input_ids) for b in read["while training"])
    assert all(torch.equal(b.input_ids, data.test_set.input_ids) for b in read["after"])
    assert outcome.evals["full"].accuracy == outcome.test.accuracy  # the no-op swap
    rows = {(r["metric"], r["eval"]): r["value"] for r in outcome_rows(outcome)}
    assert rows[("accuracy", "trained")] == outcome.test.accuracy
    assert rows[("loss", "trained")] == outcome.test.loss
    assert rows[(STOP_ACCURACY, "trained")] == outcome.result.final_accuracy  # for choosing
