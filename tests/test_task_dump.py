"""`zoo task NAME --dump N`: every task shows its generated data, the same for the same seed."""

from __future__ import annotations

import json

import pytest

from attention_zoo.cli import main
from attention_zoo.tasks.base import TASKS
from attention_zoo.tasks.suite import builtin_suite, load_task_preset

BUILT_IN = [name for name in TASKS.names() if builtin_suite(name) is not None]


def _dump(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["task", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT_IN)
def test_every_task_dumps_json_lines_reproducibly(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _dump(capsys, name, "--dump", "3", "--preset", "smoke", "--seed", "5")
    assert len(first) == 3 and all(set(e) == {"input", "target"} for e in first)
    assert first == _dump(capsys, name, "--dump", "3", "--preset", "smoke", "--seed", "5")
    assert first != _dump(capsys, name, "--dump", "3", "--preset", "smoke", "--seed", "6")
    example = first[0]
    if isinstance(example["input"], str):  # sequence classification: the expression, one class
        assert isinstance(example["target"], int)
    else:  # token task: ids, and a target per position, null where nothing is scored
        assert len(example["target"]) == len(example["input"])
        assert None in example["target"] and any(t is not None for t in example["target"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["niah", "selective-copying", "associative-recall"])
def test_dump_prints_what_a_run_trains_on_first(name: str, capsys) -> None:
    """The first rows of the run's first batches (a batch draws its lengths and tensors at
    once), evaluation sequences held out, as the trainer takes them."""
    preset = load_task_preset(name, "smoke")
    dumped = _dump(capsys, name, "--dump", "5", "--preset", "smoke", "--seed", "2")
    batch = next(preset.task.build(2).batches(preset.train.batch_size))
    assert dumped == preset.task.examples(batch)[:5]


def test_listops_dump_is_lras_notation(capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = _dump(capsys, "listops", "--dump", "1", "--preset", "smoke")
    tokens = example["input"].split()
    assert tokens[0] in {"[MIN", "[MAX", "[MED", "[SM"} and tokens[-1] == "]"
    assert set(tokens) <= {"[MIN", "[MAX", "[MED", "[SM", "]", *map(str, range(10))}


def test_dump_split_prints_that_splits_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["state-tracking", "--dump", "2", "--preset", "smoke", "--seed", "3"]
    split = _dump(capsys, *argv, "--split", "pos32-63")
    assert [len(e["input"]) for e in split] == [64, 64]  # the split's length, not training's
    assert all(t is None for t in split[0]["target"][:32]) and None not in split[0]["target"][32:]
    assert split == _dump(capsys, *argv, "--split", "pos32-63")
    assert [len(e["input"]) for e in _dump(capsys, *argv)] == [16, 16]


def test_dump_past_a_split_says_how_many_it_holds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["niah", "--dump", "100000", "--preset", "smoke", "--split", "n32-d0"]
    assert main(["task", *argv]) == 0
    out, err = capsys.readouterr()
    held = len(out.splitlines())
    assert (
        0 < held < 100000 and err.strip() == f"zoo task: note: split n32-d0 holds {held} sequences"
    )


def test_dump_draws_a_batch_at_a_time() -> None:
    """The first of a huge dump comes at once: nothing draws all n sequences first."""
    preset = load_task_preset("duplication", "smoke")
    first = next(preset.task.first_examples(0, 2**31 - 1, preset.train.batch_size))
    batch = next(preset.task.build(0).batches(preset.train.batch_size))
    assert first == preset.task.examples(batch)[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dump", "2"], "--dump needs a RUN_SPEC"),
        (["niah", "--split", "n64-d0"], "--split needs --dump"),
        (
            ["niah", "--dump", "1", "--preset", "smoke", "--split", "n64-d5"],
            "task 'niah' has no evaluation split 'n64-d5'; its splits: n32-d0,",
        ),
        (
            ["duplication", "--dump", "1", "--preset", "smoke", "--split", "x"],
            "has no evaluation split 'x'; its splits: (none)",
        ),
        (["listops", "--seed", "1"], "--seed needs --dump"),
        (["listops", "--dump", "2", "--max-steps", "5"], "--dump and --max-steps cannot be"),
        (["niah", "--dump", "1", "--seed", str(2**64)], "must be an integer from 0 to 4294967295"),
        (["niah", "--preset", "ladder-cpu-n32"], "`zoo reproduce niah --preset cpu` derives"),
        (["niah", "--preset", "smoke", "--seeds", "0,-1"], "must be an integer from 0 to"),
    ],
)
def test_dump_usage_errors(argv: list[str], message: str, capsys) -> None:
    assert main(["task", *argv]) == 2
    assert message in capsys.readouterr().err
